#!/usr/bin/env bash
# GPU call K: does the ring GEMV's bulk-copy size matter? Stages of 1024 and 2048 elements a row
# (2 and 4 KiB copies) against 512, one block an SM (--ring-budget 200).
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/k; mkdir -p $J; cd "$(dirname "$0")/.."
for sk in 1024 2048; do NVCC_FLAGS=-DRING_STAGE_K=$sk bash .gpu-carry/ring/dc/build.sh . /tmp/dc$sk > $J/dc$sk-build.log 2>&1 & done; wait
run() { local b=$1 tag=$2; shift 2; timeout 60 $b "$@" > $J/dc-$tag.log 2>&1; echo "== $tag rc $? : $*"; grep -E "^step|^qkv|^o_proj|^gate_up|^down|ring-check m" $J/dc-$tag.log; }
for sk in 2048 1024; do
  run /tmp/dc$sk check-k$sk --m 8 --ctx 80 --layers 1 --ring-check --ring-budget 200
  run /tmp/dc$sk ring-m1-k$sk --m 1 --ctx 80 --ring qogd --pdl-ops qogd --stage-ops "" --ring-budget 200
done
tar cf $O/callK.tar -C $J .
