//! Dispatcher tests on a real GPU (written for the H200: capability 9.0, driver CUDA 13.0).
//!
//! Every test is `#[ignore]`d, so a plain `cargo test` lists them as ignored, never as passed.
//! Run with `--include-ignored`: without a CUDA driver or device each then fails.
//! Run: `cargo test --release --test dispatch_gpu -- --include-ignored --test-threads=1 --nocapture`, or on a
//! machine without Rust, `bash scripts/gpu-bundle.sh` here and `bash .gpu-bundle/run.sh` there.

mod common;
use common::{cuda12, cuda13, ptx_with_version};

use aot_kernels::dispatch::driver::{load_image, open_device, OpenDevice};
use aot_kernels::dispatch::{
    fast_path_unavailable, load_all, load_all_from_env, load_available, load_modules, translate,
    DispatchError, ImageBytes, LoadReport, ModuleReport, ModuleSource, Policy, Reason,
    ToolchainChoice, Version, TOOLCHAIN_ENV,
};
use aot_kernels::registry::{self, ModuleKind};
use cudarc::driver::sys::CUresult;
use fatbin_verify::Target;

/// The device. These tests are `#[ignore]`d, so they only run when asked for; asked for on a
/// machine without a usable GPU they fail rather than pass without running.
fn gpu(test: &str) -> OpenDevice {
    let d =
        open_device(0).unwrap_or_else(|e| panic!("{test} needs a CUDA device and found none: {e}"));
    eprintln!("[{test}] device 0 \"{}\": {}", d.name, d.spec);
    d
}

fn exact_sass(d: &OpenDevice) -> Target {
    Target::sass(d.spec.capability.sm())
}

/// The modules of `modules` that run on this GPU under `policy`: all but the fast paths built for
/// other GPUs (and, under ptx-only, every fast path), which the loaders leave out by design.
fn servable<'a>(d: &OpenDevice, policy: Policy, modules: &'a [ModuleSource]) -> Vec<&'a str> {
    modules
        .iter()
        .filter(|m| fast_path_unavailable(&d.spec, policy, m).is_none())
        .map(|m| m.name.as_str())
        .collect()
}

/// The names of the modules a load report holds.
fn loaded(report: &LoadReport) -> Vec<&str> {
    report.modules.iter().map(|m| m.module.as_str()).collect()
}

/// The SASS a module's exact choice is on this GPU: `sm_90`, or a fast path's `sm_90a`.
fn exact_for(d: &OpenDevice, module: &str) -> Target {
    let fast = registry::module(module).is_some_and(|r| !r.portable);
    let mut t = exact_sass(d);
    if fast {
        t.variant = fatbin_verify::Variant::ArchSpecific;
    }
    t
}

fn print(report: &LoadReport) {
    eprintln!("{}", report.to_table());
}

