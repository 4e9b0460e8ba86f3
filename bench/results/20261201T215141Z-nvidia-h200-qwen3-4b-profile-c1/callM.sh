#!/usr/bin/env bash
# GPU call M: Nsight Compute captures of exactly the timed steps (profile window) with today's
# kernels: i16 c1 and i1024 c8.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/m; mkdir -p $J; cd "$(dirname "$0")/.."
tar xJf .gpu-carry/bundle.tar.xz
for cell in "16 1" "1024 8"; do
  set -- $cell
  d=$J/profile-i$1-c$2
  timeout 200 bash scripts/bench/profile.sh .gpu-bundle/qwen-decode $d $1 $2 2 > $d.txt 2>&1; echo "profile i$1 c$2 rc $?"; cat $d.txt
done
tar cf $O/callM.tar -C $J .
