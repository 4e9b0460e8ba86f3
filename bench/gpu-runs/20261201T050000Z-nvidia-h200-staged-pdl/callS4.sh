#!/usr/bin/env bash
# GPU call S4: stage3 = HEAD's GEMV kernels (same SASS) plus two staged narrow entries (each warp's
# first weights copied to shared memory before pdl_wait), chosen for the ops in --stage-ops;
# programmatic launch on the ops in --pdl-ops.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s4
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088;--m 1 --ctx 1088" ROUNDS=2 OUT=/tmp/s4 \
  bash .gpu-carry/ab.sh base stage3:--pdl-ops,a stage3:--stage-ops,o,--pdl-ops,oa stage3:--stage-ops,qo,--pdl-ops,qo \
     stage3:--stage-ops,qo,--pdl-ops,qoa stage3:--stage-ops,qo,--pdl-ops,qoag > /dev/null 2>&1 )
tail -n 2 /tmp/s4/build-*.log
python3 .gpu-carry/summ.py /tmp/s4/ab.log | tee /tmp/s4/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/s4/ab.log | sort -u | tee /tmp/s4/digests.txt
tar cf "$OUT/callS4.tar" -C /tmp/s4 .
