#!/usr/bin/env bash
# Why the dense launch path ran faster from the compute_80 PTX (`ptx-only`) than from the sm_90
# SASS (`auto`) on an H100 in session 57 (bench/results/20261208T004421Z-…: +2.8% at i16 c1, +4.9%
# at i1024 c8; the H200's record of 4da7005 had `auto` ahead). One GPU call (about four minutes):
# the launch step under `auto`, `auto` without programmatic launch (AOT_KERNELS_PDL=off), `ptx-only`,
# and `auto` with only the gemv or only the attention module loaded from its PTX, alternating twice;
# then the hybrid under `auto` with and without programmatic launch, alternating twice.
#
#   bash bench/pending/launch-path-sass-vs-ptx.sh QWEN_DECODE OUT
#
# Leaves OUT/summary.txt (tok/s of i16 c1, i16 c8, i1024 c1, i1024 c8 and the digests of each run)
# and OUT/bench.tar (every run's log and bundle: a device call returns at most eight files).
# Read: if `pdloff` matches `ptx`, programmatic launch is what costs on that GPU; if `ptxgemv` or
# `ptxattn` does, that module's SASS (or its sm_90-only path: staged GEMVs, cluster attention).
set -u
q=${1:?usage: $0 QWEN_DECODE OUT}
o=${2:?usage: $0 QWEN_DECODE OUT}
mkdir -p "$o/b"
export RUST_LOG=warn
t0=$(date +%s)
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$o/summary.txt"
run() { # name pdl-mode model bench-args...
    local name=$1 pdl=$2 model=$3
    shift 3
    AOT_KERNELS_PDL=$pdl timeout 60 "$q" bench --model "$model" --step launches --inputs 16,1024 \
        --concurrency 1,8 --bandwidth-bytes 1GiB --out "$o/b/$name" "$@" >"$o/b/$name.log" 2>&1
    echo "[$(($(date +%s) - t0)) s] $name rc $?: $(grep tok/s "$o/b/$name.log" | grep -v '^|' | awk '{printf "%s ", $5}')" |
        tee -a "$o/summary.txt"
}
for i in 1 2; do
    run auto-$i auto qwen3-4b --policy auto
    run pdloff-$i off qwen3-4b --policy auto
    run ptx-$i auto qwen3-4b --policy ptx-only
    run ptxgemv-$i auto qwen3-4b --policy auto --ptx-modules gemv
    run ptxattn-$i auto qwen3-4b --policy auto --ptx-modules attention
done
for i in 1 2; do
    run hyb-auto-$i auto qwen3.6-35b-a3b --policy auto --kv-budget 8GiB
    run hyb-pdloff-$i off qwen3.6-35b-a3b --policy auto --kv-budget 8GiB
done
python3 - "$o/b" <<'PY' | tee -a "$o/summary.txt"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/*/bench.json")):
    b = json.load(open(f))
    print(f.split("/")[-3], [(c["input"], c["concurrency"], round(c["decode_tok_s"], 1), c["digest"][:10]) for c in b["cells"]])
PY
(cd "$o" && tar -cf bench.tar b && rm -rf b)
