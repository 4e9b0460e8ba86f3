#!/usr/bin/env bash
# Builds examples/cpp-engine (a C++17 engine on the C ABI: aot-kernels-capi/include/aot_kernels.h
# and the static library) and runs it: everywhere its argument errors (exit 2, naming the argument)
# and its no-GPU checks (the ABI version, the library's named argument errors, the simulated plan
# through the buffer protocol); on a machine without a GPU the no-driver path (exit 3, the
# library's AOT_STATUS_NO_DRIVER and its message); with a GPU every op against the example's own
# references (exit 0).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
lib_dir="${CARGO_TARGET_DIR:-$root/target}/release"
cargo build --release -p aot-kernels-capi
make --no-print-directory -C examples/cpp-engine AOT_LIB_DIR="$lib_dir"
bin="$root/target/cpp-engine-example/cpp-engine"

source "$root/scripts/expect-exit.sh"
expect 2 "--rows 9: the GEMV takes 1..=8 rows" --rows 9
expect 2 "--hidden 100: needs a positive multiple of 8" --hidden 100
expect 2 "unknown argument \`--bogus\`" --bogus 1
if nvidia-smi >/dev/null 2>&1; then
    "$bin"
else
    # Exit 3 comes only after every no-GPU check passed (a failed one exits 1).
    expect 3 "the backend says (status 5): aot_backend_create: no CUDA driver found"
    echo "check-cpp-example: $(grep -c '^ok ' "$out") no-GPU checks passed"
fi
