#!/usr/bin/env bash
# GPU call M: the commit that widens bf16 with aot::to_f32 (mov.b32 {0, x}).
# (1) the GPU test bundle of its build; (2) the engine bench, f214ed0's binary against its own,
# auto, alternating, two rounds; (3) the SASS of the narrow norm GEMV as nvcc 13.0 makes it for
# sm_90 from the three ways of widening (cuda_bf16.h's cvt.f32.bf16, a C++ shift, the mov), as
# opcode counts.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/m
tar xJf .gpu-carry/bundle.tar.xz
xz -dc .gpu-carry/bin/qwen-decode-f214ed0.xz > /tmp/qd-old && chmod +x /tmp/qd-old
for v in base fix fixasm; do
  bash .gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh .gpu-carry/variants/$v /tmp/dc-$v > /tmp/m/build-$v.log 2>&1 &
done
bash .gpu-bundle/run.sh > /tmp/m/run.log 2>&1; echo "run.sh rc $?"
grep -h "^test result" .gpu-bundle/results/test-*.log; tail -3 /tmp/m/run.log
tar cf "$OUT/callM.tar" -C /tmp/m .
for round in 1 2; do for b in old new; do
  bin=/tmp/qd-old; [ $b = new ] && bin=.gpu-bundle/qwen-decode
  $bin bench --model qwen3-4b --policy auto --new-tokens 128 --out /tmp/m/res-$b-$round > /tmp/m/bench-$b-$round.log 2>&1
  echo "$b round $round rc $?"; grep -E "^\[auto\] i" /tmp/m/bench-$b-$round.log | cut -c1-48
done; done
wait
for v in base fix fixasm; do
  cuobjdump -sass -fun gemv_narrow_norm_bf16 /tmp/dc-$v 2>&1 | grep -E "^\s+/\*[0-9a-f]{4}\*/" | sed -E 's/^\s+\/\*[0-9a-f]+\*\/\s+//; s/^@!?U?P[T0-9]+\s+//' | awk '{print $1}' \
    | sort | uniq -c | sort -k2 > /tmp/m/sass-ops-$v.txt
  echo "$v: $(awk '{s+=$1} END {print s}' /tmp/m/sass-ops-$v.txt) instructions"
done
echo "== base vs fixasm"; diff /tmp/m/sass-ops-base.txt /tmp/m/sass-ops-fixasm.txt
echo "== fix vs fixasm"; diff /tmp/m/sass-ops-fix.txt /tmp/m/sass-ops-fixasm.txt
tar cf "$OUT/callM.tar" -C /tmp/m .
