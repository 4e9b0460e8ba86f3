#!/usr/bin/env bash
# Installs the pinned CUDA compilers (and the cuobjdump and nvdisasm test oracles) from PyPI into .toolchain/:
# the primary ([toolchain]: nvcc 13.0) into .toolchain/site, each [[extra_toolchain]] (NVRTC 12.9)
# into .toolchain/cuda-<release>/site (their wheels would collide in one folder).
# Idempotent: a stamp records the pins; a second run with the same pins does nothing.
# The pins live in aot-manifest.toml; nothing is repeated here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.toolchain"
python="${PYTHON:-python3}"

# One line per install: folder (relative to .toolchain), a file that proves it is there, pins.
plan=$("$python" - "$root/aot-manifest.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    manifest = tomllib.load(f)
tc = manifest["toolchain"]
print("site", "nvidia/cu13/bin/nvcc", " ".join(tc["packages"] + tc.get("oracle_packages", [])), sep="\t")
for extra in manifest.get("extra_toolchain", []):
    major = extra["cuda"].split(".")[0]
    print(f"cuda-{extra['cuda']}/site", f"nvidia/cuda_nvrtc/lib/libnvrtc.so.{major}",
          " ".join(extra["packages"]), sep="\t")
PY
)
stamp="$dest/.installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$plan" ]]; then
    complete=1
    while IFS=$'\t' read -r folder proof _; do
        [[ -e "$dest/$folder/$proof" ]] || complete=0
    done <<<"$plan"
    if [[ $complete == 1 ]]; then
        echo "toolchain: already installed in $dest ($(cut -f3 <<<"$plan" | tr '\n' ' '))"
        exit 0
    fi
fi
mkdir -p "$dest"
rm -f "$stamp"
while IFS=$'\t' read -r folder proof pins; do
    echo "toolchain: installing into $dest/$folder: $pins"
    rm -rf "${dest:?}/$folder"
    # shellcheck disable=SC2086
    "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --target "$dest/$folder" $pins
    [[ -e "$dest/$folder/$proof" ]] || { echo "toolchain: $dest/$folder/$proof missing after install" >&2; exit 1; }
done <<<"$plan"
echo "$plan" >"$stamp"
"$dest/site/nvidia/cu13/bin/nvcc" --version | tail -n 2
