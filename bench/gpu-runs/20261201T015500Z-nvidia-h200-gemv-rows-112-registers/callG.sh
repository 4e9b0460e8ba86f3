#!/usr/bin/env bash
# GPU call G: the record of 9e26e33's binary (the kernels of main's HEAD): the transformers peers,
# then the bench matrix under auto and ptx-only; and decode-chain, base against the all-rows
# gate_up entry held to 120 and 112 registers (__maxnreg__), two rounds.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p /tmp/g
for v in base r120 r112; do
  bash .gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh .gpu-carry/variants/$v /tmp/dc-$v > /tmp/g/build-$v.log 2>&1 &
done
xz -dc .gpu-carry/bin/qwen-decode-9e26e33.xz > /tmp/qd-rec && chmod +x /tmp/qd-rec
python3 scripts/bench/peers.py --json-out /tmp/g/peers.json > /tmp/g/peers.log 2>&1; echo "peers rc $?"
tail -3 /tmp/g/peers.log
/tmp/qd-rec bench --model qwen3-4b --policy auto,ptx-only --peers /tmp/g/peers.json --git-commit 9e26e33 \
  --out /tmp/g/results > /tmp/g/bench.log 2>&1; echo "bench rc $?"
grep -A14 "^| cell" /tmp/g/bench.log
grep -E "^\[(auto|ptx-only)\] i" /tmp/g/bench.log | grep -oE "i[0-9]+ +c[0-9]+.*prefill [0-9.]+ ms \([0-9]+ TFLOP/s\)" | sed -E 's/TPOT.*prefill/prefill/'
tar cf "$OUT/callG.tar" -C /tmp/g .
wait
( CFGS="--m 4 --ctx 80;--m 8 --ctx 80;--m 8 --ctx 1088" ROUNDS=2 OUT=/tmp/g \
  bash .gpu-carry/ab.sh base r120 r112 > /dev/null 2>&1 )
python3 .gpu-carry/summ.py /tmp/g/ab.log | tee /tmp/g/summary.txt
awk '/^=== /{v=$5; c=$7" "$8" "$9" "$10} /^digest/{print c, v, $2}' /tmp/g/ab.log | sort -u | tee /tmp/g/digests.txt
tar cf "$OUT/callG.tar" -C /tmp/g .
