#!/usr/bin/env bash
# GPU call D: the chain without its waits (wrong results: the timing bound) and with x read through L1.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/d
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80" ROUNDS=2 OUT=/tmp/d \
  bash .gpu-carry/ab.sh base chain4:--chain-no-rows,--chain-spread chain4:--chain-no-rows,--chain-spread,--chain-nowait chain4nc:--chain-no-rows,--chain-spread > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/d/ab.log | tee /tmp/d/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/d/ab.log | sort -u | tee /tmp/d/digests.txt
grep -m1 "^placement" /tmp/d/ab.log | cut -c1-1500
grep -iE "error|fail|unknown|illegal" /tmp/d/ab.log | sort | uniq -c | head
tar cf "$OUT/callD.tar" -C /tmp/d .
