#!/usr/bin/env bash
# GPU call A: the GPU test bundle with the cluster merge of decode attention.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/a
tar xJf .gpu-carry/bundle.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > /tmp/a/nvidia-smi.txt
OUT= bash .gpu-bundle/run.sh > /tmp/a/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 /tmp/a/run.log
grep -h "FAILED\|panicked\|cluster" .gpu-bundle/results/test-*.log | head -30
cp .gpu-bundle/results/*.log .gpu-bundle/results/*.json /tmp/a/ 2>/dev/null
tar cf "$O/callA.tar" -C /tmp/a .
