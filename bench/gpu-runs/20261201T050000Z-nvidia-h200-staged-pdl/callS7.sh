#!/usr/bin/env bash
# GPU call S7: decode-chain of HEAD (2a248df) as the engine runs it (qkv and o_proj staged and
# programmatic) against --no-overlap (the mirror's sanity: same digests, the gain) and with
# attention programmatic too; the experiment `wide`/`wide2`: gate_up staged too (4 / 2 chunks a
# lane, 32 / 16 KiB a block) and programmatic.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s7
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088;--m 1 --ctx 1088" ROUNDS=2 OUT=/tmp/s7 \
  bash .gpu-carry/ab.sh head head:--no-overlap head:--pdl-ops,qoa wide:--stage-ops,qog,--pdl-ops,qog \
     wide2:--stage-ops,qog,--pdl-ops,qog > /dev/null 2>&1 )
tail -n 2 /tmp/s7/build-*.log
python3 .gpu-carry/summ.py /tmp/s7/ab.log | tee /tmp/s7/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/s7/ab.log | sort -u > /tmp/s7/digests.txt
awk '{print $1,$2,$3,$4,$NF}' /tmp/s7/digests.txt | sort -u | awk '{print $1,$2,$3,$4,$5}' | uniq -c
grep -m2 "^device" /tmp/s7/ab.log
tar cf "$OUT/callS7.tar" -C /tmp/s7 .
