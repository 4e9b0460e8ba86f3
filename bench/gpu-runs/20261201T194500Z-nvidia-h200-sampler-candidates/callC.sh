#!/usr/bin/env bash
# GPU call C: the GPU test bundle with the sampler's candidate passes; sample-ab, HEAD's sampling
# kernel (A, 8220cb5) against the new one (B), twice.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/c
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > /tmp/c/nvidia-smi.txt
bash scripts/bench/sample_ab/build.sh .gpu-carry/treeA . /tmp/c/sample-ab > /tmp/c/sample-ab-build.log 2>&1; echo "build rc $?"
for r in 1 2; do /tmp/c/sample-ab --reps 50 --draws 64 > /tmp/c/sample-ab-$r.log 2>&1; echo "sample-ab $r rc $?"; cat /tmp/c/sample-ab-$r.log; done
rm -f /tmp/c/sample-ab
tar xJf .gpu-carry/bundle.tar.xz
OUT= bash .gpu-bundle/run.sh > /tmp/c/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 /tmp/c/run.log
grep -h "FAILED\|panicked\|candidates\|sample_tokens 8" .gpu-bundle/results/test-*.log | head -30
cp .gpu-bundle/results/test-gpu_sampling.log .gpu-bundle/results/test-gpu_engine.log /tmp/c/ 2>/dev/null
xz -f /tmp/c/run.log
tar cf "$O/callC.tar" -C /tmp/c .
