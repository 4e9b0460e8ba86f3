#!/usr/bin/env bash
# GPU call 6: 588b34c's record: the transformers peers, then the bench matrix under auto and ptx-only.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/r; mkdir -p $J
[ -x .gpu-bundle/qwen-decode ] || tar xJf .gpu-carry/bundle.tar.xz .gpu-bundle/qwen-decode
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $J/gpu.txt
timeout 330 python3 scripts/bench/peers.py --json-out $J/peers.json > $J/peers.log 2>&1; echo "peers rc $?"
tail -1 $J/peers.log
timeout 200 .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers $J/peers.json --git-commit 588b34c \
  --out $J/results > $J/bench.log 2>&1; echo "bench rc $?"
grep -A14 "^| cell" $J/bench.log
grep -E "^\[(auto|ptx-only)\] i" $J/bench.log | grep -oE "i[0-9]+ +c[0-9]+.*prefill [0-9.]+ ms \([0-9]+ TFLOP/s\)" | sed -E 's/TPOT.*prefill/prefill/'
grep -iE "cold|load" $J/bench.log | head -6
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $J/gpu.txt
tar cJf "$O/call6.tar.xz" -C $J .
