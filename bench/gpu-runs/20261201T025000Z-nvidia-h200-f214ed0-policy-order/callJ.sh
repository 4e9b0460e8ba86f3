#!/usr/bin/env bash
# GPU call J: (1) is ptx-only faster than auto at c8, or was it the order? f214ed0's binary, c8
# cells, the policies in both orders, twice. (2) The record of f214ed0's binary (the kernels of
# main's HEAD): the transformers peers, then the bench matrix under auto and ptx-only.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/j
tar xJf .gpu-carry/bundle-h.tar.xz .gpu-bundle/qwen-decode
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/j/gpu.txt
for round in 1 2; do for order in ptx-only,auto auto,ptx-only; do
  .gpu-bundle/qwen-decode bench --model qwen3-4b --policy $order --concurrency 8 --new-tokens 128 \
    --out /tmp/j/order-$order-$round > /tmp/j/order-$order-$round.log 2>&1
  echo "$order round $round rc $?"; grep -E "^\[(auto|ptx-only)\] i" /tmp/j/order-$order-$round.log | cut -c1-62
done; done
tar cf "$OUT/callJ.tar" -C /tmp/j .
python3 scripts/bench/peers.py --json-out /tmp/j/peers.json > /tmp/j/peers.log 2>&1; echo "peers rc $?"
tail -3 /tmp/j/peers.log
.gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers /tmp/j/peers.json --git-commit f214ed0 \
  --out /tmp/j/results > /tmp/j/bench.log 2>&1; echo "bench rc $?"
grep -A14 "^| cell" /tmp/j/bench.log
grep -E "^\[(auto|ptx-only)\] i" /tmp/j/bench.log | grep -oE "i[0-9]+ +c[0-9]+.*prefill [0-9.]+ ms \([0-9]+ TFLOP/s\)" | sed -E 's/TPOT.*prefill/prefill/'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> /tmp/j/gpu.txt
tar cf "$OUT/callJ.tar" -C /tmp/j .
