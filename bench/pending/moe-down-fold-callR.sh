#!/usr/bin/env bash
# Session 47, call R: moe_down's last program combining, adding and norming a single token's row (no
# moe_combine_norm launch at one token; moe_combine_norm on 4 warps, as moe_down, for the same bits), "fold",
# against c91a57b ("head"), alternating twice; then fold's GPU tests (gpu_triton_kernels with the new alone-vs-batch
# check, gpu_capi moe, gpu_hybrid against the A3B-shaped fixture made after the benches). Returns $OUT/r.tar.xz.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/r; mkdir -p $J /tmp/h /tmp/n
trap 'tar -C /tmp -cJf $O/r.tar.xz r' EXIT
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee $J/gpu.txt
cp .gpu-carry/callR.sh $J/
tar -xJf .gpu-carry/head.tar.xz -C /tmp/h & tar -xJf .gpu-carry/fold.tar.xz -C /tmp/n; wait; echo "unpacked at ${SECONDS}s"
export RUST_LOG=warn AOT_ORACLE_PYTHON=python3 QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
ab() { # name dir round
  local v=$1 d=$2 r=$3
  timeout 100 $d/qwen-decode bench --model qwen3.6-35b-a3b --policy auto --kv-budget 8GiB --inputs 16,1024 --concurrency 1,8 --out $J/ab-$v-$r > $J/ab-$v-$r.log 2>&1
  echo "ab $v $r rc $? at ${SECONDS}s"
}
for r in 1 2; do ab head /tmp/h $r; ab fold /tmp/n $r; done
python3 - $J <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/ab-*/*/bench.json")):
    for c in json.load(open(f))["cells"]:
        print(f.split("/")[-3], f"i{c['input']} c{c['concurrency']}", f"{c['decode_tok_s']:.1f}", f"{100 * c['limit_share']:.1f}%", c.get("digest", "")[:16], "single-request match", c.get("single_request_match"))
PY
grep -h "single-request match" $J/ab-fold-*.log | cut -c1-40,150-200
( timeout 240 python3 scripts/oracle/make_hybrid_fixtures.py --a3b-shapes --out /tmp/hybrid-a3b --device cuda > $J/fixture.log 2>&1; echo "fixture rc $? at ${SECONDS}s" >> $J/fixture.log ) &
FX=$!
END=${CALL_END:-560}
run() { # dir name timeout [filter]
  local d=$1 n=$2 t=$3 f=${4:-}; local s=$SECONDS; local tag=$(basename $d)-$n${f:+-$f}
  [ $((SECONDS + 15)) -ge $END ] && { echo "$tag not run: the call's time is short"; return; }
  [ $((SECONDS + t)) -ge $END ] && t=$((END - SECONDS))
  local exe=$d/$n; [ -x $d/tests/$n ] && exe=$d/tests/$n
  (cd $d && timeout $t $exe --include-ignored --test-threads=1 --nocapture $f > $J/test-$tag.log 2>&1); local rc=$?
  echo "$tag rc $rc in $((SECONDS - s))s: $(grep -E '^test result' $J/test-$tag.log | tail -1 | cut -c1-90)"
  grep -E "^test .*FAILED$|panicked" $J/test-$tag.log | cut -c1-250 | head -8
}
run /tmp/n gpu_triton_kernels 150
run /tmp/n gpu_capi 40 moe
wait $FX; tail -1 $J/fixture.log
QWEN_HYBRID_GPU_FIXTURES=/tmp/hybrid-a3b run /tmp/n gpu_hybrid 120
echo "done at ${SECONDS}s"
