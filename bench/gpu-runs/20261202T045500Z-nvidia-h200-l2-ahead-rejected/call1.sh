#!/usr/bin/env bash
# L2-ahead A/B in decode-chain: o_proj's weights asked into L2 while attention runs.
set -u
O=$OUT/call1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash scripts/bench/decode_chain/build.sh . /tmp/dc > $O/build.log 2>&1 || { cat $O/build.log; exit 1; }
V=( "off|--l2-ahead off" "bulk64k|--l2-ahead bulk --l2-ahead-chunk 65536" "bulk16k|--l2-ahead bulk --l2-ahead-chunk 16384" "line|--l2-ahead line" "bulkhalf|--l2-ahead bulk --l2-ahead-frac 0.5" )
for shape in "1 80" "1 1088" "8 80" "8 1088"; do
  set -- $shape
  for r in 1 2; do
    for v in "${V[@]}"; do
      name=${v%%|*}; args=${v#*|}
      /tmp/dc --m $1 --ctx $2 --step-only $args > $O/m$1-c$2-$name-r$r.log 2>&1
      echo "m$1 ctx$2 $name r$r: $(grep -E '^step' $O/m$1-c$2-$name-r$r.log) $(grep digest $O/m$1-c$2-$name-r$r.log | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
# Per-op view of one variant: off vs bulk64k at m1 ctx80 (full output)
/tmp/dc --m 1 --ctx 80 > $O/full-off.log 2>&1
/tmp/dc --m 1 --ctx 80 --l2-ahead bulk > $O/full-bulk.log 2>&1
