#!/usr/bin/env bash
# GPU call 5: the whole GPU bundle (run.sh: every GPU test), then the engine bench, HEAD's binary (736e1ff)
# and the new one (decode attention's first two cache blocks early), alternating, two rounds, auto.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p; mkdir -p $J
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $J/gpu.txt
timeout 330 bash .gpu-bundle/run.sh > $J/run.log 2>&1; echo "run.sh rc $?"
grep -hE "^test result|FAILED|panicked|^== |passed|failed" $J/run.log | tail -25
for r in 1 2; do for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  timeout 120 $b bench --model qwen3-4b --policy auto --new-tokens 128 --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-72
done; done
tar cJf "$O/call5.tar.xz" -C $J .
