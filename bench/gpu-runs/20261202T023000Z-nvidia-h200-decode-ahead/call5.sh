#!/usr/bin/env bash
# GPU call 5: how close the engine's step now is to its kernels alone. decode-chain (the step's
# kernels in one graph, replayed back to back; no embedding, no sampling) of 12ee2d0's kernels at
# the bench's mean contexts (i16: 16 + 16 warm-up + 64 = 97 tokens; i1024: 1105), and the engine
# bench (12ee2d0, decode ahead) in the same call, two rounds alternating.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/q; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz
bash .gpu-carry/treeH/scripts/bench/decode_chain/build.sh .gpu-carry/treeH /tmp/dcH > $J/dc-build.log 2>&1; echo "build: $(tail -1 $J/dc-build.log)"
for r in 1 2; do
  for shape in "1 97" "4 97" "8 97" "1 1105" "4 1105" "8 1105"; do set -- $shape
    timeout 40 /tmp/dcH --m $1 --ctx $2 > $J/dc-m$1-$2-r$r.log 2>&1; echo "== dc m$1 ctx$2 r$r rc $?"; grep -E "^step" $J/dc-m$1-$2-r$r.log | cut -c1-100
  done
  timeout 120 .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto --new-tokens 128 --out $J/res-$r > $J/bench-$r.log 2>&1
  echo "bench round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$r.log | cut -c1-72
done
tar cJf "$O/call5.tar.xz" -C $J .
