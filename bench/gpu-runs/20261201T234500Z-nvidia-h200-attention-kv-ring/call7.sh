#!/usr/bin/env bash
# GPU call 7: after review, the kernel's early reads follow the caller's opt-in, not any
# programmatic launch (AttnDecodeParams::cache_before_wait; every image byte for byte e856e59's);
# gpu_decode and gpu_engine on it.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/s; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_decode gpu_engine; do
  timeout 120 .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1; echo "$t rc $?"
done
grep -hE "^test result|FAILED|panicked" $J/test-gpu_*.log | head
grep -h "attention m=" $J/test-gpu_decode.log | head -8
tar cf "$O/call7.tar" -C $J .
