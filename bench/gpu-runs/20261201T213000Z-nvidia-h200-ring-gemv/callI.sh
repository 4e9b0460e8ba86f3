#!/usr/bin/env bash
# GPU call I: the ring GEMV (every consumer warp on every stage), checked against the engine's
# kernels and timed in decode-chain; the sampler's shared first digit (sample-ab).
set -uo pipefail
O=${OUT:-/tmp/out}; cd "$(dirname "$0")/.."
bash .gpu-carry/ring/dc/build.sh . /tmp/dc > $O/dc-build.log 2>&1; echo "dc build rc $?"
for m in 1 8; do timeout 40 /tmp/dc --m $m --ctx 80 --layers 1 --ring-check > $O/ring-check-m$m.log 2>&1; echo "check m$m rc $?"; grep -v "^ring launch" $O/ring-check-m$m.log | grep -E "ring|HANG|block" | head -24; done
run() { local tag=$1; shift; timeout 60 /tmp/dc "$@" > $O/dc-$tag.log 2>&1; echo "== $tag rc $? : $*"; grep -E "^step|^digest|^qkv|^o_proj|^gate_up|^down" $O/dc-$tag.log; }
run base-m1 --m 1 --ctx 80
run ring-m1 --m 1 --ctx 80 --ring qogd --pdl-ops qogd --stage-ops ""
run ringnopdl-m1 --m 1 --ctx 80 --ring qogd --pdl-ops "" --stage-ops ""
run base-m8 --m 8 --ctx 1088
run ring-m8 --m 8 --ctx 1088 --ring qogd --pdl-ops qogd --stage-ops ""
bash scripts/bench/sample_ab/build.sh .gpu-carry/treeH . /tmp/sample-ab > $O/sample-ab-build.log 2>&1; echo "sample-ab build rc $?"
timeout 150 /tmp/sample-ab --reps 50 --draws 64 > $O/sample-ab-1.log 2>&1; echo "sample-ab rc $?"; cat $O/sample-ab-1.log
