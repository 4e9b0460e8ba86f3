#!/usr/bin/env bash
# Regenerates (or with --check, verifies) kernels/triton/generated/: the Triton modules' PTX and
# metadata for every target, and the reachability table. Needs neither a GPU nor system CUDA:
# triton==3.6.0 goes into the git-ignored .triton-venv/, the pinned ptxas comes from .toolchain/.
#   bash scripts/triton-gen.sh            rewrite the committed files (`make triton`)
#   bash scripts/triton-gen.sh --check    regenerate elsewhere, compare byte for byte (CI)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.triton-venv"
python="${PYTHON:-python3}"
pin="triton==3.6.0"

bash "$root/scripts/setup-toolchain.sh" >/dev/null
if [[ ! -f "$venv/.installed" || "$(cat "$venv/.installed")" != "$pin" ]]; then
    echo "triton-gen: installing $pin into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin"
    echo "$pin" >"$venv/.installed"
fi
exec "$venv/bin/python" "$root/scripts/triton_gen.py" "$@"
