#!/usr/bin/env bash
# GPU call 1: decode ahead (the runner queues the likely next pass before it waits for this one's
# tokens) and the pass inputs in one page-locked copy. gpu_engine (the two new tests among them)
# and gpu_sampling (its parameters now views); the engine bench, HEAD's binary (6c2c983), the new
# one with --no-decode-ahead (the one copy alone) and the new one, alternating, two rounds.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_engine gpu_sampling; do
  timeout 200 .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1; echo "$t rc $?"
done
grep -hE "^test |^test result|FAILED|panicked|decode ahead:|tokens \[" $J/test-gpu_*.log | cut -c1-400 | head -40
for r in 1 2; do for v in head wait new; do
  b=.gpu-bundle/qwen-decode; x=""; [ $v = head ] && b=/tmp/qd-head; [ $v = wait ] && x=--no-decode-ahead
  timeout 120 $b bench --model qwen3-4b --policy auto --new-tokens 128 $x --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-72
done; done
tar cJf "$O/call1.tar.xz" -C $J .
