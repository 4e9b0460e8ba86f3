#!/usr/bin/env bash
# GPU call F: the streaming readers after their shared code became helpers (fold_loads,
# write_block_fold) and the host's fold became xor_reference: the streaming-read test and the
# bench's bandwidth measurement with its fold check (one small cell), as in call E.
set -u
O=$OUT/callF; mkdir -p $O
tar xJf .gpu-carry/bundle.tar.xz
(cd .gpu-bundle && timeout 150 ./tests/gpu_decode --include-ignored --test-threads=1 --nocapture gpu_stream_read > $O/test-gpu_decode.log 2>&1); echo "gpu_decode rc $?: $(grep -E '^test result' $O/test-gpu_decode.log)"
RUST_LOG=info timeout 90 .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto --inputs 16 --concurrency 1 --new-tokens 32 --out $O/res > $O/bench.log 2>&1; echo "bench rc $?"
grep -E "streaming read|^\[auto\]" $O/bench.log | cut -c1-130
cd $OUT && tar cJf callF.tar.xz callF && rm -rf callF
