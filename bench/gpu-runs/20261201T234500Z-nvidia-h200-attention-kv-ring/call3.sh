#!/usr/bin/env bash
# GPU call 3: the whole GPU bundle (every GPU test, qwen-decode kernels) with decode attention
# programmatic, its wait after the first cache block; then the engine bench, HEAD's binary (83871b5)
# against the new one, alternating, two rounds, every cell under auto.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/l; mkdir -p $J; cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $J/nvidia-smi.txt
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
OUT= timeout 330 bash .gpu-bundle/run.sh > $J/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 $J/run.log
grep -h "FAILED\|panicked" .gpu-bundle/results/test-*.log | head -20
cp .gpu-bundle/results/*.log .gpu-bundle/results/*.json $J/ 2>/dev/null
for r in 1 2; do for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  timeout 100 $b bench --model qwen3-4b --policy auto --new-tokens 128 --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-72
done; done
# Without programmatic launch (as under ptx-only or before Hopper) the wait is a no-op and the new
# kernel requests the query after the cache block: HEAD against new with AOT_KERNELS_PDL=off.
for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  AOT_KERNELS_PDL=off timeout 100 $b bench --model qwen3-4b --policy auto --inputs 16,1024 --concurrency 1,8 --new-tokens 128 \
    --out $J/res-pdloff-$v > $J/bench-pdloff-$v.log 2>&1
  echo "bench pdl off $v rc $?"; grep -E "^\[auto\] i" $J/bench-pdloff-$v.log | cut -c1-72
done
tar cf "$O/call3.tar" -C $J .
