#!/usr/bin/env bash
# GPU call F: narrow GEMVs of few tiles in 8-row tiles (o_proj, down), sums of squares per 8 rows.
# (1) run.sh on the new bundle; (2) decode-chain: base tree (9e26e33) vs the new tree with and
# without 8-row tiles (--no-half), two rounds; (3) the engine bench, 9e26e33's binary vs the new
# one, alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/f
for v in base half; do
  bash .gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh .gpu-carry/variants/$v /tmp/dc-$v > /tmp/f/build-$v.log 2>&1 &
done
tar xJf .gpu-carry/bundle.tar.xz
xz -dc .gpu-carry/bin/qwen-decode-9e26e33.xz > /tmp/qd-base && chmod +x /tmp/qd-base
bash .gpu-bundle/run.sh > /tmp/f/run-half.log 2>&1
echo "run.sh rc $?"; grep -E "^== summary" /tmp/f/run-half.log
grep -E "^test result|FAILED|panicked" /tmp/f/run-half.log | sort | uniq -c | head
wait
tar cf "$OUT/callF.tar" -C /tmp/f .
( CFGS="--m 1 --ctx 80;--m 8 --ctx 80;--m 1 --ctx 1088;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/f \
  bash .gpu-carry/ab.sh base half half:--no-half > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/f/ab.log | tee /tmp/f/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/f/ab.log | sort -u > /tmp/f/digests.txt
tar cf "$OUT/callF.tar" -C /tmp/f .
export QWEN_FIXTURES=$(pwd)/qwen-engine/tests/fixtures
for round in 1 2; do for v in base half; do
  bin=/tmp/qd-base; [ $v = half ] && bin=.gpu-bundle/qwen-decode
  $bin bench --model qwen3-4b --new-tokens 64 --out /tmp/f/results-$v-$round > /tmp/f/bench-$v-$round.log 2>&1
  echo "bench $v round $round rc $?"; grep -E "^\[auto\] i" /tmp/f/bench-$v-$round.log | cut -c1-200
done; done
tar cf "$OUT/callF.tar" -C /tmp/f .
