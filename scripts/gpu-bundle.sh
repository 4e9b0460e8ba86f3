#!/usr/bin/env bash
# Build the GPU tests and qwen-decode here, and gather them into .gpu-bundle/ with a runner, for a
# GPU machine that has no Rust toolchain (the binaries open libcuda at run time; no CUDA toolkit
# is needed there).
#
#   bash scripts/gpu-bundle.sh            # here: builds (release) and fills .gpu-bundle/
#   (copy .gpu-bundle/ to the GPU machine)
#   bash .gpu-bundle/run.sh               # there: every GPU test binary + qwen-decode kernels
#
# GPU test binaries are the integration tests whose name contains "gpu" (tests/*gpu*.rs).
# Set CARGO_TARGET_DIR to build elsewhere; extra arguments go to cargo (e.g. --features ...).
set -euo pipefail

cd "$(dirname "$0")/.."
bundle=.gpu-bundle
command -v python3 >/dev/null || { echo "gpu-bundle: python3 is needed to read cargo's JSON output" >&2; exit 1; }

cargo build --release --workspace "$@"
# cargo prints one JSON line per artifact; keep the executables of test targets named *gpu*.
tests=$(cargo test --release --workspace --no-run --message-format=json "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"] \
            and "gpu" in m["target"]["name"]:
        print(m["target"]["name"] + "\t" + m["executable"])
')
if [ -z "$tests" ]; then
    echo "gpu-bundle: no GPU test binaries found (expected tests/*gpu*.rs)" >&2
    exit 1
fi

rm -rf "$bundle"
mkdir -p "$bundle/tests"
target_dir=${CARGO_TARGET_DIR:-target}
cp "$target_dir/release/qwen-decode" "$bundle/qwen-decode"
while IFS=$'\t' read -r name exe; do
    cp "$exe" "$bundle/tests/$name"
done <<<"$tests"

cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the GPU tests and the kernel report on this machine; needs an NVIDIA driver, not Rust.
# Output also goes to .gpu-bundle/results/. Exit status: 0 only if everything passed.
set -uo pipefail
cd "$(dirname "$0")"
mkdir -p results
exec > >(tee results/run.log) 2>&1

# The GPU tests fail (never skip) when they find no device: the point of this run is the GPU.
export RUST_LOG=${RUST_LOG:-info}
# The engine tests read the oracle fixtures from the repository the bundle sits in.
export QWEN_FIXTURES=${QWEN_FIXTURES:-$(pwd)/../qwen-engine/tests/fixtures}
status=0

echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || echo "(nvidia-smi not found)"

# --include-ignored: GPU tests may be #[ignore]d so that machines without a GPU skip them visibly.
for t in tests/*; do
    name=$(basename "$t")
    echo; echo "== test binary $name"
    "./$t" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "results/test-$name.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
# Totals over every "test result:" line; a SKIPPED line would mean a test did not really run.
read -r passed failed ignored < <(cat results/test-*.log | awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i }
} END { print p + 0, f + 0, g + 0 }')
skipped=$(cat results/test-*.log | grep -c '^SKIPPED' || true)

echo; echo "== qwen-decode kernels (this machine, policy auto: SASS load times)"
./qwen-decode kernels || status=1
echo; echo "== qwen-decode kernels --policy ptx-only with CUDA_CACHE_DISABLE=1 (cold JIT of the whole set)"
CUDA_CACHE_DISABLE=1 ./qwen-decode kernels --policy ptx-only || status=1
echo; echo "== CUDA 12 images forced (AOT_KERNELS_TOOLCHAIN=cuda12): what a 12.x driver loads"
AOT_KERNELS_TOOLCHAIN=cuda12 ./qwen-decode kernels || status=1
CUDA_CACHE_DISABLE=1 ./qwen-decode kernels --toolchain cuda12 --policy ptx-only || status=1
./qwen-decode kernels --json >results/kernels-auto.json || status=1
CUDA_CACHE_DISABLE=1 ./qwen-decode kernels --policy ptx-only --json >results/kernels-ptx-cold.json || status=1
./qwen-decode kernels --toolchain cuda12 --json >results/kernels-cuda12.json || status=1
echo; echo "== qwen-decode run --model tiny (the README's main command ends with this)"
./qwen-decode run --model tiny --prompt "The AOT kernels say hello" --max-new-tokens 32 || status=1
echo; echo "== qwen-decode run --model qwen3-4b (synthetic weights): decode speed at concurrency 1 and 8"
for c in 1 8; do
    ./qwen-decode run --model qwen3-4b --prompt-ids $(seq -s, 1 16) --max-new-tokens 128 --ignore-eos \
        --concurrency $c --kv-budget 8GiB --json >results/qwen3-4b-c$c.json || status=1
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['timings']; print(f'qwen3-4b c{sys.argv[2]}: decode {t[\"decode_tok_s\"]:.1f} tok/s over {t[\"decode_steps\"]} steps, load {t[\"load_s\"]:.1f} s, prefill {t[\"prefill_s\"]:.3f} s')" results/qwen3-4b-c$c.json $c || status=1
done
echo; echo "== simulated plans (no GPU needed): Thor on JetPack 7, Orin on JetPack 6, H100 on r550"
./qwen-decode kernels --simulate 11.0 --integrated --driver 13.0 | tail -n 4 || status=1
./qwen-decode kernels --simulate 8.7 --integrated --driver 12.6 | tail -n 4 || status=1
./qwen-decode kernels --simulate 9.0 --driver 12.4 | tail -n 4 || status=1

[ "$failed" = 0 ] && [ "$skipped" = 0 ] || status=1
echo; echo "== summary: tests passed $passed, failed $failed, ignored $ignored, skipped $skipped; overall $([ $status = 0 ] && echo OK || echo FAILED)"
echo "   (log: $(pwd)/results/run.log, JSON reports in results/)"
# When run through a harness that collects $OUT, leave the results there too.
[ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && cp -r results "$OUT/gpu-bundle-results"
exit $status
RUN
chmod +x "$bundle/run.sh" "$bundle/qwen-decode" "$bundle"/tests/*

echo "gpu-bundle: $(du -sh "$bundle" | cut -f1) in $bundle/:"
ls -l "$bundle" "$bundle/tests"
echo "gpu-bundle: copy $bundle/ to the GPU machine and run: bash $bundle/run.sh"
