#!/usr/bin/env bash
# GPU call L: bf16 widened by moving bits (aot::to_f32) instead of cuda_bf16.h's cvt.f32.bf16.
# (1) decode-chain: base (HEAD) against the driver's JIT of base's compute_80 PTX (jit80), the fix
#     (fix), and the fix as the sm_80 header's inline mov (fixasm); two rounds.
# (2) engine bench, f214ed0's binary against the fix's, auto, alternating, two rounds; then the
#     fix's binary with both policies at c8, in both orders.
# (3) the GPU test bundle of the fix.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/l
tar xJf .gpu-carry/bundle.tar.xz
xz -dc .gpu-carry/bin/qwen-decode-f214ed0.xz > /tmp/qd-old && chmod +x /tmp/qd-old
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088;--m 4 --ctx 1088" ROUNDS=2 OUT=/tmp/l \
  bash .gpu-carry/ab.sh base jit80 fix fixasm > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/l/ab.log | tee /tmp/l/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/l/ab.log | sort -u | tee /tmp/l/digests.txt
tar cf "$OUT/callL.tar" -C /tmp/l .
for round in 1 2; do for b in old new; do
  bin=/tmp/qd-old; [ $b = new ] && bin=.gpu-bundle/qwen-decode
  $bin bench --model qwen3-4b --policy auto --new-tokens 128 --out /tmp/l/res-$b-$round > /tmp/l/bench-$b-$round.log 2>&1
  echo "$b round $round rc $?"; grep -E "^\[auto\] i" /tmp/l/bench-$b-$round.log | cut -c1-48
done; done
for order in auto,ptx-only ptx-only,auto; do
  .gpu-bundle/qwen-decode bench --model qwen3-4b --policy $order --concurrency 8 --new-tokens 128 \
    --out /tmp/l/order-$order > /tmp/l/order-$order.log 2>&1
  echo "$order rc $?"; grep -E "^\[(auto|ptx-only)\] i" /tmp/l/order-$order.log | cut -c1-52
done
tar cf "$OUT/callL.tar" -C /tmp/l .
bash .gpu-bundle/run.sh > /tmp/l/run.log 2>&1; echo "run.sh rc $?"
tail -5 /tmp/l/run.log
cp .gpu-bundle/results/test-*.log /tmp/l/ 2>/dev/null
grep -h "^test result" /tmp/l/test-*.log
tar cf "$OUT/callL.tar" -C /tmp/l .
