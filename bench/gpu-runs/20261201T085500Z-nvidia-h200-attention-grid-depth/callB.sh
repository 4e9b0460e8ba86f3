#!/usr/bin/env bash
# GPU call B: decode-chain of HEAD with the attention grid at the full split depth (32, as the
# engine captures it) against the exact depth (--exact-splits), alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/b
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 1 --ctx 1088;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/b \
  bash .gpu-carry/ab.sh head head:--exact-splits > /dev/null 2>&1 )
tail -n 2 /tmp/b/build-*.log
python3 .gpu-carry/summ.py /tmp/b/ab.log | tee /tmp/b/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/b/ab.log | sort -u > /tmp/b/digests.txt
cat /tmp/b/digests.txt
grep "^device" /tmp/b/ab.log | sort | uniq -c
tar cf "$OUT/callB.tar" -C /tmp/b .
