#!/usr/bin/env bash
# GPU call 1: o_proj (launched programmatically after decode attention) stages more of each warp's
# weights in shared memory before its wait: 8 chunks a lane (A, HEAD: half of a warp's 16),
# 12 (B: three quarters, still two blocks an SM) and 16 (C: all, one block an SM).
# decode-chain, alternating, two rounds, four shapes.
set -u
O=$OUT/call1; mkdir -p $O
T=$PWD/.gpu-carry
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/gpu.txt
for r in 1 2; do
  for shape in "1 80" "1 1088" "8 80" "8 1088"; do
    set -- $shape
    for v in A B C; do
      f=$O/m$1-c$2-$v-r$r.log
      timeout 60 $T/dc$v --m $1 --ctx $2 --reps 100 > $f 2>&1
      echo "m$1 ctx$2 $v r$r | step $(grep -E '^step' $f | awk '{print $3}') | o_proj $(grep -E '^o_proj' $f | awk '{print $2}') | attn $(grep -E '^attn' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $O/gpu.txt
cd $OUT && tar cJf call1.tar.xz call1
