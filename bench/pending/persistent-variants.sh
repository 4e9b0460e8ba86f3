#!/usr/bin/env bash
# Builds and measures the persistent step's pending patches against HEAD (bench/pending/README.md).
#
#   bash bench/pending/persistent-variants.sh build [DIR]   # here: one folder of binaries a build
#   bash bench/pending/persistent-variants.sh run DIR OUT [BUILD...]   # on the GPU machine: the
#                                                          # measurements (every build, or those named)
#
# `build` puts into DIR (default .gpu-carry/variants, git-ignored) head/ and one folder per patch of
# bench/pending/persistent-*.patch, each with the probe, qwen-decode, gpu_persistent, gpu_engine and
# gpu_decode of HEAD with that patch applied (scripts/gpu-bundle.sh and the probe, the lock rewritten
# for the build; then the patch reversed and the lock restored; .gpu-bundle/ is left holding the last
# build), and packs them into DIR.tar.xz (one xz stream with a dictionary that spans the builds: their
# embedded images are mostly the same). A patch named `A+B.patch` goes on top of `A.patch`. The
# working tree must be clean; it is left as it was.
# `run` (DIR.tar.xz unpacked into DIR) runs, for every build: gpu_persistent (SASS and PTX, every
# block count); the probe, builds alternating, twice; the dense engine bench with both step kinds,
# builds alternating, twice; a stamped pass of each build (`--persistent-trace`: the timeline and
# the table of counter wait, x load, weight wait and math); for the patches gpu_engine's oracle
# matrix, and for those named
# `*attention*` gpu_decode's test of the attention tasks; a build whose probe fails gets
# compute-sanitizer's memcheck on a one-layer probe. Logs go to OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
case "$mode" in
build)
    dir=${2:-.gpu-carry/variants}
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        echo "persistent-variants: the working tree has changes; commit or stash them first" >&2
        exit 2
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    built() { # name: this tree's binaries (gpu-bundle.sh builds and gathers the GPU tests)
        AOT_UPDATE_LOCK=1 bash scripts/gpu-bundle.sh -q >/dev/null &&
            AOT_UPDATE_LOCK=1 cargo build --release --example persistent_probe -q || return 1
        mkdir -p "$dir/$1"
        cp target/release/examples/persistent_probe .gpu-bundle/qwen-decode .gpu-bundle/tests/gpu_persistent \
            .gpu-bundle/tests/gpu_engine .gpu-bundle/tests/gpu_decode "$dir/$1/"
    }
    built head || exit 1
    for patch in bench/pending/persistent-*.patch; do
        name=$(basename "$patch" .patch)
        stack=()  # A+B: A's patch first
        [[ $name == *+* ]] && stack=("bench/pending/${name%%+*}.patch")
        stack+=("$patch")
        applied=()
        for p in "${stack[@]}"; do
            git apply "$p" || { echo "persistent-variants: $p does not apply" >&2; rc=1; break; }
            applied=("$p" "${applied[@]}")
        done
        [ ${#applied[@]} -eq ${#stack[@]} ] && { built "$name"; rc=$?; }
        git checkout -- aot-manifest.lock
        for p in "${applied[@]}"; do git apply -R "$p"; done
        [ $rc -eq 0 ] || { echo "persistent-variants: $name does not build" >&2; exit 1; }
    done
    (cd "$dir" && tar -cf - . | xz -T1 --lzma2=preset=1,dict=1536MiB >"../$(basename "$dir").tar.xz")
    echo "persistent-variants: $(ls "$dir" | tr '\n' ' ')-> $dir.tar.xz"
    ;;
run)
    dir=${2:?run needs DIR}
    out=${3:?run needs OUT}
    shift 3
    mkdir -p "$out"
    export RUST_LOG=warn QWEN_FIXTURES=$PWD/qwen-engine/tests/fixtures PATH=$PATH:/usr/local/cuda/bin
    builds=${*:-$(ls "$dir")}  # gpu_engine may take up to 200 s a build: a call's 600 s hold few
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    for b in $builds; do
        (cd "$dir/$b" && timeout 150 ./gpu_persistent --include-ignored --test-threads=1 --nocapture \
            >"$out/$b-gpu_persistent.log" 2>&1)
        echo "$b gpu_persistent rc $? $(grep '^test result' "$out/$b-gpu_persistent.log")"
    done
    for i in 1 2; do for b in $builds; do
        echo "== $b run $i" >>"$out/probe.log"
        timeout 60 "$dir/$b/persistent_probe" --runs 20 >>"$out/probe.log" 2>&1
        echo "rc $?" >>"$out/probe.log"
    done; done
    grep -E "==|m [18]: (persistent \(8|launches)|rc [^0]" "$out/probe.log"
    for i in 1 2; do for b in $builds; do
        timeout 120 "$dir/$b/qwen-decode" bench --model qwen3-4b --policy auto --step launches,persistent \
            --inputs 16,1024 --concurrency 1,8 --out "$out/engine-$b-$i" >"$out/engine-$b-$i.log" 2>&1
        echo "engine $b $i rc $?"; grep "tok/s" "$out/engine-$b-$i.log" | cut -c1-120
    done; done
    for b in $builds; do  # one stamped pass at i16 c1 and at i1024 c8: where the blocks' time goes
        timeout 120 "$dir/$b/qwen-decode" bench --model qwen3-4b --policy auto --step persistent \
            --inputs 16,1024 --concurrency 1,8 --persistent-trace --out "$out/trace-$b" >"$out/trace-$b.log" 2>&1
        echo "trace $b rc $?"
    done
    for b in $builds; do
        [ "$b" = head ] && continue
        if grep -A3 "== $b run 1" "$out/probe.log" | grep -q "rc [^0]"; then
            timeout 90 compute-sanitizer --tool memcheck --print-limit 5 "$dir/$b/persistent_probe" --layers 1 --runs 1 \
                >"$out/$b-memcheck.log" 2>&1
            echo "$b memcheck rc $?"; head -20 "$out/$b-memcheck.log"
            continue
        fi
        (cd "$dir/$b" && timeout 200 ./gpu_engine gpu_engine_ --include-ignored --test-threads=1 --nocapture \
            >"$out/$b-gpu_engine.log" 2>&1)
        echo "$b gpu_engine rc $? $(grep '^test result' "$out/$b-gpu_engine.log")"
        if [[ $b == *attention* ]]; then
            (cd "$dir/$b" && timeout 90 ./gpu_decode gpu_attention_as_tasks --include-ignored --test-threads=1 \
                >"$out/$b-gpu_decode.log" 2>&1)
            echo "$b gpu_decode rc $? $(grep '^test result' "$out/$b-gpu_decode.log")"
        fi
    done
    ;;
*)
    echo "usage: $0 build [DIR] | run DIR OUT [BUILD...]" >&2
    exit 2
    ;;
esac
