#!/usr/bin/env bash
# GPU call D: the GPU tests of ca5cd9d's code (fdefa4a's kernels) that its change touches or that load
# every module: dispatch_gpu, gpu_decode, gpu_engine, gpu_kernels, gpu_sampling, gpu_prefill.
set -u
O=$OUT/callD; mkdir -p $O
tar xJf .gpu-carry/bundle.tar.xz
export RUST_LOG=info QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
for t in dispatch_gpu gpu_decode gpu_engine gpu_kernels gpu_sampling gpu_prefill; do
  [ $SECONDS -gt 330 ] && { echo "$t not run: ${SECONDS}s"; continue; }
  (cd .gpu-bundle && timeout 200 ./tests/$t --include-ignored --test-threads=1 --nocapture > $O/test-$t.log 2>&1); echo "$t rc $? at ${SECONDS}s: $(grep -E '^test result' $O/test-$t.log)"
done
cat $O/test-*.log | awk '/^test result:/ { p += $4; f += $6; g += $8 } END { print "total: " p " passed, " f " failed, " g " ignored" }'
echo "SKIPPED lines: $(cat $O/test-*.log | grep -c '^SKIPPED')"
cd $OUT && tar cJf callD.tar.xz callD && rm -rf callD
