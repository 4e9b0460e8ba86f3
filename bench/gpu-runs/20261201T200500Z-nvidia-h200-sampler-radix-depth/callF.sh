#!/usr/bin/env bash
# GPU call F: the sampler's radix passes one load deep (B) against b04ddbf's eight (A): sample-ab,
# twice; and ptxas's time over each version's PTX (what the PTX path's JIT pays), with 8220cb5's.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/f
bash scripts/bench/sample_ab/build.sh .gpu-carry/treeA . /tmp/f/sample-ab > /tmp/f/sample-ab-build.log 2>&1; echo "build rc $?"
for r in 1 2; do /tmp/f/sample-ab --reps 50 --draws 64 > /tmp/f/sample-ab-$r.log 2>&1; echo "sample-ab $r rc $?"; cat /tmp/f/sample-ab-$r.log; done
rm -f /tmp/f/sample-ab
for t in treeO treeA .; do
  src=.gpu-carry/$t; [ $t = . ] && src=.
  nvcc -std=c++17 -arch=compute_80 -I$src/kernels/include -ptx -o /tmp/f/s.ptx $src/kernels/sampling/sample.cu
  for r in 1 2; do ptxas -arch=sm_90 -v -o /tmp/f/s.cubin /tmp/f/s.ptx 2>&1 | grep "Compile time" | sed "s|^|$t run $r: |"; done
done | tee /tmp/f/ptxas-times.log
tar cf "$O/callF.tar" -C /tmp/f .
