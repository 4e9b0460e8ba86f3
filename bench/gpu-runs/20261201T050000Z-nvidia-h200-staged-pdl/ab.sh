#!/usr/bin/env bash
# A/B of kernel variants with the decode-chain micro-benchmark:
#   ab.sh NAME[:FLAGS]...   (NAME a dir under .gpu-carry/variants; FLAGS with commas for spaces)
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$out/gpu.txt"
for v in $(for spec in "$@"; do echo "${spec%%:*}"; done | sort -u); do
  bs=scripts/bench/decode_chain/build.sh
  [ -f .gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh ] && bs=.gpu-carry/variants/$v/scripts/bench/decode_chain/build.sh
  [ -x /tmp/dc-$v ] || bash $bs .gpu-carry/variants/$v /tmp/dc-$v > "$out/build-$v.log" 2>&1 &
done
wait
IFS=';' read -ra cfgs <<< "${CFGS:---m 1 --ctx 80;--m 8 --ctx 80;--m 1 --ctx 1088;--m 8 --ctx 1088}"
for round in $(seq 1 ${ROUNDS:-2}); do
  for cfg in "${cfgs[@]}"; do
    for spec in "$@"; do
      v=${spec%%:*}; flags=""; [[ $spec == *:* ]] && flags=${spec#*:}; flags=${flags//,/ }
      echo "=== round $round variant $spec cfg $cfg"
      /tmp/dc-$v $cfg $flags ${EXTRA:-} 2>&1
    done
  done
done | tee -a "$out/ab.log"
