#!/usr/bin/env bash
# GPU call K: why is ptx-only faster than auto at c8? decode-chain, the same kernels (main's HEAD)
# built four ways: sm_90 SASS as the engine ships it (base); compute_80 PTX only, JIT-compiled by
# the driver as ptx-only loads it (jit80); compute_80 PTX compiled to sm_90 by nvcc's ptxas
# (sm90from80); sm_90 SASS with the griddepcontrol instructions left out (nopdl). Two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/k
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088;--m 4 --ctx 1088" ROUNDS=2 OUT=/tmp/k \
  bash .gpu-carry/ab.sh base jit80 sm90from80 nopdl > /dev/null 2>&1 )
tail -2 /tmp/k/build-*.log
python3 .gpu-carry/summ.py /tmp/k/ab.log | tee /tmp/k/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/k/ab.log | sort -u | tee /tmp/k/digests.txt
for v in base sm90from80 nopdl; do cuobjdump -sass /tmp/dc-$v > /tmp/k/sass-$v.txt 2>&1; done
ls -la /tmp/k
tar cf "$OUT/callK.tar" -C /tmp/k .
