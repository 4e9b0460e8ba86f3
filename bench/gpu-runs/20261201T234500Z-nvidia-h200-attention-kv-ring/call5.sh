#!/usr/bin/env bash
# GPU call 5: the engine bench under auto, HEAD's binary (83871b5) against e856e59's, alternating,
# three rounds, every cell; the last round's new run under auto and ptx-only is e856e59's record
# (no peers in this call: the session's device time).
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/q; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz .gpu-bundle/qwen-decode; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $J/gpu.txt
for r in 1 2 3; do for v in head new; do
  b=.gpu-bundle/qwen-decode; pol=auto; extra=; [ $v = head ] && b=/tmp/qd-head
  [ $v = new ] && [ $r = 3 ] && { pol=auto,ptx-only; extra="--git-commit e856e59"; }
  timeout 150 $b bench --model qwen3-4b --policy $pol --new-tokens 128 $extra --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[(auto|ptx-only)\] i" $J/bench-$v-$r.log | cut -c1-60
done; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $J/gpu.txt
tar cf "$O/call5.tar" -C $J .
