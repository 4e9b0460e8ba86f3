#!/usr/bin/env bash
# Decode attention's pipelined entries request the heads' norm weights and rotary row first of all,
# before the wait (N, this tree), against 0e4185f (H): decode-chain, alternating, three rounds.
set -u
O=$OUT/call7; mkdir -p $O
T=$PWD/.gpu-carry
( bash scripts/bench/decode_chain/build.sh $T/treeH /tmp/dcH > $O/build-H.log 2>&1 ) &
( bash scripts/bench/decode_chain/build.sh . /tmp/dcN > $O/build-N.log 2>&1 ) &
wait
[ -x /tmp/dcH ] && [ -x /tmp/dcN ] || { cat $O/build-*.log; exit 1; }
for r in 1 2 3; do
  for shape in "1 80" "1 1088" "4 80" "8 80" "8 300"; do
    set -- $shape
    for bin in H N; do
      f=$O/m$1-c$2-$bin-r$r.log
      timeout 60 /tmp/dc$bin --m $1 --ctx $2 --reps 100 > $f 2>&1
      echo "m$1 ctx$2 $bin r$r | step $(grep -E '^step' $f | awk '{print $3}') | attn $(grep -E '^attn' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
cd $OUT && tar cJf call7.tar.xz call7 && rm -rf call7/*-r?.log
