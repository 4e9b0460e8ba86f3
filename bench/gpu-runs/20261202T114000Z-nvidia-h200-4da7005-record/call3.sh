#!/usr/bin/env bash
# GPU call 3: Nsight Compute captures of exactly the timed steps (profile window) of HEAD (4da7005):
# i16 c1 and i1024 c8; then the other six GPU test binaries.
set -uo pipefail
O=${OUT:-/tmp/out}; J=/tmp/m; mkdir -p $J
xz -dc .gpu-carry/qwen-decode.xz > /tmp/qwen-decode && chmod +x /tmp/qwen-decode
for cell in "16 1" "1024 8"; do
  set -- $cell
  d=$J/profile-i$1-c$2
  timeout 200 bash scripts/bench/profile.sh /tmp/qwen-decode $d $1 $2 2 > $d.txt 2>&1; echo "profile i$1 c$2 rc $? at ${SECONDS}s"; cat $d.txt
done
mkdir -p /tmp/t; export QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures
for t in $(ls .gpu-carry/t3); do
  n=${t%.xz}; xz -dc .gpu-carry/t3/$t > /tmp/t/$n; chmod +x /tmp/t/$n
  [ $SECONDS -gt 540 ] && { echo "$n not run: ${SECONDS}s"; continue; }
  (cd /tmp/t && timeout 200 ./$n --include-ignored --test-threads=1 --nocapture > $J/test-$n.log 2>&1); echo "$n rc $? at ${SECONDS}s: $(grep -E '^test result' $J/test-$n.log)"
done
cat $J/test-*.log | awk '/^test result:/ { p += $4; f += $6; g += $8 } END { print "total: " p " passed, " f " failed, " g " ignored" }'
echo "SKIPPED lines: $(cat $J/test-*.log | grep -c '^SKIPPED')"
tar cJf $O/call3.tar.xz -C $J .
