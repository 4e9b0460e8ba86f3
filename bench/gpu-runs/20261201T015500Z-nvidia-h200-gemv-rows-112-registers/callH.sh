#!/usr/bin/env bash
# GPU call H: gemv_norm_rows_bf16 held to 112 registers. (1) the GPU test binaries the GEMV change
# touches (not the Triton ones); (2) the engine bench, 9e26e33's binary vs the new one,
# alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/h
tar xJf .gpu-carry/bundle-h.tar.xz
xz -dc .gpu-carry/bin/qwen-decode-9e26e33.xz > /tmp/qd-base && chmod +x /tmp/qd-base
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in dispatch_gpu gpu_decode gpu_engine gpu_kernels gpu_prefill gpu_sampling; do
  .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > /tmp/h/test-$t.log 2>&1
  echo "$t rc $? $(grep -E '^test result' /tmp/h/test-$t.log | tail -1)"
done
tar cf "$OUT/callH.tar" -C /tmp/h .
for round in 1 2; do for v in base r112; do
  bin=/tmp/qd-base; [ $v = r112 ] && bin=.gpu-bundle/qwen-decode
  $bin bench --model qwen3-4b --new-tokens 64 --out /tmp/h/results-$v-$round > /tmp/h/bench-$v-$round.log 2>&1
  echo "bench $v round $round rc $?"; grep -E "^\[auto\] i" /tmp/h/bench-$v-$round.log | cut -c1-60
  tar cf "$OUT/callH.tar" -C /tmp/h .
done; done
