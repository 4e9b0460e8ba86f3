#!/usr/bin/env bash
# GPU call C: the wide norm GEMV (gate_up, lm_head at one to three rows) requests its first tile's
# first batch of weights before the norm prologue, into registers.
#  1. gpu_decode's GEMV tests and gpu_engine on the change.
#  2. decode-chain, HEAD's kernels (H, b1f2788) against the change (N), alternating, two rounds.
#  3. engine bench, fdefa4a's binary (H: the same kernels as b1f2788) against the change's, two rounds.
set -u
O=$OUT/callC; mkdir -p $O
T=$PWD/.gpu-carry
tar xJf $T/mini.tar.xz; xz -dc $T/qwen-decode.xz > /tmp/qd-head; chmod +x /tmp/qd-head
( bash scripts/bench/decode_chain/build.sh $T/treeH /tmp/dcH > $O/build-H.log 2>&1 ) &
( bash scripts/bench/decode_chain/build.sh . /tmp/dcN > $O/build-N.log 2>&1 ) &
export QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
(cd .gpu-bundle && timeout 300 ./tests/gpu_decode --include-ignored --test-threads=1 --nocapture gpu_gemv gpu_overlapped > $O/test-gpu_decode.log 2>&1); echo "gpu_decode rc $?"
grep -E "^test result" $O/test-gpu_decode.log
(cd .gpu-bundle && timeout 200 ./tests/gpu_engine --include-ignored --test-threads=1 > $O/test-gpu_engine.log 2>&1); echo "gpu_engine rc $?"
grep -E "^test result" $O/test-gpu_engine.log
wait
[ -x /tmp/dcH ] && [ -x /tmp/dcN ] || { tail -5 $O/build-*.log; }
for r in 1 2; do
  for shape in "1 80" "1 1088" "8 80"; do
    set -- $shape
    for bin in H N; do
      f=$O/m$1-c$2-$bin-r$r.log
      timeout 60 /tmp/dc$bin --m $1 --ctx $2 --reps 100 > $f 2>&1
      echo "m$1 ctx$2 $bin r$r | step $(grep -E '^step' $f | awk '{print $3}') | gate_up $(grep -E '^gate_up' $f | awk '{print $2}') | lm_head $(grep -E '^lm_head' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
export RUST_LOG=info
for r in 1 2; do
  for v in head new; do
    b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
    timeout 80 $b bench --model qwen3-4b --policy auto --new-tokens 128 --out $O/res-$v-$r > $O/bench-$v-$r.log 2>&1
    echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $O/bench-$v-$r.log | cut -c1-72
  done
done
cd $OUT && tar cJf callC.tar.xz callC
