#!/usr/bin/env bash
# GPU call A: bulk wide GEMVs (gate_up, lm_head) and the bulk streaming read.
#  1. gpu_decode: the GEMV epilogue test (bulk and loads entries against the reference, SASS = PTX)
#     and the streaming-read test (both readers, every policy).
#  2. decode-chain (this tree), bulk (default) against --no-bulk, and bulk with gate_up and lm_head
#     programmatic (--pdl-ops qoagl), alternating, two rounds.
#  3. engine bench, one binary, AOT_KERNELS_GEMV_BULK=off and auto alternating, two rounds.
set -u
O=$OUT/callA; mkdir -p $O
tar xJf .gpu-carry/bundle.tar.xz
( bash scripts/bench/decode_chain/build.sh . /tmp/dc > $O/build.log 2>&1 ) &
export QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
(cd .gpu-bundle && timeout 400 ./tests/gpu_decode --include-ignored --test-threads=1 --nocapture gpu_gemv_epilogues gpu_stream_read gpu_overlapped_gemvs > $O/test-gpu_decode.log 2>&1); echo "gpu_decode rc $?"
grep -E "^test |^test result|bulk entries|panicked" $O/test-gpu_decode.log | head -20
wait
[ -x /tmp/dc ] || { tail -20 $O/build.log; }
if [ -x /tmp/dc ]; then
for r in 1 2; do
  for shape in "1 80" "8 80" "8 1088" "1 1088"; do
    set -- $shape
    for v in L B P; do
      case $v in L) a="--no-bulk";; B) a="";; P) a="--pdl-ops qoagl";; esac
      f=$O/m$1-c$2-$v-r$r.log
      timeout 60 /tmp/dc --m $1 --ctx $2 --reps 100 $a > $f 2>&1
      echo "m$1 ctx$2 $v r$r | step $(grep -E '^step' $f | awk '{print $3}') | gate_up $(grep -E '^gate_up' $f | awk '{print $2}') | lm_head $(grep -E '^lm_head' $f | awk '{print $2}') | $(grep digest $f | cut -c1-23)"
    done
  done
done | tee $O/summary.txt
fi
export RUST_LOG=info
for r in 1 2; do
  for v in off auto; do
    [ $SECONDS -gt 480 ] && { echo "bench skipped at ${SECONDS}s"; break 2; }
    AOT_KERNELS_GEMV_BULK=$v timeout 80 .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto --new-tokens 128 --out $O/res-$v-$r > $O/bench-$v-$r.log 2>&1
    echo "bench $v round $r rc $?"; grep -E "^\[auto\] i|streaming read" $O/bench-$v-$r.log | cut -c1-110
  done
done
cd $OUT && tar cJf callA.tar.xz callA && rm -rf callA
