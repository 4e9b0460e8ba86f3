#!/usr/bin/env bash
# GPU call 2: the record of HEAD (4da7005): the transformers peers, then the bench matrix under
# auto and ptx-only; then the trap and Triton GPU tests (the others in call 3).
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/r; mkdir -p $J
xz -dc .gpu-carry/qwen-decode.xz > /tmp/qwen-decode && chmod +x /tmp/qwen-decode
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $J/gpu.txt
timeout 420 python3 scripts/bench/peers.py --json-out $J/peers.json > $J/peers.log 2>&1; echo "peers rc $? at ${SECONDS}s"
tail -1 $J/peers.log
timeout 170 /tmp/qwen-decode bench --model qwen3-4b --policy auto,ptx-only --peers $J/peers.json --git-commit 4da7005 \
  --out $J/results > $J/bench.log 2>&1; echo "bench rc $? at ${SECONDS}s"
grep -A14 "^| cell" $J/bench.log
grep -E "streaming read|prefill|matmul|cold" $J/bench.log | head -8
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $J/gpu.txt
mkdir -p /tmp/t; export QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
for t in $(ls .gpu-carry/t2); do
  n=${t%.xz}; xz -dc .gpu-carry/t2/$t > /tmp/t/$n; chmod +x /tmp/t/$n
  [ $SECONDS -gt 500 ] && { echo "$n not run: ${SECONDS}s"; continue; }
  (cd /tmp/t && timeout 200 ./$n --include-ignored --test-threads=1 --nocapture > $J/test-$n.log 2>&1); echo "$n rc $? at ${SECONDS}s: $(grep -E '^test result' $J/test-$n.log)"
done
cat $J/test-*.log | awk '/^test result:/ { p += $4; f += $6; g += $8 } END { print "total: " p " passed, " f " failed, " g " ignored" }'
echo "SKIPPED lines: $(cat $J/test-*.log | grep -c '^SKIPPED')"
tar cJf "$O/call2.tar.xz" -C $J .
