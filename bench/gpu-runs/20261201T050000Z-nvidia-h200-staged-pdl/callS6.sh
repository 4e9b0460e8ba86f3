#!/usr/bin/env bash
# GPU call S6 (commit 3cfeab0): (1) the Triton test binary with the MoE check at the rounding
# chain's scale, on the seed that failed in S5 and on a fresh one; (2) the record: the transformers
# peers, then the bench matrix under auto and ptx-only.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/s6
tar xJf .gpu-carry/bundle.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures
AOT_SEED=3313329556806431867 .gpu-bundle/tests/gpu_triton_kernels --include-ignored --test-threads=1 --nocapture \
  > /tmp/s6/triton-seed-3313329556806431867.log 2>&1; echo "triton (S5's seed) rc $?"
.gpu-bundle/tests/gpu_triton_kernels --include-ignored --test-threads=1 --nocapture > /tmp/s6/triton-fresh.log 2>&1
echo "triton (fresh seed) rc $?"
grep -h "seed\|moe .* out vs CPU from\|^test result" /tmp/s6/triton-*.log | cut -c1-200
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/s6/gpu.txt
python3 scripts/bench/peers.py --json-out /tmp/s6/peers.json > /tmp/s6/peers.log 2>&1; echo "peers rc $?"
tail -1 /tmp/s6/peers.log
.gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers /tmp/s6/peers.json --git-commit 3cfeab0 \
  --out /tmp/s6/results > /tmp/s6/bench.log 2>&1; echo "bench rc $?"
grep -A14 "^| cell" /tmp/s6/bench.log
grep -E "^\[(auto|ptx-only)\] i" /tmp/s6/bench.log | grep -oE "i[0-9]+ +c[0-9]+.*prefill [0-9.]+ ms \([0-9]+ TFLOP/s\)" | sed -E 's/TPOT.*prefill/prefill/'
grep -iE "cold|load" /tmp/s6/bench.log | head -6
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> /tmp/s6/gpu.txt
tar cf "$OUT/callS6.tar" -C /tmp/s6 .
