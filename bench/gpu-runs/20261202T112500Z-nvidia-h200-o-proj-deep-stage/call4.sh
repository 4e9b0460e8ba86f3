#!/usr/bin/env bash
# GPU call 4: gate_up (the wide norm GEMV at one row) launched programmatically after o_proj, with
# and without its first batch of weights requested before the wait (early-batch.patch, tree E).
# decode-chain: HEAD's kernels (A) and E, each with the engine's programmatic ops (qoa) and with
# gate_up (qoag) and lm_head (qoagl) programmatic too; alternating, two rounds, one row.
set -u
O=$OUT/call4; mkdir -p $O
T=$PWD/.gpu-carry
for r in 1 2; do
  for shape in "1 80" "1 1088"; do
    set -- $shape
    for v in "A qoa" "A qoag" "E qoa" "E qoag" "E qoagl"; do
      set -- $shape $v
      f=$O/m$1-c$2-$3-$4-r$r.log
      timeout 60 $T/dc$3 --m $1 --ctx $2 --reps 100 --pdl-ops $4 > $f 2>&1
      echo "m$1 ctx$2 $3 $4 r$r | step $(grep -E '^step' $f | awk '{print $3}') | gate_up $(grep -E '^gate_up' $f | awk '{print $2}') | lm_head $(grep -E '^lm_head' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
cd $OUT && tar cJf call4.tar.xz call4
