#!/usr/bin/env bash
# GPU call E: the chain with the stage counters CUTLASS-style (release/acquire, no extra fences).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/e
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/e \
  bash .gpu-carry/ab.sh base chain4:--chain-no-rows,--chain-spread chain5:--chain-no-rows,--chain-spread chain5:--chain-no-rows > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/e/ab.log | tee /tmp/e/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/e/ab.log | sort -u | tee /tmp/e/digests.txt
grep -m1 "^placement" /tmp/e/ab.log | cut -c1-1500
grep -iE "error|fail|unknown|illegal" /tmp/e/ab.log | sort | uniq -c | head
tar cf "$OUT/callE.tar" -C /tmp/e .
