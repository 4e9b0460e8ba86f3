#!/usr/bin/env bash
# GPU call A: (1) the suite on 9e26e33 (run.sh); (2) decode-chain: base tree (9e26e33) vs the
# chained GEMV kernel's tree, without and with --chain (and --chain-plain), alternating, two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/a
for v in base chain; do
  bash .gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh .gpu-carry/variants/$v /tmp/dc-$v > /tmp/a/build-$v.log 2>&1 &
done
tar xJf .gpu-carry/bundle.tar.xz
bash .gpu-bundle/run.sh > /tmp/a/run-9e26e33.log 2>&1
echo "run.sh rc $?"; grep -E "passed|failed|SKIPPED|^== summary|total" /tmp/a/run-9e26e33.log | tail -5
cp -r .gpu-bundle/results /tmp/a/gpu-bundle-results 2>/dev/null
wait
tail -2 /tmp/a/build-*.log
tar cf "$OUT/callA.tar" -C /tmp/a .
( CFGS="--m 1 --ctx 80;--m 4 --ctx 80;--m 8 --ctx 80;--m 1 --ctx 1088;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/a \
  bash .gpu-carry/ab.sh base chain chain:--chain chain:--chain-plain > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/a/ab.log | tee /tmp/a/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/a/ab.log | sort -u | tee /tmp/a/digests.txt
grep -iE "error|fail|unknown" /tmp/a/ab.log | sort | uniq -c | head
tar cf "$OUT/callA.tar" -C /tmp/a .
