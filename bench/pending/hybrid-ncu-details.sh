#!/usr/bin/env bash
# Nsight Compute's sections (speed of light, launch, occupancy, warp states, memory) of every kernel
# of one i16 c1 decode step of the 35B-A3B, cut to its first four layers (`--layers 4`: three
# DeltaNet layers and the first attention layer, their real shapes), so that the multi-pass replay
# fits a call: session 57's run on the whole model profiled three launches in 120 s. What it is
# for: the fixed costs of the one-token step kernel by kernel (the residual-norm tail of out_proj,
# the attention at head dim 256, `gdn_recurrent`'s instruction chain, the router, the MoE launches).
#
#   bash bench/pending/hybrid-ncu-details.sh QWEN_DECODE OUT
#
# Leaves OUT/ncu-details.csv (`ncu --page details --csv` of the report) and OUT/ncu.log; the
# report itself (OUT/hybrid-i16c1.ncu-rep) is large: pack what a device call returns.
set -u
q=${1:?usage: $0 QWEN_DECODE OUT}
o=${2:?usage: $0 QWEN_DECODE OUT}
mkdir -p "$o"
export RUST_LOG=warn PATH=$PATH:/usr/local/cuda/bin
# One step of a four-layer model: 3 x 7 launches of a DeltaNet layer, 8 of the attention layer,
# the embedding, the first norm, lm_head and the sampling (30 or so).
timeout 400 ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --launch-count 40 -o "$o/hybrid-i16c1" \
    "$q" bench --model qwen3.6-35b-a3b --layers 4 --inputs 16 --concurrency 1 --new-tokens 1 \
    --warmup 2 --profile-window --primer 16 --kv-budget 2GiB --bandwidth-bytes 1GiB \
    --out "$o/bench" >"$o/ncu.log" 2>&1
echo "ncu rc $?"
ncu -i "$o/hybrid-i16c1.ncu-rep" --page details --csv >"$o/ncu-details.csv" 2>&1
echo "details: $(grep -c '"Duration"' "$o/ncu-details.csv") kernels"
