#!/usr/bin/env python3
"""Compiles one kernel source to PTX several times with the pinned toolchains (nvcc 13.0 and NVRTC
12.9, as build.rs does) and names every entry whose PTX differs between runs.

The lock (aot-manifest.lock) can only hold images that compile the same every time. NVVM has been
seen to compile some code shapes differently from run to run (in decode attention: float4 loads
from shared memory narrowed differently in the fixed-group entries), which shows up as a lock
mismatch between two builds of the same tree. Run this on a kernel before `make lock` when its
code shape changed:

    python3 scripts/ptx_determinism.py kernels/attention/decode.cu [--runs 5] [--arch compute_80]

Exit status 0 when every entry is the same in every run, 1 otherwise.
"""
import argparse
import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.path.join(ROOT, ".toolchain/site/nvidia/cu13/bin/nvcc")
CUDA12 = os.path.join(ROOT, ".toolchain/cuda-12.9/site/nvidia")
NVRTC = os.path.join(CUDA12, "cuda_nvrtc/lib/libnvrtc.so.12")


def entries(ptx):
    """sha256 of each entry's text, by entry name."""
    parts = re.split(r"(?=\.visible \.entry)", ptx)
    named = {}
    for p in parts:
        m = re.search(r"\.entry (\w+)", p)
        named[m.group(1) if m else "(header)"] = hashlib.sha256(p.encode()).hexdigest()
    return named


def nvcc_ptx(source, arch):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "k.ptx")
        subprocess.run([NVCC, "--ptx", f"-arch={arch}", "-std=c++17", "-O3", "--Werror", "all-warnings",
                        "-I", os.path.join(ROOT, "kernels/include"), "-o", out, source], check=True)
        return open(out).read()


def nvrtc_ptx(lib, source, arch):
    src = open(source).read().encode()
    opts = [f"-arch={arch}", "-std=c++17", "-I" + os.path.join(ROOT, "kernels/include"),
            "-I" + os.path.join(ROOT, "build/nvrtc-include"), "-I" + os.path.join(CUDA12, "cuda_runtime/include"),
            "-I" + os.path.join(CUDA12, "cuda_cccl/include")]
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(source).encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    failed = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    if failed:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"NVRTC failed on {source}:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--arch", default="compute_80")
    a = ap.parse_args()
    compilers = []
    if os.path.exists(NVCC):
        compilers.append(("nvcc 13.0", lambda: nvcc_ptx(a.source, a.arch)))
    if os.path.exists(NVRTC):
        lib = ctypes.CDLL(NVRTC)
        compilers.append(("NVRTC 12.9", lambda: nvrtc_ptx(lib, a.source, a.arch)))
    if not compilers:
        sys.exit("no pinned toolchain under .toolchain/: run `make setup` first")
    ok = True
    for name, compile_ptx in compilers:
        runs = [entries(compile_ptx()) for _ in range(a.runs)]
        names = set().union(*runs)
        bad = sorted(k for k in names if len({r.get(k) for r in runs}) > 1)
        print(f"{name} {a.arch}, {a.runs} runs of {a.source}: "
              + (f"entries that differ: {', '.join(bad)}" if bad else f"all {len(runs[0]) - 1} entries identical"))
        ok &= not bad
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
