#!/usr/bin/env bash
# Prototype: decode attention with 8 warps a split, splits of >= 256 tokens, clusters of 4, against HEAD (decode-chain).
set -u
O=$OUT/call2; mkdir -p $O
T=$PWD/.gpu-carry
( bash scripts/bench/decode_chain/build.sh $T/treeH /tmp/dcH > $O/build-H.log 2>&1 ) &
( bash scripts/bench/decode_chain/build.sh $T/treeP /tmp/dcP > $O/build-P.log 2>&1 ) &
wait
[ -x /tmp/dcH ] && [ -x /tmp/dcP ] || { cat $O/build-*.log; exit 1; }
CFG=(
"m1-1088-H|H|--m 1 --ctx 1088"
"m1-1088-P-pl-cl|P|--m 1 --ctx 1088 --pipeline on --cluster on"
"m1-1088-P-np-cl|P|--m 1 --ctx 1088 --pipeline off --cluster on"
"m1-1088-P-ws|P|--m 1 --ctx 1088 --pipeline on --cluster off"
"m4-1088-H|H|--m 4 --ctx 1088"
"m4-1088-P-np-cl|P|--m 4 --ctx 1088 --pipeline off --cluster on"
"m4-1088-P-pl-cl|P|--m 4 --ctx 1088 --pipeline on --cluster on"
"m4-1088-P-ws|P|--m 4 --ctx 1088 --pipeline on --cluster off"
"m8-1088-H|H|--m 8 --ctx 1088"
"m8-1088-P-np-cl|P|--m 8 --ctx 1088 --pipeline off --cluster on"
"m8-1088-P-np-ws|P|--m 8 --ctx 1088 --pipeline off --cluster off"
"m8-300-H|H|--m 8 --ctx 300"
"m8-300-P|P|--m 8 --ctx 300"
"m1-80-H|H|--m 1 --ctx 80"
"m1-80-P|P|--m 1 --ctx 80"
"m8-80-H|H|--m 8 --ctx 80"
"m8-80-P|P|--m 8 --ctx 80"
)
for r in 1 2; do
  for c in "${CFG[@]}"; do
    IFS='|' read -r name bin args <<< "$c"
    f=$O/$name-r$r.log
    timeout 60 /tmp/dc$bin $args --reps 100 > $f 2>&1
    echo "$name r$r | $(grep -E '^step' $f | awk '{print $3}') | attn $(grep -E '^attn' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23) | $(head -1 $f | grep -o 'pipelined [01] cluster [01]')"
  done
done | tee $O/summary.txt
cd $OUT && tar cJf call2.tar.xz call2 && rm -rf call2/*-r?.log
