#!/usr/bin/env bash
# GPU call B: fdefa4a's record: the transformers peers, then the bench matrix under auto and ptx-only
# (the read limit now the faster of the loads and bulk-copy readers).
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/r; mkdir -p $J
xz -dc .gpu-carry/qwen-decode.xz > /tmp/qwen-decode && chmod +x /tmp/qwen-decode
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $J/gpu.txt
timeout 420 python3 scripts/bench/peers.py --json-out $J/peers.json > $J/peers.log 2>&1; echo "peers rc $? at ${SECONDS}s"
tail -1 $J/peers.log
timeout 170 /tmp/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers $J/peers.json --git-commit fdefa4a \
  --out $J/results > $J/bench.log 2>&1; echo "bench rc $? at ${SECONDS}s"
grep -A14 "^| cell" $J/bench.log
grep -E "streaming read|prefill|matmul|cold" $J/bench.log | head -8
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $J/gpu.txt
tar cJf "$O/callB.tar.xz" -C $J .
