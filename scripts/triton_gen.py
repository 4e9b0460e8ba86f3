"""Ahead-of-time generation of the Triton modules: PTX + metadata for every target, and the
reachability table. Run through scripts/triton-gen.sh (which makes the pinned venv); see README.md.

  triton_gen.py            regenerate kernels/triton/generated/ in place
  triton_gen.py --check    regenerate into a temporary folder and compare byte for byte with the
                           committed one (CI); exit 1 naming every file that differs

For every `kind = "triton"` module of aot-manifest.toml, the spec of the same name in its source
file's SPECS says which @triton.jit function, signature, constexprs, num_warps and num_stages.
Each SASS target of the module is compiled by triton.compile for its capability with the pinned
CUDA ptxas (TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH), line info off. The PTX, its sha256,
Triton's own cubin's sha256 and every launch fact build.rs and the Rust launchers need are written
to generated/<module>/. Every capability is compiled a second time with Triton's bundled ptxas for
the reachability table only.

A spec with `pdl=True` names a kernel with a `PDL: tl.constexpr` parameter that guards its grid
dependency control (`griddepcontrol`, sm_90 and later): generation sets it per capability (1 from
9.0 up, 0 below and in the compute_80 fallback) and compiles those images with Triton's
`launch_pdl` option, so that each image's `launch_pdl` says whether its code waits for the kernel
before it (the Rust launcher then launches it programmatically where the GPU, driver and
AOT_KERNELS_PDL allow). PDL is not one of the module's `constexprs`: it is per image.
"""

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = Path("kernels/triton/generated")
PINNED_PTXAS = Path(".toolchain/site/nvidia/cu13/bin/ptxas")
TRITON_VERSION = "3.6.0"
# Extra rows of the reachability table beyond the manifest's targets.
EXTRA_TABLE_TARGETS = ["sm_90a", "sm_100a", "sm_110a"]
# Shared memory one block may use (the opt-in maximum, static plus dynamic) by capability, from the
# CUDA C++ Programming Guide's table of technical specifications (the H200's driver reports 232,448;
# src/dispatch/load.rs notes sm_120's 101,376). 11.0 (Thor, sm_101 before CUDA 13) is
# taken as its 10.x family's, 12.1 (GB10) as 12.0's: no such GPU has been at hand to read. An image
# past its target's limit could never launch there, so generation stops. The PTX fallback must fit
# the smallest of them: the driver JIT-compiles it for any GPU from its capability up.
SHARED_OPTIN_BYTES = {80: 163 << 10, 86: 99 << 10, 87: 163 << 10, 89: 99 << 10, 90: 227 << 10,
                      100: 227 << 10, 103: 227 << 10, 110: 227 << 10, 120: 99 << 10, 121: 99 << 10}
FALLBACK_SHARED_BYTES = min(SHARED_OPTIN_BYTES.values())


def fail(message):
    print(f"triton-gen: error: {message}", file=sys.stderr)
    sys.exit(1)


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def parse_target(name):
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", name)
    if not m:
        fail(f"`{name}` is not a CUDA target")
    return m.group(1), int(m.group(2)), m.group(3)


def triton_arch(cap):
    """The target Triton 3.6 compiles a capability for (backends/nvidia/compiler.py)."""
    return f"sm_{cap}{'a' if cap >= 90 else ''}"


