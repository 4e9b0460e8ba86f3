#!/usr/bin/env bash
# GPU call 2: decode attention programmatic, its pdl_wait moved after the block table and the warp's
# first cache block (E: HEAD's kernels so changed; F: the ring kernels so changed) against HEAD (A),
# decode-chain at the four shapes; then ncu (full set) of A's and E's attention at eight rows, 1088.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/k; mkdir -p $J; cd "$(dirname "$0")/../../.."
for t in A E F; do
  src=.gpu-carry/tree$t; [ $t = A ] && src=.gpu-carry/treeH
  bash $src/scripts/bench/decode_chain/build.sh $src /tmp/dc$t > $J/dc$t-build.log 2>&1 &
done
wait; for t in A E F; do echo "build $t: $(tail -1 $J/dc$t-build.log)"; done
run() { # label binary args...
  local n=$1 b=$2; shift 2
  timeout 40 /tmp/dc$b "$@" > $J/dc-$n.log 2>&1; echo "== $n rc $?"; grep -E "^step|^digest|^attn" $J/dc-$n.log | cut -c1-100
}
for r in 1 2; do for shape in "8 1088" "1 80" "8 80" "1 1088" "4 1088"; do set -- $shape
  run A-qo-m$1-$2-r$r A --m $1 --ctx $2
  run A-qoa-m$1-$2-r$r A --m $1 --ctx $2 --pdl-ops qoa
  run E-qoa-m$1-$2-r$r E --m $1 --ctx $2 --pdl-ops qoa
  run F-qoa-m$1-$2-r$r F --m $1 --ctx $2 --pdl-ops qoa
done; done
for t in A E; do
  timeout 150 ncu --kernel-name regex:attn_decode --launch-skip 40 --launch-count 1 --set full --import-source no \
    -o $J/ncu-$t /tmp/dc$t --m 8 --ctx 1088 --reps 2 --pdl-ops qoa > $J/ncu-$t-run.log 2>&1; echo "ncu $t rc $?"
  ncu --import $J/ncu-$t.ncu-rep --page details > $J/ncu-$t-details.txt 2>&1
  ncu --import $J/ncu-$t.ncu-rep --page source --print-source sass --csv > $J/ncu-$t-sass.csv 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit" $J/ncu-$t-details.txt | head -12
done
tar cf "$O/call2.tar" -C $J .
