#!/usr/bin/env bash
# GPU call N: decode attention's unpipelined entries with the warp's first cache block requested
# before the query's preparation (held to 128 registers): decode-chain A/B against HEAD's kernels
# at eight rows and 1088 tokens (the entries' case), digests compared; gpu_decode and gpu_engine.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/n; mkdir -p $J; cd "$(dirname "$0")/.."
bash scripts/bench/decode_chain/build.sh .gpu-carry/treeH /tmp/dcA > $J/dcA-build.log 2>&1 &
bash scripts/bench/decode_chain/build.sh . /tmp/dcB > $J/dcB-build.log 2>&1 &
tar xJf .gpu-carry/nb.tar.xz
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures RUST_LOG=info
.gpu-bundle/tests/gpu_decode --include-ignored --test-threads=1 --nocapture > $J/test-gpu_decode.log 2>&1; echo "gpu_decode rc $?"
.gpu-bundle/tests/gpu_engine --include-ignored --test-threads=1 --nocapture > $J/test-gpu_engine.log 2>&1; echo "gpu_engine rc $?"
grep -E "^test result" $J/test-gpu_*.log
wait; echo "builds: $(tail -1 $J/dcA-build.log) / $(tail -1 $J/dcB-build.log)"
for r in 1 2; do for v in A B; do
  timeout 40 /tmp/dc$v --m 8 --ctx 1088 > $J/dc-$v-m8-$r.log 2>&1; echo "== $v m8 round $r rc $?"; grep -E "^step|^digest|^attn" $J/dc-$v-m8-$r.log
done; done
for v in A B; do timeout 40 /tmp/dc$v --m 4 --ctx 1088 --pipeline off > $J/dc-$v-m4np.log 2>&1; echo "== $v m4 np rc $?"; grep -E "^step|^digest|^attn" $J/dc-$v-m4np.log; done
tar cf $O/callN.tar -C $J .
