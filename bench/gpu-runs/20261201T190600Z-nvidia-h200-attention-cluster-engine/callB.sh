#!/usr/bin/env bash
# GPU call B: engine bench, workspace merge everywhere (base: --no-attention-cluster) against the
# cluster merge where attn_cluster says (new), one binary, alternating, two rounds.
set -uo pipefail
O=${OUT:-/tmp/out}; mkdir -p /tmp/b
[ -d .gpu-bundle ] || tar xJf .gpu-carry/bundle.tar.xz
for round in 1 2; do for v in base new; do
  flag=; [ $v = base ] && flag=--no-attention-cluster
  .gpu-bundle/qwen-decode bench --model qwen3-4b --policy auto --new-tokens 128 $flag --out /tmp/b/res-$v-$round > /tmp/b/bench-$v-$round.log 2>&1
  echo "$v round $round rc $?"; grep -E "^\[auto\] i" /tmp/b/bench-$v-$round.log | cut -c1-70
done; done
tar cf "$O/callB.tar" -C /tmp/b .
