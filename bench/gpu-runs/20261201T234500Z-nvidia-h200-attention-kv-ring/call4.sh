#!/usr/bin/env bash
# GPU call 4: the kernel takes its order from the launch (AttnDecodeParams::programmatic): the query
# first when not programmatic (as HEAD), the first cache blocks first when programmatic. gpu_decode
# and gpu_engine; the engine bench, HEAD's binary (83871b5) against the new one, with
# AOT_KERNELS_PDL=off (four cells) and under auto (every cell), alternating.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_decode gpu_engine; do
  timeout 200 .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1; echo "$t rc $?"
done
grep -hE "^test result|FAILED|panicked" $J/test-gpu_*.log | head
for r in 1 2; do for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  AOT_KERNELS_PDL=off timeout 100 $b bench --model qwen3-4b --policy auto --inputs 16,1024 --concurrency 1,8 --new-tokens 128 \
    --out $J/res-pdloff-$v-$r > $J/bench-pdloff-$v-$r.log 2>&1
  echo "bench pdl off $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-pdloff-$v-$r.log | cut -c1-72
done; done
for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  timeout 100 $b bench --model qwen3-4b --policy auto --new-tokens 128 --out $J/res-$v > $J/bench-$v.log 2>&1
  echo "bench auto $v rc $?"; grep -E "^\[auto\] i" $J/bench-$v.log | cut -c1-72
done
tar cf "$O/call4.tar" -C $J .
