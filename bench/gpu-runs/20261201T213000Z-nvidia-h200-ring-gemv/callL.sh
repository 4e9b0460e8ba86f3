#!/usr/bin/env bash
# GPU call L: the ring GEMV with 2-D tensor-map copies (one request a [16][256] box, two [8][256]
# under silu_mul) instead of a copy a row: checked against the engine's kernels, then timed.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/l; mkdir -p $J; cd "$(dirname "$0")/.."
NVCC_FLAGS=-DRING_TMA_2D bash .gpu-carry/ring/dc/build.sh . /tmp/dc2d > $J/dc2d-build.log 2>&1; echo "build rc $?"; grep -i error $J/dc2d-build.log | head
run() { local tag=$1; shift; timeout 45 /tmp/dc2d "$@" > $J/dc-$tag.log 2>&1; local rc=$?; echo "== $tag rc $rc : $*"; grep -E "^step|^qkv|^o_proj|^gate_up|^down|ring-check|HANG|block " $J/dc-$tag.log | grep -v "^ring launch" | head -20; return $rc; }
ok=1
run check2d-m8 --m 8 --ctx 80 --layers 1 --ring-check || ok=0
run check2d-m1 --m 1 --ctx 80 --layers 1 --ring-check || ok=0
if [ $ok = 1 ]; then
  run ring2d-m1 --m 1 --ctx 80 --ring qogd --pdl-ops qogd --stage-ops ""
  run ring2d-m1-1blk --m 1 --ctx 80 --ring qogd --pdl-ops qogd --stage-ops "" --ring-budget 200
  run ring2d-m8 --m 8 --ctx 1088 --ring qogd --pdl-ops qogd --stage-ops ""
  run base-m1 --m 1 --ctx 80
fi
tar cf $O/callL.tar -C $J .
