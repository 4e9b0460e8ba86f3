#!/usr/bin/env bash
# Builds the decode-chain micro-benchmark against the kernel sources of a source tree (default: this
# checkout) with the nvcc on PATH: build.sh [TREE] [OUT_BINARY] [ARCH, default sm_90]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "${1:-$here/../../..}" && pwd)
out=${2:-$here/decode-chain}
arch=${3:-sm_90}
nvcc -O3 -std=c++17 -arch="$arch" -I"$tree" -I"$tree/kernels/include" -I"$here" \
    "$here/main.cu" "$here/gemv_tu.cu" "$here/attn_tu.cu" -o "$out"
echo "built $out from $tree"
