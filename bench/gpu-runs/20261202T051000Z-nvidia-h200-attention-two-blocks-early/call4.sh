#!/usr/bin/env bash
# H (HEAD), N (the first two cache blocks requested before the wait) and N2 (the second after it), decode-chain, alternating.
set -u
O=$OUT/call4; mkdir -p $O
T=$PWD/.gpu-carry
( bash scripts/bench/decode_chain/build.sh $T/treeH /tmp/dcH > $O/build-H.log 2>&1 ) &
( bash scripts/bench/decode_chain/build.sh . /tmp/dcN > $O/build-N.log 2>&1 ) &
( bash scripts/bench/decode_chain/build.sh $T/treeN2 /tmp/dcN2 > $O/build-N2.log 2>&1 ) &
wait
[ -x /tmp/dcH ] && [ -x /tmp/dcN ] && [ -x /tmp/dcN2 ] || { cat $O/build-*.log; exit 1; }
for r in 1 2; do
  for shape in "1 80" "4 80" "8 80" "1 1088" "4 1088" "8 300"; do
    set -- $shape
    for bin in H N N2; do
      f=$O/m$1-c$2-$bin-r$r.log
      timeout 60 /tmp/dc$bin --m $1 --ctx $2 --reps 100 > $f 2>&1
      echo "m$1 ctx$2 $bin r$r | step $(grep -E '^step' $f | awk '{print $3}') | attn $(grep -E '^attn' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
cd $OUT && tar cJf call4.tar.xz call4 && rm -rf call4/*-r?.log
