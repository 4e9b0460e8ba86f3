#!/usr/bin/env bash
# GPU call O: fdc3d17's binary at c8, the policies in both orders, twice: is any of ptx-only's lead
# left (the record had it 1.3% ahead at i1024 c8, running second)?
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/o
tar xJf .gpu-carry/bundle.tar.xz .gpu-bundle/qwen-decode
for round in 1 2; do for order in ptx-only,auto auto,ptx-only; do
  first=${order%%,*}
  .gpu-bundle/qwen-decode bench --model qwen3-4b --policy $order --concurrency 8 --new-tokens 128 \
    --out /tmp/o/res-$first-first-$round > /tmp/o/order-$first-first-$round.log 2>&1
  echo "$order round $round rc $?"; grep -E "^\[(auto|ptx-only)\] i" /tmp/o/order-$first-first-$round.log | cut -c1-52
done; done
rm -rf /tmp/o/res-*
tar cf "$OUT/callO.tar" -C /tmp/o .
