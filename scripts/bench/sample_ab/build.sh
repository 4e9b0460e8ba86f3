#!/usr/bin/env bash
# Builds sample-ab: the sampling kernel of two source trees in one binary, timed in alternation on
# the same rows, with the tokens of the two compared: build.sh TREE_A TREE_B [OUT] [ARCH, default sm_90]
# (nvcc on PATH; CUDA 12.8 or later).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=$(cd "$1" && pwd)
b=$(cd "$2" && pwd)
out=${3:-$here/sample-ab}
arch=${4:-sm_90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for v in a b; do
    tree=$a; [ $v = b ] && tree=$b
    nvcc -O3 -std=c++17 -arch="$arch" -I"$tree" -I"$tree/kernels/include" -Dsample_tokens=sample_tokens_$v \
        -DSAMPLE_AB_NAME=launch_$v -c "$here/tu.cu" -o "$tmp/$v.o"
done
nvcc -O3 -std=c++17 -arch="$arch" "$here/main.cu" "$tmp/a.o" "$tmp/b.o" -o "$out"
echo "built $out: A = $a, B = $b"
