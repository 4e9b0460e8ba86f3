#!/usr/bin/env bash
# GPU call S8 (the review fixes on top of 52a86e7): every GPU test binary but the Triton
# materiality one (unchanged code): the staged launches only where two blocks fit, the new
# producer-to-consumer chain test, the MoE shares at two scales.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s8
tar xJf .gpu-carry/tests.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in dispatch_gpu gpu_decode gpu_engine gpu_kernels gpu_prefill gpu_prefill_trap gpu_rotary_trap gpu_sampling gpu_triton_kernels; do
  .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > /tmp/s8/test-$t.log 2>&1
  echo "$t rc $? $(grep -h '^test result' /tmp/s8/test-$t.log | tr '\n' ' ')"
done
grep -h "overlap .*staged launches\|launches took the staged\|moe 1 tokens out vs CPU from" /tmp/s8/test-*.log | head -6
for f in /tmp/s8/*.log; do xz $f; done
tar cf "$OUT/callS8.tar" -C /tmp/s8 .
