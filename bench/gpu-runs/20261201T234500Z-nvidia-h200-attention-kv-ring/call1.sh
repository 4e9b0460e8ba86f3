#!/usr/bin/env bash
# GPU call 1: decode attention's unpipelined entries stream a warp's later cache blocks through a
# shared-memory slot (cp.async), the second one requested beside the first: decode-chain A/B against
# HEAD's kernels (A: 83871b5) at the entries' shapes, digests compared; gpu_decode and gpu_engine on
# the new kernels; the engine bench at i1024 c8 with HEAD's binary and the new one, alternating.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/j; mkdir -p $J; cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $J/nvidia-smi.txt
bash .gpu-carry/treeH/scripts/bench/decode_chain/build.sh .gpu-carry/treeH /tmp/dcA > $J/dcA-build.log 2>&1 &
bash scripts/bench/decode_chain/build.sh . /tmp/dcB > $J/dcB-build.log 2>&1 &
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
for t in gpu_decode gpu_engine; do
  timeout 200 .gpu-bundle/tests/$t --include-ignored --test-threads=1 --nocapture > $J/test-$t.log 2>&1; echo "$t rc $?"
done
grep -hE "^test result|FAILED|panicked" $J/test-gpu_*.log | head
wait; echo "builds: $(tail -1 $J/dcA-build.log) / $(tail -1 $J/dcB-build.log)"
dc() { # name args...
  local n=$1; shift
  for v in A B; do timeout 40 /tmp/dc$v "$@" > $J/dc-$v-$n.log 2>&1; echo "== $v $n rc $?"; grep -E "^step|^digest|^attn" $J/dc-$v-$n.log; done
}
dc m8-1088-r1 --m 8 --ctx 1088
dc m8-1088-r2 --m 8 --ctx 1088
dc m8-1024 --m 8 --ctx 1024
dc m8-2048 --m 8 --ctx 2048
dc m4-1088-np --m 4 --ctx 1088 --pipeline off
dc m1-1088-np --m 1 --ctx 1088 --pipeline off --cluster off
for r in 1 2; do for v in head new; do
  b=.gpu-bundle/qwen-decode; [ $v = head ] && b=/tmp/qd-head
  timeout 120 $b bench --model qwen3-4b --policy auto --inputs 1024 --concurrency 8 --new-tokens 128 --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-150
done; done
tar cf "$O/call1.tar" -C $J .
