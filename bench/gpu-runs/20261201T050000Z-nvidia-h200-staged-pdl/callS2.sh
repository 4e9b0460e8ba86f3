#!/usr/bin/env bash
# GPU call S2: the staged GEMV with programmatic launch on chosen edges only (--pdl-ops: the ops
# whose launch may overlap the op before), and stage1: narrow GEMVs of fewer tiles than two an SM
# (o_proj, down) on one block an SM, held there by shared memory.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s2
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/s2 \
  bash .gpu-carry/ab.sh base stage:--pdl-ops,o stage:--pdl-ops,oq stage:--pdl-ops,oqg stage:--pdl-ops,oqga \
     stage1 stage1:--pdl stage1:--pdl-ops,oqga > /dev/null 2>&1 )
tail -n 2 /tmp/s2/build-*.log
python3 .gpu-carry/summ.py /tmp/s2/ab.log | tee /tmp/s2/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/s2/ab.log | sort -u | tee /tmp/s2/digests.txt
tar cf "$OUT/callS2.tar" -C /tmp/s2 .
