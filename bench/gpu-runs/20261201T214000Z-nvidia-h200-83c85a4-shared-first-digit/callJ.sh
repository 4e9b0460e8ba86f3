#!/usr/bin/env bash
# GPU call J: the ring GEMV's sensitivity (slots in flight, one block an SM) in decode-chain, then
# the whole GPU bundle (every GPU test + kernel report) on the working tree (83c85a4 + the
# sampler's shared first digit).
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/j; mkdir -p $J; cd "$(dirname "$0")/.."
bash .gpu-carry/ring/dc/build.sh . /tmp/dc > $J/dc-build.log 2>&1; echo "dc build rc $?"
run() { local tag=$1; shift; timeout 60 /tmp/dc "$@" > $J/dc-$tag.log 2>&1; echo "== $tag rc $? : $*"; grep -E "^step|^qkv|^o_proj|^gate_up|^down" $J/dc-$tag.log; }
R="--m 1 --ctx 80 --ring qogd --pdl-ops qogd --stage-ops"
run ring-m1-s2 $R "" --ring-slots 2
run ring-m1-s3 $R "" --ring-slots 3
run ring-m1-1blk $R "" --ring-budget 200
tar xJf .gpu-carry/bundle.tar.xz
OUT= timeout 420 bash .gpu-bundle/run.sh > $J/run.log 2>&1; echo "run.sh rc $?"
cp -r .gpu-bundle/results $J/bundle-results
grep -E "^== |test result|FAILED|panicked|clusters_checked|candidates|^passed|SKIPPED" $J/run.log | head -60
tar cf $O/callJ.tar -C $J .
