#!/usr/bin/env bash
# GPU call S3: stage2 (the stage depth a runtime parameter, 0 unless --stage-ops names the op) with
# programmatic launch and staging on chosen ops only.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s3
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/s3 \
  bash .gpu-carry/ab.sh base stage2 stage2:--pdl-ops,a stage2:--stage-ops,qo,--pdl-ops,qoa \
     stage2:--stage-ops,qo,--pdl-ops,qoag stage2:--stage-ops,qog,--pdl-ops,qoag > /dev/null 2>&1 )
tail -n 2 /tmp/s3/build-*.log
python3 .gpu-carry/summ.py /tmp/s3/ab.log | tee /tmp/s3/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/s3/ab.log | sort -u | tee /tmp/s3/digests.txt
tar cf "$OUT/callS3.tar" -C /tmp/s3 .
