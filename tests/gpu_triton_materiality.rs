//! Is exact SASS material for the Triton kernels? On the GPU: every Triton module's cold JIT time
//! (its sm_80 PTX compiled by the driver with the JIT cache disabled), and each op's time with
//! every module as exact SASS, as PTX JIT, and with one module at a time as PTX JIT (the others
//! SASS), each timed in alternation with the all-SASS set so that a drift of the GPU over the run
//! does not pass for a kernel's cost. A benchmark, not a check; two tests beside it check that
//! its loads are the intended images. Results print as a table and go to
//! `$AOT_TRITON_MATERIALITY` (default `results/triton-materiality.json` where `results/` exists, as in
//! the GPU bundle, else `triton-materiality.json`).
//!
//! Its own test binary, so `CUDA_CACHE_DISABLE=1` is set before the driver starts (each test sets
//! it before it opens the device).

mod triton_common;

use aot_kernels::dispatch::{
    load_available, open_device, LoadedKernels, ModuleReport, ModuleSource, OpenDevice, Policy,
};
use aot_kernels::ops::gated_delta_net::{gdn_decode, gdn_prefill, GdnScratch, GdnState};
use aot_kernels::ops::moe::{moe_forward, MoeScratch, MoeWeightsHost};
use cudarc::driver::sys::CUevent_flags;
use half::bf16;
use rand::Rng;
use triton_common::*;

const REPS: usize = 20;
/// Two kernel sets are timed in alternation, this many rounds each: a drift of the GPU's state over
/// the run (clocks, temperature) then moves both alike instead of looking like one set's cost.
const ROUNDS: usize = 5;

