#!/usr/bin/env bash
# GPU call B: decode-chain, base tree (9e26e33) vs the chained GEMV kernel with stage counters
# (down's first weights requested before its wait), with and without the all-rows gate_up in the
# chain, and with the norm stages' first weights asked of L2 before they wait. Two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/b
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 1 --ctx 1088;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/b \
  bash .gpu-carry/ab.sh base chain2 chain2:--chain chain2:--chain-no-rows chain2:--chain-no-rows,--chain-prefetch > /dev/null 2>&1 )
tail -3 /tmp/b/build-*.log
python3 .gpu-carry/summ.py /tmp/b/ab.log | tee /tmp/b/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/b/ab.log | sort -u | tee /tmp/b/digests.txt
grep -iE "error|fail|unknown|illegal" /tmp/b/ab.log | sort | uniq -c | head
tar cf "$OUT/callB.tar" -C /tmp/b .
