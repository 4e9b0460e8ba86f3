#!/usr/bin/env bash
# GPU call C: decode-chain, HEAD's kernels against the cluster-merge attention (`_cl` entries,
# --cluster), alternating, two rounds; digests must agree at each shape.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/c
( CFGS="--m 1 --ctx 80;--m 1 --ctx 300;--m 1 --ctx 1088;--m 8 --ctx 80;--m 8 --ctx 300;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/c \
  bash .gpu-carry/ab.sh head cl cl:--cluster > /dev/null 2>&1 )
tail -n 2 /tmp/c/build-*.log
python3 .gpu-carry/summ.py /tmp/c/ab.log | tee /tmp/c/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/c/ab.log | sort -u > /tmp/c/digests.txt
cat /tmp/c/digests.txt
grep -i "error\|cluster launch" /tmp/c/ab.log | head
tar cf "$OUT/callC.tar" -C /tmp/c .
