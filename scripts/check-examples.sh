#!/usr/bin/env bash
# Builds examples/rust-engine (an engine outside the workspace that links aot-kernels by path, as a
# downstream crate does) and runs it: on a machine without a GPU its no-GPU path (exit 3 and a
# clear message), everywhere its argument errors (exit 2, naming the argument); with a GPU the
# whole RMSNorm -> GEMV -> argmax check (exit 0).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/examples/rust-engine"
# The example's own target directory under the workspace's (git-ignored).
export CARGO_TARGET_DIR="$root/target/rust-engine-example"
cargo fmt --check
cargo build --release
cargo clippy --release -- -D warnings
bin="$CARGO_TARGET_DIR/release/rust-engine-example"

source "$root/scripts/expect-exit.sh"
expect 2 "--rows 9: the GEMV takes 1..=8 rows" --rows 9
expect 2 "--hidden 100: needs a positive multiple of 8" --hidden 100
expect 2 "unknown argument \`--bogus\`" --bogus 1
if nvidia-smi >/dev/null 2>&1; then
    "$bin"
else
    expect 3 "no GPU:"
fi
