#!/usr/bin/env bash
# GPU call S5: the build with the staged qkv and o_proj (programmatic launch under the default
# AOT_KERNELS_PDL=auto). (1) the GPU test bundle; (2) the engine bench of that one binary with
# AOT_KERNELS_PDL=off (every launch as before) and auto, alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s5
tar xJf .gpu-carry/bundle.tar.xz
bash .gpu-bundle/run.sh > /tmp/s5/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 /tmp/s5/run.log
grep -h "staged entries\|FAILED\|panicked" .gpu-bundle/results/test-*.log | head
cp .gpu-bundle/results/test-gpu_decode.log /tmp/s5/ 2>/dev/null
tar cf "$OUT/callS5.tar" -C /tmp/s5 .
for round in 1 2; do for mode in off auto; do
  AOT_KERNELS_PDL=$mode .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto --new-tokens 128 \
    --out /tmp/s5/res-$mode-$round > /tmp/s5/bench-$mode-$round.log 2>&1
  echo "$mode round $round rc $?"; grep -E "^\[auto\] i" /tmp/s5/bench-$mode-$round.log | cut -c1-48
done; done
tar cf "$OUT/callS5.tar" -C /tmp/s5 .