/// Median over repeats of the per-call time of `op` in microseconds (CUDA events around 10 calls).
fn time_us(kernels: &LoadedKernels, op: &mut dyn FnMut(&LoadedKernels)) -> f64 {
    let st = kernels.stream();
    for _ in 0..3 {
        op(kernels);
    }
    st.synchronize().unwrap();
    let mut samples = Vec::new();
    for _ in 0..REPS {
        let start = st
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        for _ in 0..10 {
            op(kernels);
        }
        let end = st
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        end.synchronize().unwrap();
        samples.push(f64::from(start.elapsed_ms(&end).unwrap()) * 1000.0 / 10.0);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times `a` and `b` in alternation, [`ROUNDS`] rounds of [`time_ops`] each: per op its name and
/// the median over rounds of each set's time.
fn time_paired(a: &LoadedKernels, b: &LoadedKernels, ops: &Ops) -> Vec<(String, f64, f64)> {
    type Times = Vec<(String, f64)>;
    let mut rounds: Vec<(Times, Times)> = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push((time_ops(a, ops), time_ops(b, ops)));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (0..rounds[0].0.len())
        .map(|i| {
            (
                rounds[0].0[i].0.clone(),
                median(rounds.iter().map(|r| r.0[i].1).collect()),
                median(rounds.iter().map(|r| r.1[i].1).collect()),
            )
        })
        .collect()
}

struct Ops {
    gdn: GdnFixture,
    prefill_512: GdnBatchHost,
    moe: MoeWeightsHost,
    moe_x: Vec<bf16>,
}

const SLOTS: usize = 16;

/// Times every op on `k`: (op name, microseconds per call).
fn time_ops(kernels: &LoadedKernels, ops: &Ops) -> Vec<(String, f64)> {
    let st = kernels.stream();
    let mut conv = upload(st, &ops.gdn.conv0);
    let mut rec = upload(st, &ops.gdn.rec0);
    let mut results = Vec::new();
    for (name, batch, decode) in [
        ("gdn_decode batch 8", &ops.gdn.decode, true),
        ("gdn_prefill 1 x 512 tokens", &ops.prefill_512, false),
    ] {
        let dev = GdnDevice::new(st, &ops.gdn.params, batch);
        let (layer, seqs, inputs) = (dev.layer(), dev.seqs(), dev.inputs());
        let mut scratch = GdnScratch::new(st, &GDN, dev.n_tokens).unwrap();
        let mut out = st
            .alloc_zeros::<bf16>(dev.n_tokens * GDN.value_width())
            .unwrap();
        let run = if decode { gdn_decode } else { gdn_prefill };
        let us = time_us(kernels, &mut |kernels| {
            let mut state = GdnState {
                conv: &mut conv,
                recurrent: &mut rec,
                slots: SLOTS,
            };
            run(
                kernels,
                &GDN,
                &layer,
                &mut state,
                &seqs,
                &inputs,
                &mut scratch,
                &mut out,
            )
            .unwrap();
        });
        results.push((name.to_string(), us));
    }
    let dev = MoeDevice::new(st, &ops.moe, &ops.moe.gate_up, &ops.moe.down);
    let layer = dev.layer();
    let mut scratch = MoeScratch::new(st, &MOE, 8).unwrap();
    for tokens in [1usize, 8] {
        let x = upload(st, &ops.moe_x[..tokens * MOE.hidden]);
        let mut out = st.alloc_zeros::<bf16>(tokens * MOE.hidden).unwrap();
        let us = time_us(kernels, &mut |kernels| {
            moe_forward(kernels, &MOE, &layer, &x, tokens, &mut scratch, &mut out).unwrap()
        });
        results.push((format!("moe_forward {tokens} token(s)"), us));
    }
    results
}

/// The device, the JIT cache disabled before the driver starts (every JIT below is cold).
fn cold_device() -> OpenDevice {
    std::env::set_var("CUDA_CACHE_DISABLE", "1");
    open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"))
}

/// The Triton modules' names.
fn triton_modules() -> Vec<&'static str> {
    aot_kernels::ops::triton::records()
        .iter()
        .map(|r| r.module)
        .collect()
}

/// `registry` with module `m` stripped to its PTX (the others keep their SASS).
fn with_module_as_ptx(registry: &[ModuleSource], m: &str) -> Vec<ModuleSource> {
    registry
        .iter()
        .cloned()
        .map(|src| {
            if src.name == m {
                src.retain_images(|i| i.target.virtual_arch)
            } else {
                src
            }
        })
        .collect()
}

/// The report entry of module `m` in `kernels`.
fn module_report<'a>(kernels: &'a LoadedKernels, m: &str) -> &'a ModuleReport {
    kernels.report().module(m).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_triton_modules_load_as_sass_under_auto_and_as_ptx_jit_under_ptx_only() {
    let d = cold_device();
    let registry = ModuleSource::registry();
    let sass = load_available(&d, Policy::Auto, &registry).unwrap();
    let ptx = load_available(&d, Policy::PtxOnly, &registry).unwrap();
    for m in triton_modules() {
        let (s, p) = (module_report(&sass, m), module_report(&ptx, m));
        assert!(
            !s.jit && p.jit && p.target.virtual_arch,
            "{m}: SASS and PTX paths"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_triton_module_stripped_to_its_ptx_loads_by_jit() {
    let d = cold_device();
    let registry = ModuleSource::registry();
    for m in triton_modules() {
        let kernels = load_available(&d, Policy::Auto, &with_module_as_ptx(&registry, m)).unwrap();
        assert!(module_report(&kernels, m).jit, "{m}: loaded without JIT");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_triton_sass_versus_ptx_jit() {
    // What each load below is (SASS, PTX JIT, one module JIT) is checked by the tests above.
    let d = cold_device();
    let triton = triton_modules();
    let registry = ModuleSource::registry();
    let mut rng = rng(rand::random());
    let moe_seed: u64 = rng.gen();
    let ops = Ops {
        gdn: gdn_fixture(&mut rng, SLOTS),
        prefill_512: gdn_batch(&mut rng, &[512], &[9], &[true]),
        moe: moe_weights(&mut rng, moe_seed),
        moe_x: bf(&mut rng, 8 * MOE.hidden, 2.0),
    };

    let sass = load_available(&d, Policy::Auto, &registry).unwrap();
    let ptx = load_available(&d, Policy::PtxOnly, &registry).unwrap();
    let mut report = serde_json::Map::new();
    eprintln!("device \"{}\": {}", d.name, d.spec);
    eprintln!("\ncold JIT of each Triton module's sm_80 PTX (CUDA_CACHE_DISABLE=1) vs its exact SASS load:");
    eprintln!(
        "{:<16} {:<10} {:>12} {:>12} {:>6} {:>7}",
        "module", "sass", "sass load us", "jit load us", "regs", "spills"
    );
    let mut loads = Vec::new();
    for m in &triton {
        let (s, p) = (module_report(&sass, m), module_report(&ptx, m));
        let rec = aot_kernels::ops::triton::record(m)
            .unwrap()
            .image(s.target)
            .unwrap();
        eprintln!(
            "{:<16} {:<10} {:>12} {:>12} {:>6} {:>7}",
            m,
            s.target.to_string(),
            s.load_us,
            p.load_us,
            rec.registers.map_or("-".into(), |r| r.to_string()),
            rec.spill_store_bytes.map_or("-".into(), |r| r.to_string())
        );
        loads.push(serde_json::json!({"module": m, "sass_target": s.target.to_string(), "sass_load_us": s.load_us, "cold_jit_us": p.load_us}));
    }
    report.insert("loads".into(), loads.into());

    let paired = time_paired(&sass, &ptx, &ops);
    eprintln!("\nper call (CUDA events around 10 calls, median of {REPS}; SASS and PTX sets timed in alternation, median of {ROUNDS} rounds):");
    eprintln!(
        "{:<28} {:>10} {:>10} {:>8}",
        "op", "SASS us", "PTX us", "PTX/SASS"
    );
    let mut times = Vec::new();
    for (name, s, p) in &paired {
        eprintln!("{name:<28} {s:>10.1} {p:>10.1} {:>8.2}", p / s);
        times.push(serde_json::json!({"op": name, "sass_us": s, "ptx_us": p}));
    }
    report.insert("ops".into(), times.into());

    eprintln!("\none module at a time as PTX JIT, the rest SASS, timed in alternation with all SASS (the difference is that kernel's):");
    let mut per_module = Vec::new();
    for m in &triton {
        let kernels = load_available(&d, Policy::Auto, &with_module_as_ptx(&registry, m)).unwrap();
        for (name, s, t) in time_paired(&sass, &kernels, &ops) {
            let (s, t) = (&s, &t);
            if (t - s).abs() / s > 0.03 {
                eprintln!(
                    "  {m:<16} {name:<28} {s:>8.1} -> {t:>8.1} us ({:+.1}%)",
                    (t - s) / s * 100.0
                );
            }
            per_module.push(
                serde_json::json!({"module": m, "op": name, "sass_us": s, "with_module_jit_us": t}),
            );
        }
    }
    eprintln!("  (ops whose time moved by 3% or less are not listed)");
    report.insert("per_module".into(), per_module.into());
    // The GPU bundle's run.sh works in a folder with results/; keep the report there.
    let default = if std::path::Path::new("results").is_dir() {
        "results/triton-materiality.json"
    } else {
        "triton-materiality.json"
    };
    let path = std::env::var("AOT_TRITON_MATERIALITY").unwrap_or_else(|_| default.into());
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    eprintln!("\nwritten to {path}");
}
