#!/usr/bin/env bash
# GPU call 8: the heads' norm weights and rotary row requested first (pipelined decode attention):
# gpu_decode and gpu_engine (the attention entries against the CPU reference, the engine's fixtures),
# then the engine bench, 0e4185f's binary (588b34c's code) and the new one, alternating, two rounds (the second only if the first ended within 95 s), auto.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p8; mkdir -p $J
tar xJf .gpu-carry/mini.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
export RUST_LOG=info QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
for t in gpu_decode gpu_engine; do
  (cd .gpu-bundle && ./tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1); echo "$t rc $?"
  grep -E "^test result" $J/test-$t.log
done
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 95 ] && { echo "round 2 skipped at ${SECONDS}s (device budget)"; break; }
  for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  timeout 60 $b bench --model qwen3-4b --policy auto --new-tokens 128 --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-72
done; done
tar cJf "$O/call8.tar.xz" -C $J .
