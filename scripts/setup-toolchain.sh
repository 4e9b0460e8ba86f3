#!/usr/bin/env bash
# Installs the pinned CUDA compiler (and the cuobjdump test oracle) from PyPI into .toolchain/.
# Idempotent: a stamp records the pins; a second run with the same pins does nothing.
# The pins live in aot-manifest.toml ([toolchain] packages, oracle_packages); nothing is repeated here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.toolchain"
python="${PYTHON:-python3}"

pins=$("$python" - "$root/aot-manifest.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    tc = tomllib.load(f)["toolchain"]
print(" ".join(tc["packages"] + tc.get("oracle_packages", [])))
PY
)
stamp="$dest/.installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$pins" && -x "$dest/site/nvidia/cu13/bin/nvcc" ]]; then
    echo "toolchain: already installed in $dest ($pins)"
    exit 0
fi
echo "toolchain: installing into $dest: $pins"
rm -rf "$dest/site"
mkdir -p "$dest"
# shellcheck disable=SC2086
"$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$dest/site" $pins
echo "$pins" >"$stamp"
"$dest/site/nvidia/cu13/bin/nvcc" --version | tail -n 2