/// The driver's own view of every entry of a module JIT-compiled from compute_80 PTX: the PTX
/// it came from is 80 and the SASS that runs is this GPU's (`sm`).
fn assert_jitted_from_compute_80(m: &ModuleReport, sm: i32) {
    for e in &m.entries {
        assert_eq!(
            (e.attributes.ptx_version, e.attributes.binary_version),
            (80, sm),
            "{}::{}",
            m.module,
            e.entry
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_exact_sass_for_every_module() {
    let d = gpu("gpu_auto_loads_exact_sass_for_every_module");
    // The newest toolchain this driver accepts: CUDA 13 on a 13.x driver, CUDA 12 below, where
    // the Triton modules (CUDA 13 only) have no image and only the CUDA modules load.
    let (newest, modules) = if d.spec.driver >= Version::new(13, 0) {
        (cuda13(), ModuleSource::registry())
    } else {
        (cuda12(), ModuleSource::registry_of_kind(ModuleKind::Cuda))
    };
    let kernels = load_available(&d, Policy::Auto, &modules).unwrap();
    print(kernels.report());
    let want = exact_sass(&d);
    let sm = d.spec.capability.sm() as i32;
    // Every module that runs here; on an sm_90 GPU that is every module, fast paths included.
    assert_eq!(
        loaded(kernels.report()),
        servable(&d, Policy::Auto, &modules)
    );
    if d.spec.capability.sm() == 90 {
        assert_eq!(kernels.report().modules.len(), modules.len());
    }
    for m in &kernels.report().modules {
        // This GPU's SASS: `sm_90`, or `sm_90a` for the Triton modules and the wgmma GEMM.
        assert!(
            m.target.sm == want.sm && !m.target.virtual_arch,
            "{}: {}",
            m.module,
            m.target
        );
        assert_eq!(m.toolchain, newest, "{}", m.module);
        assert_eq!(
            (m.reason, m.jit),
            (Reason::ExactSass, false),
            "{}",
            m.module
        );
        for e in &m.entries {
            // The driver's own view: the SASS that runs is this GPU's.
            assert_eq!(e.attributes.binary_version, sm, "{}::{}", m.module, e.entry);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_jits_compute_80_for_every_module() {
    let d = gpu("gpu_ptx_only_jits_compute_80_for_every_module");
    let registry = ModuleSource::registry();
    let kernels = load_available(&d, Policy::PtxOnly, &registry).unwrap();
    print(kernels.report());
    // Every portable module; no fast path (their PTX is no fallback).
    assert_eq!(
        loaded(kernels.report()),
        servable(&d, Policy::PtxOnly, &registry)
    );
    assert!(registry
        .iter()
        .all(|m| m.portable == loaded(kernels.report()).contains(&m.name.as_str())));
    let sm = d.spec.capability.sm() as i32;
    for m in &kernels.report().modules {
        assert_eq!(m.target, Target::ptx(80), "{}", m.module);
        assert_eq!(m.toolchain, cuda13(), "{}: the newest PTX", m.module);
        assert!(
            m.jit && matches!(m.reason, Reason::PtxJit { forced: true, .. }),
            "{}",
            m.module
        );
        assert_jitted_from_compute_80(m, sm);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_falls_back_to_ptx_by_itself() {
    let d = gpu("gpu_registry_without_this_gpus_sass_falls_back_to_ptx_by_itself");
    let major = d.spec.capability.major;
    // As a build without any SASS of this major (for the H200: without sm_90) would carry.
    let modules: Vec<_> = ModuleSource::registry()
        .into_iter()
        .map(|m| m.retain_images(|i| i.target.virtual_arch || i.target.capability().0 != major))
        .collect();
    let kernels = load_available(&d, Policy::Auto, &modules).unwrap();
    print(kernels.report());
    // The fast paths lose their only SASS with this GPU's: they are left out, never JIT'd.
    assert_eq!(
        loaded(kernels.report()),
        servable(&d, Policy::Auto, &modules)
    );
    assert!(modules
        .iter()
        .all(|m| m.portable == loaded(kernels.report()).contains(&m.name.as_str())));
    for m in &kernels.report().modules {
        assert_eq!(m.target, Target::ptx(80), "{}", m.module);
        assert!(
            matches!(m.reason, Reason::PtxJit { forced: false, .. }),
            "{}",
            m.module
        );
        assert!(m.entries.iter().all(|e| e.attributes.ptx_version == 80));
    }
    // sass-only refuses the same registry instead of JIT-compiling.
    let err = load_available(&d, Policy::SassOnly, &modules).unwrap_err();
    assert!(matches!(err, DispatchError::NoImage { .. }), "{err}");
    eprintln!("sass-only on that registry: {err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_newer_than_the_driver_is_refused_by_our_check_and_by_the_driver() {
    let d = gpu("gpu_ptx_newer_than_the_driver_is_refused_by_our_check_and_by_the_driver");
    // One ISA past what this driver knows (9.1 on the H200's 13.0 driver), and one past any we know.
    let next = match aot_kernels::dispatch::select::max_ptx_isa_for_driver(d.spec.driver) {
        Some((9, 0)) => "9.1",
        _ => "9.9",
    };
    for isa in [next, "9.9"] {
        let (m, bytes) = ptx_with_version("activation", isa);
        // Our check: refused before any driver call.
        let err = load_modules(&d, 0, Policy::PtxOnly, std::slice::from_ref(&m)).unwrap_err();
        assert!(matches!(err, DispatchError::NoImage { .. }), "{err}");
        eprintln!("ISA {isa}, our check: {err}");
        // The driver, handed the same bytes directly.
        let raw = load_image(&d.ctx, &bytes, true)
            .expect_err("the driver accepted PTX newer than it knows");
        let failure = translate(raw);
        eprintln!("ISA {isa}, the driver: {failure}");
        if isa == next {
            assert_eq!(
                raw.0,
                CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
                "{failure}"
            );
            assert!(
                failure.fix.contains("update the NVIDIA driver"),
                "{failure}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_tampered_image_is_refused_before_loading() {
    let d = gpu("gpu_tampered_image_is_refused_before_loading");
    let want = exact_sass(&d);
    let mut m = ModuleSource::from_record(registry::module("rmsnorm").unwrap())
        .with_toolchains(ToolchainChoice::Major(cuda13().major));
    let img = m.images.iter_mut().find(|i| i.target == want).unwrap();
    let mut bytes = img.bytes.as_slice().to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x80;
    img.bytes = ImageBytes::Owned(bytes);
    match load_modules(&d, 0, Policy::Auto, &[m]) {
        Err(DispatchError::Tampered(e)) => {
            assert_eq!((e.module.as_str(), e.target), ("rmsnorm", want));
            eprintln!("{e}");
        }
        other => panic!("expected a hash refusal, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_cubin_for_another_major_gives_translated_no_binary_for_gpu() {
    let d = gpu("gpu_cubin_for_another_major_gives_translated_no_binary_for_gpu");
    let rec = registry::module("rotary").unwrap();
    let other = rec
        .images
        .iter()
        .find(|i| !i.target.virtual_arch && i.target.capability().0 != d.spec.capability.major);
    let other = other.expect("the full registry has cubins of other majors (sm_80 ... sm_121)");
    // Straight to the driver, bypassing selection, to see its error and our translation.
    let err =
        load_image(&d.ctx, other.bytes(), false).expect_err("a cubin of another major loaded");
    let failure = translate(err);
    eprintln!("{} on {}: {failure}", other.target, d.spec);
    assert_eq!(err.0, CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU);
    assert_eq!(failure.code, "CUDA_ERROR_NO_BINARY_FOR_GPU");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_functions_are_handed_out_by_module_and_entry() {
    gpu("gpu_functions_are_handed_out_by_module_and_entry");
    let kernels = load_all(Policy::Auto).unwrap();
    let d = kernels.device();
    for m in registry::modules() {
        let src = ModuleSource::from_record(m);
        if let Some(why) = fast_path_unavailable(d, Policy::Auto, &src) {
            // A fast path for other GPUs: not loaded, and asking for it says so.
            eprintln!("{}: {why}", m.name);
            assert!(
                kernels.function(m.name, m.entries[0]).is_err(),
                "{}",
                m.name
            );
            continue;
        }
        for e in m.entries {
            let f = kernels.function(m.name, e).unwrap();
            assert!(f.num_regs().unwrap() > 0, "{}::{e}", m.name);
        }
    }
    let err = kernels.function("rmsnorm", "no_such_entry").unwrap_err();
    assert!(err.to_string().contains("rmsnorm_bf16"), "{err}");
    let err = kernels.function("no_such_module", "x").unwrap_err();
    assert!(err.to_string().contains("activation"), "{err}");
    assert_eq!(
        kernels.device().capability,
        kernels.report().device.capability
    );
    assert!(kernels.stream().context() == kernels.context());
    // Second load in this process: registry hashes come from the cache.
    let again = load_all(Policy::Auto).unwrap();
    assert!(again
        .report()
        .modules
        .iter()
        .all(|m| m.hash_cached && m.hash_us == 0));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_load_times_sass_and_jit() {
    let d = gpu("gpu_load_times_sass_and_jit");
    // Measures, does not assert. The JIT figure is cold only if nothing in this process or the
    // driver's cache (CUDA_CACHE_PATH) compiled these PTX images before: run.sh measures the
    // cold figure separately with CUDA_CACHE_DISABLE=1.
    let sass = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let ptx = load_available(&d, Policy::PtxOnly, &ModuleSource::registry()).unwrap();
    eprintln!(
        "MEASURED: SASS load of {} modules {} us; PTX load (JIT, cache state unknown) {} us; hash {} us",
        sass.report().modules.len(),
        sass.report().total_load_us(),
        ptx.report().total_load_us(),
        sass.report().total_hash_us() + ptx.report().total_hash_us()
    );
}

/// The CUDA modules limited to the CUDA 12 images: what an r525..r575 driver would be offered
/// (the Triton modules have none: they are built with CUDA 13 only).
fn cuda12_registry() -> Vec<ModuleSource> {
    let modules: Vec<_> = ModuleSource::registry_of_kind(ModuleKind::Cuda)
        .into_iter()
        .map(|m| m.with_toolchains(ToolchainChoice::Major(12)))
        .collect();
    assert!(
        modules
            .iter()
            .all(|m| !m.images.is_empty() && m.images.iter().all(|i| i.toolchain == cuda12())),
        "the registry carries CUDA 12 images for every CUDA module"
    );
    modules
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_loads_cuda12_sass_for_every_module() {
    let d = gpu("gpu_forced_cuda12_loads_cuda12_sass_for_every_module");
    let modules = cuda12_registry();
    let kernels = load_available(&d, Policy::Auto, &modules).unwrap();
    print(kernels.report());
    let sm = d.spec.capability.sm() as i32;
    assert_eq!(
        loaded(kernels.report()),
        servable(&d, Policy::Auto, &modules)
    );
    for m in &kernels.report().modules {
        // This GPU's SASS: `sm_90`, or `sm_90a` for the wgmma GEMM.
        assert_eq!(
            (m.target, m.toolchain, m.reason, m.jit),
            (exact_for(&d, &m.module), cuda12(), Reason::ExactSass, false),
            "{}",
            m.module
        );
        assert_eq!(m.min_driver, Version::new(12, 0), "{}", m.module);
        for e in &m.entries {
            // The driver loaded the CUDA 12 cubin (ELF ABI 7) as this GPU's SASS, no JIT.
            assert_eq!(e.attributes.binary_version, sm, "{}::{}", m.module, e.entry);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_ptx_jits_isa_8_8_for_every_module() {
    let d = gpu("gpu_forced_cuda12_ptx_jits_isa_8_8_for_every_module");
    let kernels = load_available(&d, Policy::PtxOnly, &cuda12_registry()).unwrap();
    print(kernels.report());
    let sm = d.spec.capability.sm() as i32;
    for m in &kernels.report().modules {
        assert_eq!(
            (m.target, m.toolchain),
            (Target::ptx(80), cuda12()),
            "{}",
            m.module
        );
        assert_eq!(
            m.reason,
            Reason::PtxJit {
                isa: (8, 8),
                min_driver: Version::new(12, 9),
                forced: true
            },
            "{}",
            m.module
        );
        assert_jitted_from_compute_80(m, sm);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_toolchain_environment_switch_forces_cuda12() {
    gpu("gpu_toolchain_environment_switch_forces_cuda12");
    // run.sh runs tests one at a time (--test-threads=1): the variable is this test's alone.
    std::env::set_var(TOOLCHAIN_ENV, "cuda12");
    let forced = load_all_from_env();
    std::env::set_var(TOOLCHAIN_ENV, "cuda99");
    let bogus = load_all_from_env();
    std::env::remove_var(TOOLCHAIN_ENV);
    let kernels = forced.unwrap();
    print(kernels.report());
    assert!(kernels
        .report()
        .modules
        .iter()
        .all(|m| m.toolchain == cuda12()));
    // Every CUDA module loaded; the Triton modules (no CUDA 12 images) were left out.
    let loaded: Vec<&str> = kernels
        .report()
        .modules
        .iter()
        .map(|m| m.module.as_str())
        .collect();
    // (and any fast path built for other GPUs).
    let d = kernels.device();
    let cuda: Vec<&str> = registry::modules()
        .iter()
        .filter(|m| m.kind == ModuleKind::Cuda)
        .filter(|m| fast_path_unavailable(d, Policy::Auto, &ModuleSource::from_record(m)).is_none())
        .map(|m| m.name)
        .collect();
    assert_eq!(loaded, cuda);
    // A major the registry has no images of: every module errs, naming what is there.
    let err = bogus.unwrap_err();
    assert!(
        matches!(err, DispatchError::NoImage { .. }) && err.to_string().contains("present [none]"),
        "{err}"
    );
}
