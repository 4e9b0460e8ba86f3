#!/usr/bin/env bash
# GPU call S1: each GEMV warp's first batch of weights copied into shared memory (cp.async) before
# its pdl_wait (variant stage), against HEAD (base), each with and without programmatic dependent
# launch. decode-chain, alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s1
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088;--m 1 --ctx 1088" ROUNDS=2 OUT=/tmp/s1 \
  bash .gpu-carry/ab.sh base base:--pdl stage stage:--pdl > /dev/null 2>&1 )
tail -2 /tmp/s1/build-*.log
python3 .gpu-carry/summ.py /tmp/s1/ab.log | tee /tmp/s1/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/s1/ab.log | sort -u | tee /tmp/s1/digests.txt
tar cf "$OUT/callS1.tar" -C /tmp/s1 .
