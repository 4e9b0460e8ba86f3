#!/usr/bin/env bash
# GPU call N: the record of fdc3d17's binary (bf16 widened by mov.b32 {0, x}): the transformers
# peers, then the bench matrix under auto and ptx-only.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/n
tar xJf .gpu-carry/bundle.tar.xz .gpu-bundle/qwen-decode
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/n/gpu.txt
python3 scripts/bench/peers.py --json-out /tmp/n/peers.json > /tmp/n/peers.log 2>&1; echo "peers rc $?"
tail -1 /tmp/n/peers.log
.gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers /tmp/n/peers.json --git-commit fdc3d17 \
  --out /tmp/n/results > /tmp/n/bench.log 2>&1; echo "bench rc $?"
grep -A14 "^| cell" /tmp/n/bench.log
grep -E "^\[(auto|ptx-only)\] i" /tmp/n/bench.log | grep -oE "i[0-9]+ +c[0-9]+.*prefill [0-9.]+ ms \([0-9]+ TFLOP/s\)" | sed -E 's/TPOT.*prefill/prefill/'
grep -iE "cold|load" /tmp/n/bench.log | head -6
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> /tmp/n/gpu.txt
tar cf "$OUT/callN.tar" -C /tmp/n .
