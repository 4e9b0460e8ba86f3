#!/usr/bin/env bash
# GPU call 2: the bench's window now ends one token before the requests do, so that with decode
# ahead it holds exactly --new-tokens passes (call 1's figures for the new binary counted one pass
# too few: +0.8%). The whole GPU bundle (run.sh: every GPU test, the kernel report), then the
# engine bench, HEAD's binary (6c2c983), the new one with --no-decode-ahead and the new one,
# alternating, two rounds.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/p; mkdir -p $J; cd "$(dirname "$0")/../../.."
tar xJf .gpu-carry/bundle.tar.xz; xz -dc .gpu-carry/qwen-decode-head.xz > /tmp/qd-head; chmod +x /tmp/qd-head
timeout 330 bash .gpu-bundle/run.sh > $J/run.log 2>&1; echo "run.sh rc $?"
grep -hE "^test result|FAILED|panicked|^== |passed|failed" $J/run.log | tail -25
for r in 1 2; do for v in head wait new; do
  b=.gpu-bundle/qwen-decode; x=""; [ $v = head ] && b=/tmp/qd-head; [ $v = wait ] && x=--no-decode-ahead
  timeout 120 $b bench --model qwen3-4b --policy auto --new-tokens 128 $x --out $J/res-$v-$r > $J/bench-$v-$r.log 2>&1
  echo "bench $v round $r rc $?"; grep -E "^\[auto\] i" $J/bench-$v-$r.log | cut -c1-72
done; done
cp -r .gpu-bundle/results $J/bundle-results 2>/dev/null
tar cJf "$O/call2.tar.xz" -C $J .
