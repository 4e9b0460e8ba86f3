#!/usr/bin/env bash
# Captures exactly the timed decode steps of one bench cell with Nsight Compute, and prints the
# per-kernel time table. The bench runs a primer first and brackets the timed steps with
# cuProfilerStart/cuProfilerStop (--profile-window), so `--profile-from-start off` sees those
# kernels and none of the primer's or the set-up's.
#
#   bash scripts/bench/profile.sh [QWEN_DECODE] [OUT_DIR] [INPUT] [CONCURRENCY] [STEPS]
#
# Defaults: target/release/qwen-decode (or .gpu-bundle/qwen-decode), ./profile, 16, 1, 2.
# MODEL (default qwen3-4b) picks the preset, e.g. MODEL=qwen3.6-35b-a3b; EXTRA adds bench flags.
# For ncu's multi-pass sections on the 35B-A3B, EXTRA="--layers 4" cuts the synthetic model to its
# first four layers (their real shapes, about 7 GB of weights instead of 69).
# ncu keeps the GPU at its own clocks and caches (--clock-control none --cache-control none, so a
# kernel sees the L2 its predecessor left, as in a real step) and reads one metric per kernel
# (gpu__time_duration.sum), one replay pass each.
set -euo pipefail
bin=${1:-}
if [ -z "$bin" ]; then
    for c in target/release/qwen-decode .gpu-bundle/qwen-decode; do [ -x "$c" ] && bin=$c && break; done
fi
out=${2:-profile}
input=${3:-16}
conc=${4:-1}
steps=${5:-2}
model=${MODEL:-qwen3-4b}
[ -x "$bin" ] || { echo "profile.sh: no qwen-decode binary (build it or pass its path)" >&2; exit 2; }
command -v ncu >/dev/null || { echo "profile.sh: ncu (Nsight Compute) is not on PATH" >&2; exit 2; }
mkdir -p "$out"
ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$out/ncu.csv" \
    "$bin" bench --model "$model" --inputs "$input" --concurrency "$conc" --new-tokens "$steps" \
    --warmup 4 --profile-window --primer 256 --kv-budget 4GiB --bandwidth-bytes 1GiB --out "$out" ${EXTRA:-} \
    >"$out/bench.log" 2>&1
python3 - "$out/ncu.csv" "$steps" "$out" <<'PY'
import csv, glob, json, sys, collections, statistics
path, steps = sys.argv[1], int(sys.argv[2])
bundles = sorted(glob.glob(sys.argv[3] + "/*/bench.json"))
bench = json.load(open(bundles[-1])) if bundles else {}
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"')) ]
head, data = rows[0], rows[1:]
ki, mi, vi, ui = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
ids = head.index("ID")
per = collections.OrderedDict()
seen = set()
for r in data:
    if r[mi] != "gpu__time_duration.sum":
        continue
    seen.add(r[ids])
    v = float(r[vi].replace(",", ""))
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r[ui]]
    per.setdefault(r[ki].split("(")[0], []).append(v * scale)
n = len(seen)
print(f"captured kernels: {n}; timed steps: {steps}; kernels per step: {n / steps:g}")
total = sum(sum(v) for v in per.values())
print(f"{'kernel':<28} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}")
for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:<28} {len(v):>8} {sum(v):>10.1f} {statistics.mean(v):>9.2f} {100 * sum(v) / total:>5.1f}%")
print(f"sum of kernel times per step: {total / steps:.1f} us")
for c in bench.get("cells", []):
    print(f"bench cell i{c['input']} c{c['concurrency']}: TPOT median {c['tpot_ms_median'] * 1e3:.1f} us (under the profiler)")
PY
