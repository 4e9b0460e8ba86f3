#!/usr/bin/env bash
# GPU call 4: after a review: the runner waits for its stream when dropped (a pass queued ahead may
# still copy into its page-locked buffers), the engine test also serves its requests eagerly with
# decode ahead (no graphs), docs. gpu_engine and gpu_sampling; the bench refuses --warmup 0.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_engine gpu_sampling; do
  timeout 200 .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1; echo "$t rc $?"
done
grep -hE "^test result|FAILED|panicked|decode ahead:|tokens \[" $J/test-gpu_*.log | cut -c1-600 | head -20
timeout 60 .gpu-bundle/qwen-decode bench --model qwen3-4b --warmup 0 > $J/bench-warmup0.log 2>&1; echo "bench --warmup 0 rc $?"; cat $J/bench-warmup0.log
tar cJf "$O/call4.tar.xz" -C $J .
