#!/usr/bin/env bash
# GPU call D: the sampler gathering candidates under top-k only: sample-ab (A: 8220cb5's kernel,
# B: the working tree's), twice; the sampling and engine GPU tests.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/d
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > /tmp/d/nvidia-smi.txt
bash scripts/bench/sample_ab/build.sh .gpu-carry/treeA . /tmp/d/sample-ab > /tmp/d/sample-ab-build.log 2>&1; echo "build rc $?"
for r in 1 2; do /tmp/d/sample-ab --reps 50 --draws 64 > /tmp/d/sample-ab-$r.log 2>&1; echo "sample-ab $r rc $?"; cat /tmp/d/sample-ab-$r.log; done
rm -f /tmp/d/sample-ab
tar xJf .gpu-carry/bundle.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_sampling gpu_engine; do
  .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > /tmp/d/test-$t.log 2>&1; echo "$t rc $?"
  grep -E "^test result|panicked|FAILED|candidates|sample_tokens 8|rows sampled" /tmp/d/test-$t.log | head -20
done
tar cf "$O/callD.tar" -C /tmp/d .
