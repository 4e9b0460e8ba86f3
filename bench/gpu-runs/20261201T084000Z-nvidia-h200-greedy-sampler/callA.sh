#!/usr/bin/env bash
# GPU call A: (1) the GPU test bundle of HEAD + the vectorised greedy sampler; (2) the engine
# bench, HEAD's binary (base) against the new one, alternating, two rounds.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/a
tar xJf .gpu-carry/bundle.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > /tmp/a/nvidia-smi.txt
OUT= bash .gpu-bundle/run.sh > /tmp/a/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 /tmp/a/run.log
grep -h "FAILED\|panicked\|sample_tokens 8 x" .gpu-bundle/results/test-*.log | head -20
cp .gpu-bundle/results/*.log .gpu-bundle/results/*.json /tmp/a/ 2>/dev/null
tar cf "$O/callA.tar" -C /tmp/a .
for round in 1 2; do for v in base new; do
  bin=.gpu-bundle/qwen-decode; [ $v = base ] && bin=.gpu-carry/qwen-decode-base
  $bin bench --model qwen3-4b --policy auto --new-tokens 128 --out /tmp/a/res-$v-$round > /tmp/a/bench-$v-$round.log 2>&1
  echo "$v round $round rc $?"; grep -E "^\[auto\] i" /tmp/a/bench-$v-$round.log | cut -c1-60
done; done
tar cf "$O/callA.tar" -C /tmp/a .
