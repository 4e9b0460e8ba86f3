#!/usr/bin/env bash
# Measures `fatbin-verify list` against `sha256sum` on a ~200 MB host-like file: a real small
# executable, padded with random data, with fatbins embedded at a few places (some unaligned).
# Usage: bench/throughput.sh FATBIN_VERIFY_BIN HOST_BINARY FATBIN... (writes to a temp dir)
set -euo pipefail
bin="$1"; host="$2"; shift 2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
blob="$work/blob.bin"
cp "$host" "$blob"
for f in "$@"; do
    head -c $((60 * 1024 * 1024 + RANDOM)) /dev/urandom >>"$blob"
    cat "$f" >>"$blob"
done
size=$(stat -c %s "$blob")
head -c $((200 * 1024 * 1024 - size)) /dev/urandom >>"$blob"
size=$(stat -c %s "$blob")
cat "$blob" >/dev/null # warm the page cache for both tools
time_of() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc -l; }
for tool in list sha256sum; do
    best=999
    for _ in 1 2 3; do
        if [[ $tool == list ]]; then t=$(time_of "$bin" list "$blob"); else t=$(time_of sha256sum "$blob"); fi
        best=$(echo "if ($t < $best) $t else $best" | bc -l)
    done
    printf '%-10s %8.3f s  %8.1f MB/s  (%d bytes, best of 3)\n' "$tool" "$best" "$(echo "$size / 1000000 / $best" | bc -l)" "$size"
done
"$bin" list "$blob" | head -20
