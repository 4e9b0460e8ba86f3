#!/usr/bin/env bash
# GPU call C: where the chained kernel's blocks land (smid per block), and the chain with stage
# blocks numbered by SM (--chain-spread) against the plain chain and the base tree.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/c
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80" ROUNDS=2 OUT=/tmp/c \
  bash .gpu-carry/ab.sh base chain3:--chain-no-rows chain3:--chain-no-rows,--chain-spread > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/c/ab.log | tee /tmp/c/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/c/ab.log | sort -u | tee /tmp/c/digests.txt
grep -m1 "^placement" /tmp/c/ab.log | cut -c1-1500
grep -iE "error|fail|unknown|illegal" /tmp/c/ab.log | sort | uniq -c | head
tar cf "$OUT/callC.tar" -C /tmp/c .
