#!/usr/bin/env bash
# Fills fuzz/corpus/parse with small real inputs: fatbins in every compression mode, cubins,
# PTX, an object file and a rdc fatbin, built with the pinned toolchain.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cuda_bin="${AOT_CUDA_HOME:-$root/.toolchain/site/nvidia/cu13}/bin"
[[ -x "$cuda_bin/nvcc" ]] || { echo "no nvcc in $cuda_bin: run bash scripts/setup-toolchain.sh" >&2; exit 1; }
out="$here/corpus/parse"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/k.cu" <<'CU'
extern "C" __global__ void add_one(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" __global__ void scale(float *x, float s, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= s; }
CU
nvcc="$cuda_bin/nvcc"
gen="-gencode arch=compute_80,code=[sm_80,compute_80]"
"$nvcc" -fatbin $gen -o "$out/default.fatbin" "$work/k.cu"
"$nvcc" -fatbin $gen --no-compress -o "$out/nocompress.fatbin" "$work/k.cu"
"$nvcc" -fatbin $gen --compress-mode=size -o "$out/size.fatbin" "$work/k.cu"
"$nvcc" -fatbin $gen --compress-mode=speed -o "$out/lz4.fatbin" "$work/k.cu"
"$nvcc" -fatbin -gencode arch=compute_100f,code=sm_100f -gencode arch=compute_90a,code=sm_90a -o "$out/af.fatbin" "$work/k.cu"
"$nvcc" -fatbin -rdc=true $gen -o "$out/rdc.fatbin" "$work/k.cu"
"$nvcc" -cubin -arch=sm_90 -o "$out/k.cubin" "$work/k.cu"
"$nvcc" -ptx -arch=compute_80 -o "$out/k.ptx" "$work/k.cu"
"$nvcc" -c -arch=sm_80 -o "$out/k.o" "$work/k.cu"
ls -l "$out"