def ptxas_version(path):
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def load_source(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan(manifest):
    """[(module, spec-less description)] for every Triton module, validated against its source."""
    modules = []
    default_caps = sorted(parse_target(t)[1] for t in manifest["targets"]["sass"])
    ptx_kind, ptx_cap, _ = parse_target(manifest["targets"]["ptx"])
    for i, m in enumerate(manifest.get("module", [])):
        if m["kind"] != "triton":
            continue
        key = f"aot-manifest.toml: module[{i}] ({m['name']})"
        source = ROOT / m["source"]
        if not source.is_file():
            fail(f"{key}.source: {m['source']} does not exist")
        specs = [s for s in load_source(source).SPECS if s["module"] == m["name"]]
        if len(specs) != 1:
            fail(f"{key}: {m['source']} must have exactly one SPECS entry with module = \"{m['name']}\"")
        spec = specs[0]
        entry = spec["kernel"].fn.__name__
        if m["entries"] != [entry]:
            fail(f"{key}.entries: a Triton module exports one kernel, `{entry}`; set entries = [\"{entry}\"]")
        targets = m.get("targets")
        if not targets:
            fail(f"{key}.targets: list the module's SASS targets as Triton builds them (sm_XYa from 9.0 up)")
        caps = []
        for t in targets:
            kind, cap, variant = parse_target(t)
            want = triton_arch(cap)
            if kind != "sm" or t != want:
                fail(f"{key}.targets: `{t}`: Triton 3.6 compiles capability {cap // 10}.{cap % 10} as `{want}`; list that")
            caps.append(cap)
        missing = [c for c in default_caps if c not in caps]
        if missing:
            fail(f"{key}.targets: no image for capability {', '.join(f'sm_{c}' for c in missing)} of targets.sass; "
                 f"add {', '.join(triton_arch(c) for c in missing)}")
        modules.append(dict(name=m["name"], source=m["source"], spec=spec, entry=entry, targets=targets,
                            caps=caps, fallback=f"{ptx_kind}_{ptx_cap}", fallback_cap=ptx_cap))
    return modules


# --- worker side: one (module, capability) compile in a process whose environment picks the ptxas.

def pdl_for(spec, cap):
    """Whether a capability's image of the spec carries its grid dependency control: a `pdl` spec's
    images from 9.0 up (griddepcontrol needs sm_90)."""
    return bool(spec.get("pdl")) and cap >= 90


def num_stages_for(spec, cap):
    """The spec's pipeline depth for a capability: `num_stages`, or its `num_stages_by_cap` entry where
    the deeper pipeline would not fit that GPU's shared memory. The PTX fallback is the compile of its
    capability (the same PTX as that SASS target's), so that entry sets both."""
    return spec.get("num_stages_by_cap", {}).get(cap, spec["num_stages"])


def _worker_init(env):
    for key in [k for k in os.environ if k.startswith("TRITON_")]:
        del os.environ[key]
    os.environ.update(env)


def compile_one(job):
    """Compiles one module for one capability; returns PTX, metadata and ptxas' report, or the error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source, module_name, cap, pinned_ptxas = job
    spec = next(s for s in load_source(ROOT / source).SPECS if s["module"] == module_name)
    kernel = spec["kernel"]
    signature = dict(spec["signature"])
    constexprs = dict(spec["constexprs"])
    pdl = pdl_for(spec, cap)
    if spec.get("pdl"):
        constexprs["PDL"] = int(pdl)
    for name in constexprs:
        signature[name] = "constexpr"
    order = kernel.arg_names
    unknown = set(signature) - set(order)
    missing = set(order) - set(signature)
    if unknown or missing:
        return dict(ok=False, error=f"signature names {sorted(unknown)} not parameters, {sorted(missing)} missing")
    signature = {name: signature[name] for name in order}
    pointers = [i for i, name in enumerate(order) if signature[name].startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    ptx_holder = {}

    def keep_ptx(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx_holder["ptx"] = make_ptx(src, metadata)
            return ptx_holder["ptx"]

        stages["ptx"] = ptx_stage

    triton.knobs.runtime.add_stages_inspection_hook = keep_ptx
    try:
        # Triton prints the whole PTX when ptxas fails; the error below says what matters.
        with contextlib.redirect_stdout(io.StringIO()):
            compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                                      options={"num_warps": spec["num_warps"],
                                               "num_stages": num_stages_for(spec, cap),
                                               "launch_pdl": pdl})
    except Exception as e:  # the error is the result: the reachability table reports it
        text = str(e).strip()
        fatal = [line.strip() for line in text.splitlines() if "fatal" in line]
        return dict(ok=False, error=(fatal[0] if fatal else text.splitlines()[0] if text else type(e).__name__),
                    ptx_version=_ptx_version(ptx_holder.get("ptx", "")))
    ptx = compiled.asm["ptx"]
    cubin = compiled.asm["cubin"]
    md = compiled.metadata._asdict()
    result = dict(ok=True, ptx=ptx, ptx_version=_ptx_version(ptx), cubin_sha256=sha256_bytes(cubin), metadata={
        k: md[k] for k in ("name", "num_warps", "num_ctas", "num_stages", "shared", "tmem_size",
                           "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                           "profile_scratch_align", "launch_pdl", "launch_cooperative_grid", "triton_version")
    })
    result["signature"] = [[name, signature[name]] for name in order if signature[name] != "constexpr"]
    result["divisibility_16"] = [order[i] for i in pointers]
    if pinned_ptxas:
        # Assemble the PTX again as build.rs will, with Triton's own flags: the cubin must be Triton's.
        arch = triton_arch(cap)
        with tempfile.TemporaryDirectory() as d:
            ptx_file = Path(d) / "kernel.ptx"
            ptx_file.write_text(ptx)
            args = ["-lineinfo", "-suppress-debug-info", "-v", f"--gpu-name={arch}"]
            run = subprocess.run([pinned_ptxas, *args, str(ptx_file), "-o", str(Path(d) / "kernel.cubin")],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                return dict(ok=False, error=f"ptxas: {run.stderr.strip()}")
            again = (Path(d) / "kernel.cubin").read_bytes()
        if sha256_bytes(again) != result["cubin_sha256"]:
            return dict(ok=False, error=f"ptxas {' '.join(args)} does not reproduce Triton's cubin")
        result["ptxas_args"] = args
        regs = re.search(r"Used (\d+) registers", run.stderr)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", run.stderr)
        result["registers"] = int(regs.group(1)) if regs else None
        result["spill_store_bytes"] = int(spill.group(1)) if spill else None
        result["spill_load_bytes"] = int(spill.group(2)) if spill else None
    return result


def _ptx_version(ptx):
    m = re.search(r"^\.version (\d+\.\d+)", ptx, flags=re.MULTILINE)
    return m.group(1) if m else None


def run_jobs(jobs, env, processes):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes, initializer=_worker_init, initargs=(env,)) as pool:
        return pool.map(compile_one, jobs, chunksize=1)


def toolchain_env(cache_dir, pinned):
    env = {
        "TRITON_DISABLE_LINE_INFO": "1",  # no absolute source paths in the PTX: reproducible anywhere
        "TRITON_CACHE_DIR": str(cache_dir),
    }
    if pinned:
        env["TRITON_PTXAS_PATH"] = str(ROOT / PINNED_PTXAS)
        env["TRITON_PTXAS_BLACKWELL_PATH"] = str(ROOT / PINNED_PTXAS)
    return env


def generate(out_dir, processes):
    import triton

    if triton.__version__ != TRITON_VERSION:
        fail(f"triton {triton.__version__} is installed; the generated files are made with triton=={TRITON_VERSION}"
             " (scripts/triton-gen.sh installs it)")
    with open(ROOT / "aot-manifest.toml", "rb") as f:
        manifest = tomllib.load(f)
    pinned_ptxas = ROOT / PINNED_PTXAS
    if not pinned_ptxas.is_file():
        fail(f"{PINNED_PTXAS} is missing: install the pinned toolchain with `bash scripts/setup-toolchain.sh`")
    pinned_version = ptxas_version(pinned_ptxas)
    if pinned_version != manifest["toolchain"]["nvcc_version"]:
        fail(f"{PINNED_PTXAS} is {pinned_version}, the manifest pins {manifest['toolchain']['nvcc_version']}")
    backend_bin = Path(triton.__file__).parent / "backends/nvidia/bin"
    bundled = {"ptxas": ptxas_version(backend_bin / "ptxas"),
               "ptxas-blackwell": ptxas_version(backend_bin / "ptxas-blackwell")}
    # Other TRITON_* knobs could change the output; only the ones set here apply.
    for key in [k for k in os.environ if k.startswith("TRITON_")]:
        del os.environ[key]

    modules = plan(manifest)
    table_caps = sorted({parse_target(t)[1] for t in manifest["targets"]["sass"] + EXTRA_TABLE_TARGETS})
    caps_by_module = {m["name"]: sorted(set(m["caps"]) | {m["fallback_cap"]} | set(table_caps)) for m in modules}
    jobs = [(m["source"], m["name"], cap) for m in modules for cap in caps_by_module[m["name"]]]
    with tempfile.TemporaryDirectory() as cache:
        pinned = run_jobs([(*j, str(pinned_ptxas)) for j in jobs],
                          toolchain_env(Path(cache) / "pinned", True), processes)
        unpinned = run_jobs([(*j, None) for j in jobs], toolchain_env(Path(cache) / "bundled", False), processes)
    pinned = {(j[1], j[2]): r for j, r in zip(jobs, pinned)}
    unpinned = {(j[1], j[2]): r for j, r in zip(jobs, unpinned)}

    out_dir.mkdir(parents=True, exist_ok=True)
    for m in modules:
        spec = m["spec"]
        source_bytes = (ROOT / m["source"]).read_bytes()
        mdir = out_dir / m["name"]
        mdir.mkdir(parents=True, exist_ok=True)
        images = {}
        first = None
        for target, cap in [(t, c) for t, c in zip(m["targets"], m["caps"])] + [(m["fallback"], m["fallback_cap"])]:
            r = pinned[(m["name"], cap)]
            if not r["ok"]:
                fail(f"module {m['name']}: triton.compile for {target} with the pinned ptxas failed: {r['error']}")
            first = first or r
            ptx_name = f"{triton_arch(cap)}.ptx"
            (mdir / ptx_name).write_text(r["ptx"])
            info = dict(r["metadata"])
            info.pop("name")
            for k in ("num_warps", "num_ctas", "triton_version"):
                if info.pop(k) != first["metadata"][k]:
                    fail(f"module {m['name']}: {k} differs between targets")
            # Recorded per image only where a target takes another depth than the spec's.
            if info["num_stages"] == spec["num_stages"]:
                info.pop("num_stages")
            fallback = not target.startswith("sm_")
            limit = FALLBACK_SHARED_BYTES if fallback else SHARED_OPTIN_BYTES.get(cap)
            if limit is None:
                fail(f"module {m['name']}: no shared-memory limit is known for {target}; add it to SHARED_OPTIN_BYTES")
            if info["shared"] > limit:
                fail(f"module {m['name']}: the {target} image needs {info['shared']} bytes of shared memory, past the "
                     f"{limit} one block may use {'on the smallest GPU its PTX may run on' if fallback else 'there'}; "
                     f"give its spec a shallower pipeline there (num_stages_by_cap {{{cap}: N}})")
            image = dict(ptx=ptx_name, ptx_sha256=sha256_bytes(r["ptx"].encode()), ptx_version=r["ptx_version"],
                         ptx_target=triton_arch(cap), **info)
            if not fallback:
                image.update(cubin_sha256=r["cubin_sha256"], ptxas_args=r["ptxas_args"], registers=r["registers"],
                             spill_store_bytes=r["spill_store_bytes"], spill_load_bytes=r["spill_load_bytes"])
            images[target] = image
        meta = dict(
            module=m["name"],
            entry=m["entry"],
            source=m["source"],
            source_sha256=sha256_bytes(source_bytes),
            triton_version=first["metadata"]["triton_version"],
            ptxas_version=pinned_version,
            signature=first["signature"],
            scratch_params=["global_scratch", "profile_scratch"],
            divisibility_16=first["divisibility_16"],
            constexprs=dict(spec["constexprs"]),
            num_warps=first["metadata"]["num_warps"],
            num_ctas=first["metadata"]["num_ctas"],
            num_stages=spec["num_stages"],
            images=images,
        )
        (mdir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    (out_dir / "REACHABILITY.md").write_text(
        reachability(manifest, modules, table_caps, pinned, unpinned, pinned_version, bundled))


def reachability(manifest, modules, table_caps, pinned, unpinned, pinned_version, bundled):
    rows = list(manifest["targets"]["sass"]) + EXTRA_TABLE_TARGETS
    rows.sort(key=lambda t: (parse_target(t)[1], t))
    lines = [
        "# Triton reachability (generated by scripts/triton-gen.sh; do not edit)",
        "",
        f"triton {TRITON_VERSION}; bundled ptxas {bundled['ptxas']} (capability < 10.0) and ptxas-blackwell "
        f"{bundled['ptxas-blackwell']} (10.0 and up); pinned ptxas {pinned_version} (aot-manifest.toml) through "
        "TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH. \"reached\" means triton.compile made PTX and a cubin "
        f"for all {len(modules)} Triton modules ({', '.join(m['name'] for m in modules)}).",
        "Triton compiles capability 9.0 and up only as the arch-specific `sm_XYa`, so those rows of the "
        "manifest's baseline targets show what the build ships instead: the `a` cubin.",
        "",
        "| target | Triton compiles it as | bundled ptxas | PTX .version (bundled) | pinned ptxas | PTX .version (pinned) | shipped |",
        "|---|---|---|---|---|---|---|",
    ]

    def summary(results):
        ok = [r for r in results if r["ok"]]
        versions = sorted({r.get("ptx_version") or "-" for r in results})
        if len(ok) == len(results):
            return "reached", ", ".join(versions)
        errors = sorted({r["error"] for r in results if not r["ok"]})
        return f"no ({len(ok)}/{len(results)}): {'; '.join(e.replace('|', '/') for e in errors)}", ", ".join(versions)

    for t in rows:
        _, cap, variant = parse_target(t)
        arch = triton_arch(cap)
        b, bv = summary([unpinned[(m["name"], cap)] for m in modules])
        p, pv = summary([pinned[(m["name"], cap)] for m in modules])
        shipped = arch + " cubin" if all(arch in m["targets"] for m in modules) else "-"
        lines.append(f"| {t} | {arch} | {b} | {bv} | {p} | {pv} | {shipped} |")
    fallback = manifest["targets"]["ptx"]
    lines += ["", f"Portable fallback: `{fallback}` is the capability-{parse_target(fallback)[1]} PTX "
              f"(`.target sm_{parse_target(fallback)[1]}`) made with the pinned ptxas, `.version` "
              f"{pinned[(modules[0]['name'], parse_target(fallback)[1])]['ptx_version']}, recorded in each "
              "module's meta.json and the registry; the dispatcher checks it against the driver like any PTX.", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare with the committed files")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    committed = ROOT / GENERATED
    if not args.check:
        # Generate beside the committed folder, then swap: a failed run leaves it as it was.
        with tempfile.TemporaryDirectory(dir=committed.parent) as d:
            fresh = Path(d) / "generated"
            generate(fresh, args.jobs)
            if committed.exists():
                shutil.rmtree(committed)
            fresh.rename(committed)
        print(f"triton-gen: wrote {GENERATED}")
        return
    with tempfile.TemporaryDirectory() as d:
        fresh = Path(d) / "generated"
        generate(fresh, args.jobs)
        want = {p.relative_to(committed): p for p in committed.rglob("*") if p.is_file()} if committed.exists() else {}
        got = {p.relative_to(fresh): p for p in fresh.rglob("*") if p.is_file()}
        differ = sorted(str(GENERATED / k) for k in set(want) | set(got)
                        if k not in want or k not in got or want[k].read_bytes() != got[k].read_bytes())
        if differ:
            print("triton-gen --check: regeneration differs from the committed files:", file=sys.stderr)
            for name in differ:
                print(f"  - {name}", file=sys.stderr)
            print("If a Triton source changed on purpose, run `make triton` and commit the result.", file=sys.stderr)
            sys.exit(1)
        print(f"triton-gen --check: {len(got)} files regenerated byte for byte identical to {GENERATED}")


if __name__ == "__main__":
    main()
