//! Dispatcher tests on a real GPU (written for the H200: capability 9.0, driver CUDA 13.0).
//!
//! Every test is `#[ignore]`d, so a plain `cargo test` lists them as ignored, never as passed.
//! One claim a test: each load that several claims check is made once per binary and shared.
//! Run with `--include-ignored`: without a CUDA driver or device each then fails.
//! Run: `cargo test --release --test dispatch_gpu -- --include-ignored --test-threads=1 --nocapture`, or on a
//! machine without Rust, `bash scripts/gpu-bundle.sh` here and `bash .gpu-bundle/run.sh` there.

mod common;
use common::{cuda12, cuda13, ptx_with_version};

use aot_kernels::dispatch::driver::{load_image, open_device, OpenDevice};
use aot_kernels::dispatch::DriverFailure;
use aot_kernels::dispatch::{
    fast_path_unavailable, load_all, load_all_from_env, load_available, load_modules, translate,
    DeviceSpec, DispatchError, ImageBytes, LoadReport, ModuleReport, ModuleSource, Policy, Reason,
    ToolchainChoice, Version, TOOLCHAIN_ENV,
};
use aot_kernels::registry::{self, ModuleKind};
use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use fatbin_verify::{CudaRelease, Target};
use std::sync::OnceLock;

/// The device. These tests are `#[ignore]`d, so they only run when asked for; asked for on a
/// machine without a usable GPU they fail rather than pass without running.
fn gpu(test: &str) -> OpenDevice {
    let d =
        open_device(0).unwrap_or_else(|e| panic!("{test} needs a CUDA device and found none: {e}"));
    eprintln!("[{test}] device 0 \"{}\": {}", d.name, d.spec);
    d
}

fn exact_sass(spec: &DeviceSpec) -> Target {
    Target::sass(spec.capability.sm())
}

/// The modules of `modules` that run on this GPU under `policy`: all but the fast paths built for
/// other GPUs (and, under ptx-only, every fast path), which the loaders leave out by design.
fn servable(spec: &DeviceSpec, policy: Policy, modules: &[ModuleSource]) -> Vec<String> {
    modules
        .iter()
        .filter(|m| fast_path_unavailable(spec, policy, m).is_none())
        .map(|m| m.name.clone())
        .collect()
}

/// The names of the modules a load report holds.
fn loaded(report: &LoadReport) -> Vec<String> {
    report.modules.iter().map(|m| m.module.clone()).collect()
}

/// The SASS a module's exact choice is on this GPU: `sm_90`, or a fast path's `sm_90a`.
fn exact_for(spec: &DeviceSpec, module: &str) -> Target {
    let fast = registry::module(module).is_some_and(|r| !r.portable);
    let mut t = exact_sass(spec);
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

/// One load's report, the modules it was offered (name, portable), and those of them that run on
/// this GPU under its policy.
struct Load {
    report: LoadReport,
    offered: Vec<(String, bool)>,
    servable: Vec<String>,
}

impl Load {
    fn new(d: &OpenDevice, policy: Policy, modules: &[ModuleSource]) -> Load {
        let kernels = load_available(d, policy, modules).unwrap();
        print(kernels.report());
        Load {
            report: kernels.report().clone(),
            offered: modules
                .iter()
                .map(|m| (m.name.clone(), m.portable))
                .collect(),
            servable: servable(&d.spec, policy, modules),
        }
    }

    fn spec(&self) -> &DeviceSpec {
        &self.report.device
    }

    fn sm(&self) -> i32 {
        self.spec().capability.sm() as i32
    }

    fn modules(&self) -> &[ModuleReport] {
        &self.report.modules
    }

    /// The driver's own view: the SASS that runs is this GPU's, in every entry.
    fn assert_runs_this_gpus_sass(&self) {
        for m in self.modules() {
            for e in &m.entries {
                assert_eq!(
                    e.attributes.binary_version,
                    self.sm(),
                    "{}::{}",
                    m.module,
                    e.entry
                );
            }
        }
    }

    /// Whether the modules loaded are exactly the portable ones offered.
    fn loaded_exactly_the_portable_modules(&self) -> bool {
        let loaded = loaded(&self.report);
        self.offered
            .iter()
            .all(|(name, portable)| *portable == loaded.contains(name))
    }
}

/// The registry under `auto` with the newest toolchain this driver accepts (CUDA 13 on a 13.x
/// driver, CUDA 12 below, where the Triton modules, CUDA 13 only, have no image and only the
/// CUDA modules load), and that toolchain; loaded once per binary.
fn auto_load() -> &'static (Load, CudaRelease) {
    static LOAD: OnceLock<(Load, CudaRelease)> = OnceLock::new();
    LOAD.get_or_init(|| {
        let d = gpu("the auto load");
        let (newest, modules) = if d.spec.driver >= Version::new(13, 0) {
            (cuda13(), ModuleSource::registry())
        } else {
            (cuda12(), ModuleSource::registry_of_kind(ModuleKind::Cuda))
        };
        (Load::new(&d, Policy::Auto, &modules), newest)
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_every_module_that_runs_here() {
    let (load, _) = auto_load();
    assert_eq!(loaded(&load.report), load.servable);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_every_module_fast_paths_included_on_an_sm_90_gpu() {
    let (load, _) = auto_load();
    if load.spec().capability.sm() == 90 {
        assert_eq!(load.modules().len(), load.offered.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_this_gpus_sass_for_every_module() {
    let (load, _) = auto_load();
    let want = exact_sass(load.spec());
    for m in load.modules() {
        // This GPU's SASS: `sm_90`, or `sm_90a` for the Triton modules and the wgmma GEMM.
        assert!(
            m.target.sm == want.sm && !m.target.virtual_arch,
            "{}: {}",
            m.module,
            m.target
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_the_newest_toolchain_the_driver_accepts() {
    let (load, newest) = auto_load();
    for m in load.modules() {
        assert_eq!(m.toolchain, *newest, "{}", m.module);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_loads_exact_sass_without_jit() {
    let (load, _) = auto_load();
    for m in load.modules() {
        assert_eq!(
            (m.reason, m.jit),
            (Reason::ExactSass, false),
            "{}",
            m.module
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_auto_runs_this_gpus_sass_by_the_drivers_account() {
    auto_load().0.assert_runs_this_gpus_sass();
}

/// The registry under `ptx-only`, loaded once per binary.
fn ptx_only_load() -> &'static Load {
    static LOAD: OnceLock<Load> = OnceLock::new();
    LOAD.get_or_init(|| {
        let d = gpu("the ptx-only load");
        Load::new(&d, Policy::PtxOnly, &ModuleSource::registry())
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_loads_every_module_that_runs_here() {
    let load = ptx_only_load();
    assert_eq!(loaded(&load.report), load.servable);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_loads_every_portable_module_and_no_fast_path() {
    // A fast path's PTX is no fallback.
    assert!(ptx_only_load().loaded_exactly_the_portable_modules());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_loads_compute_80_ptx_for_every_module() {
    for m in ptx_only_load().modules() {
        assert_eq!(m.target, Target::ptx(80), "{}", m.module);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_loads_the_newest_ptx() {
    for m in ptx_only_load().modules() {
        assert_eq!(m.toolchain, cuda13(), "{}: the newest PTX", m.module);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_jits_every_module_by_force() {
    for m in ptx_only_load().modules() {
        assert!(
            m.jit && matches!(m.reason, Reason::PtxJit { forced: true, .. }),
            "{}",
            m.module
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_only_runs_code_jitted_from_compute_80_by_the_drivers_account() {
    let load = ptx_only_load();
    for m in load.modules() {
        assert_jitted_from_compute_80(m, load.sm());
    }
}

/// The registry as a build without any SASS of this GPU's major (for the H200: without sm_90)
/// would carry.
fn without_this_gpus_sass(d: &OpenDevice) -> Vec<ModuleSource> {
    let major = d.spec.capability.major;
    ModuleSource::registry()
        .into_iter()
        .map(|m| m.retain_images(|i| i.target.virtual_arch || i.target.capability().0 != major))
        .collect()
}

/// [`without_this_gpus_sass`] under `auto`, loaded once per binary.
fn no_sass_load() -> &'static Load {
    static LOAD: OnceLock<Load> = OnceLock::new();
    LOAD.get_or_init(|| {
        let d = gpu("the load of a registry without this GPU's SASS");
        Load::new(&d, Policy::Auto, &without_this_gpus_sass(&d))
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_loads_every_module_that_runs_here() {
    let load = no_sass_load();
    assert_eq!(loaded(&load.report), load.servable);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_leaves_out_the_fast_paths() {
    // The fast paths lose their only SASS with this GPU's: they are left out, never JIT'd.
    assert!(no_sass_load().loaded_exactly_the_portable_modules());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_loads_compute_80_ptx() {
    for m in no_sass_load().modules() {
        assert_eq!(m.target, Target::ptx(80), "{}", m.module);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_falls_back_to_ptx_by_itself() {
    for m in no_sass_load().modules() {
        assert!(
            matches!(m.reason, Reason::PtxJit { forced: false, .. }),
            "{}",
            m.module
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_registry_without_this_gpus_sass_runs_code_from_ptx_80_by_the_drivers_account() {
    for m in no_sass_load().modules() {
        assert!(m.entries.iter().all(|e| e.attributes.ptx_version == 80));
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_sass_only_refuses_a_registry_without_this_gpus_sass() {
    let d = gpu("gpu_sass_only_refuses_a_registry_without_this_gpus_sass");
    // sass-only refuses it instead of JIT-compiling.
    let err = load_available(&d, Policy::SassOnly, &without_this_gpus_sass(&d)).unwrap_err();
    assert!(matches!(err, DispatchError::NoImage { .. }), "{err}");
    eprintln!("sass-only on that registry: {err}");
}

/// The PTX ISAs past what this driver knows: the next one (9.1 on the H200's 13.0 driver), and
/// one past any we know.
fn isas_past_the_driver(d: &OpenDevice) -> [&'static str; 2] {
    let next = match aot_kernels::dispatch::select::max_ptx_isa_for_driver(d.spec.driver) {
        Some((9, 0)) => "9.1",
        _ => "9.9",
    };
    [next, "9.9"]
}

/// The driver's error, and our translation of it, for an `activation` PTX of `isa` handed to it
/// directly.
fn driver_refusal_of_ptx(d: &OpenDevice, isa: &str) -> (DriverError, DriverFailure) {
    let (_, bytes) = ptx_with_version("activation", isa);
    let raw =
        load_image(&d.ctx, &bytes, true).expect_err("the driver accepted PTX newer than it knows");
    let failure = translate(raw);
    eprintln!("ISA {isa}, the driver: {failure}");
    (raw, failure)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_newer_than_the_driver_is_refused_by_our_check() {
    let d = gpu("gpu_ptx_newer_than_the_driver_is_refused_by_our_check");
    for isa in isas_past_the_driver(&d) {
        let (m, _) = ptx_with_version("activation", isa);
        // Refused before any driver call.
        let err = load_modules(&d, 0, Policy::PtxOnly, std::slice::from_ref(&m)).unwrap_err();
        assert!(matches!(err, DispatchError::NoImage { .. }), "{err}");
        eprintln!("ISA {isa}, our check: {err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_newer_than_the_driver_is_refused_by_the_driver() {
    let d = gpu("gpu_ptx_newer_than_the_driver_is_refused_by_the_driver");
    for isa in isas_past_the_driver(&d) {
        // `driver_refusal_of_ptx` fails if the driver accepts it.
        driver_refusal_of_ptx(&d, isa);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_one_isa_past_the_driver_gets_unsupported_ptx_version() {
    let d = gpu("gpu_ptx_one_isa_past_the_driver_gets_unsupported_ptx_version");
    let (raw, failure) = driver_refusal_of_ptx(&d, isas_past_the_driver(&d)[0]);
    assert_eq!(
        raw.0,
        CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        "{failure}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_ptx_one_isa_past_the_driver_is_translated_to_update_the_driver() {
    let d = gpu("gpu_ptx_one_isa_past_the_driver_is_translated_to_update_the_driver");
    let (_, failure) = driver_refusal_of_ptx(&d, isas_past_the_driver(&d)[0]);
    assert!(
        failure.fix.contains("update the NVIDIA driver"),
        "{failure}"
    );
}

/// The refusal of `rmsnorm` with one bit of its exact SASS flipped, and that image's target.
fn tampered_refusal(d: &OpenDevice) -> (DispatchError, Target) {
    let want = exact_sass(&d.spec);
    let mut m = ModuleSource::from_record(registry::module("rmsnorm").unwrap())
        .with_toolchains(ToolchainChoice::Major(cuda13().major));
    let img = m.images.iter_mut().find(|i| i.target == want).unwrap();
    let mut bytes = img.bytes.as_slice().to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x80;
    img.bytes = ImageBytes::Owned(bytes);
    match load_modules(d, 0, Policy::Auto, &[m]) {
        Err(e) => (e, want),
        Ok(other) => panic!("expected a hash refusal, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_tampered_image_is_refused_by_its_hash_before_loading() {
    let d = gpu("gpu_tampered_image_is_refused_by_its_hash_before_loading");
    let (err, _) = tampered_refusal(&d);
    assert!(
        matches!(err, DispatchError::Tampered(_)),
        "expected a hash refusal, got {err:?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_tampered_image_refusal_names_the_module_and_target() {
    let d = gpu("gpu_tampered_image_refusal_names_the_module_and_target");
    match tampered_refusal(&d) {
        (DispatchError::Tampered(e), want) => {
            assert_eq!((e.module.as_str(), e.target), ("rmsnorm", want));
            eprintln!("{e}");
        }
        (other, _) => panic!("expected a hash refusal, got {other:?}"),
    }
}

/// A `rotary` cubin of another major handed straight to the driver, bypassing selection: the
/// driver's error and our translation.
fn another_majors_cubin_refusal(d: &OpenDevice) -> (DriverError, DriverFailure) {
    let rec = registry::module("rotary").unwrap();
    let other = rec
        .images
        .iter()
        .find(|i| !i.target.virtual_arch && i.target.capability().0 != d.spec.capability.major);
    let other = other.expect("the full registry has cubins of other majors (sm_80 ... sm_121)");
    let err =
        load_image(&d.ctx, other.bytes(), false).expect_err("a cubin of another major loaded");
    let failure = translate(err);
    eprintln!("{} on {}: {failure}", other.target, d.spec);
    (err, failure)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_cubin_for_another_major_gets_no_binary_for_gpu_from_the_driver() {
    let d = gpu("gpu_cubin_for_another_major_gets_no_binary_for_gpu_from_the_driver");
    let (err, _) = another_majors_cubin_refusal(&d);
    assert_eq!(err.0, CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_cubin_for_another_major_is_translated_to_no_binary_for_gpu() {
    let d = gpu("gpu_cubin_for_another_major_is_translated_to_no_binary_for_gpu");
    let (_, failure) = another_majors_cubin_refusal(&d);
    assert_eq!(failure.code, "CUDA_ERROR_NO_BINARY_FOR_GPU");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_fast_paths_for_other_gpus_are_refused_by_name() {
    gpu("gpu_fast_paths_for_other_gpus_are_refused_by_name");
    let kernels = load_all(Policy::Auto).unwrap();
    for m in registry::modules() {
        let src = ModuleSource::from_record(m);
        if let Some(why) = fast_path_unavailable(kernels.device(), Policy::Auto, &src) {
            // A fast path for other GPUs: not loaded, and asking for it says so.
            eprintln!("{}: {why}", m.name);
            assert!(
                kernels.function(m.name, m.entries[0]).is_err(),
                "{}",
                m.name
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_functions_are_handed_out_by_module_and_entry() {
    gpu("gpu_functions_are_handed_out_by_module_and_entry");
    let kernels = load_all(Policy::Auto).unwrap();
    for m in registry::modules() {
        let src = ModuleSource::from_record(m);
        if fast_path_unavailable(kernels.device(), Policy::Auto, &src).is_some() {
            continue;
        }
        for e in m.entries {
            let f = kernels.function(m.name, e).unwrap();
            assert!(f.num_regs().unwrap() > 0, "{}::{e}", m.name);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_an_unknown_entry_is_refused_naming_the_modules_entries() {
    gpu("gpu_an_unknown_entry_is_refused_naming_the_modules_entries");
    let kernels = load_all(Policy::Auto).unwrap();
    let err = kernels.function("rmsnorm", "no_such_entry").unwrap_err();
    assert!(err.to_string().contains("rmsnorm_bf16"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_an_unknown_module_is_refused_naming_the_modules() {
    gpu("gpu_an_unknown_module_is_refused_naming_the_modules");
    let kernels = load_all(Policy::Auto).unwrap();
    let err = kernels.function("no_such_module", "x").unwrap_err();
    assert!(err.to_string().contains("activation"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_loaded_kernels_report_the_devices_capability() {
    gpu("gpu_loaded_kernels_report_the_devices_capability");
    let kernels = load_all(Policy::Auto).unwrap();
    assert_eq!(
        kernels.device().capability,
        kernels.report().device.capability
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_loaded_kernels_stream_is_in_their_context() {
    gpu("gpu_loaded_kernels_stream_is_in_their_context");
    let kernels = load_all(Policy::Auto).unwrap();
    assert!(kernels.stream().context() == kernels.context());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_a_second_load_takes_the_registry_hashes_from_the_cache() {
    gpu("gpu_a_second_load_takes_the_registry_hashes_from_the_cache");
    let _first = load_all(Policy::Auto).unwrap();
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
#[ignore = "needs the GPU run's registry: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn registry_carries_cuda12_images_for_every_cuda_module() {
    // `cuda12_registry` checks it.
    cuda12_registry();
}

/// [`cuda12_registry`] under `auto`, loaded once per binary.
fn cuda12_load() -> &'static Load {
    static LOAD: OnceLock<Load> = OnceLock::new();
    LOAD.get_or_init(|| {
        let d = gpu("the forced CUDA 12 load");
        Load::new(&d, Policy::Auto, &cuda12_registry())
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_loads_every_module_that_runs_here() {
    let load = cuda12_load();
    assert_eq!(loaded(&load.report), load.servable);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_loads_this_gpus_cuda12_sass_without_jit() {
    let load = cuda12_load();
    for m in load.modules() {
        // This GPU's SASS: `sm_90`, or `sm_90a` for the wgmma GEMM.
        assert_eq!(
            (m.target, m.toolchain, m.reason, m.jit),
            (
                exact_for(load.spec(), &m.module),
                cuda12(),
                Reason::ExactSass,
                false
            ),
            "{}",
            m.module
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_modules_need_driver_12_0() {
    for m in cuda12_load().modules() {
        assert_eq!(m.min_driver, Version::new(12, 0), "{}", m.module);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_runs_this_gpus_sass_by_the_drivers_account() {
    // The driver loaded the CUDA 12 cubin (ELF ABI 7) as this GPU's SASS, no JIT.
    cuda12_load().assert_runs_this_gpus_sass();
}

/// [`cuda12_registry`] under `ptx-only`, loaded once per binary.
fn cuda12_ptx_load() -> &'static Load {
    static LOAD: OnceLock<Load> = OnceLock::new();
    LOAD.get_or_init(|| {
        let d = gpu("the forced CUDA 12 ptx-only load");
        Load::new(&d, Policy::PtxOnly, &cuda12_registry())
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_ptx_only_loads_cuda12_compute_80_ptx() {
    for m in cuda12_ptx_load().modules() {
        assert_eq!(
            (m.target, m.toolchain),
            (Target::ptx(80), cuda12()),
            "{}",
            m.module
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_ptx_jits_isa_8_8_for_every_module() {
    for m in cuda12_ptx_load().modules() {
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
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_forced_cuda12_ptx_runs_code_jitted_from_compute_80_by_the_drivers_account() {
    let load = cuda12_ptx_load();
    for m in load.modules() {
        assert_jitted_from_compute_80(m, load.sm());
    }
}

/// What `load_all_from_env` did with the toolchain variable at `cuda12` (its report, and the CUDA
/// modules that run on its device) and at `cuda99` (whether it refused with `NoImage`, and the
/// refusal); run once per binary.
struct EnvLoads {
    cuda12: LoadReport,
    cuda_modules: Vec<String>,
    cuda99: Option<(bool, String)>,
}

fn env_loads() -> &'static EnvLoads {
    static LOADS: OnceLock<EnvLoads> = OnceLock::new();
    LOADS.get_or_init(|| {
        gpu("the loads under the toolchain variable");
        // run.sh runs tests one at a time (--test-threads=1): the variable is this load's alone.
        std::env::set_var(TOOLCHAIN_ENV, "cuda12");
        let forced = load_all_from_env();
        std::env::set_var(TOOLCHAIN_ENV, "cuda99");
        let bogus = load_all_from_env();
        std::env::remove_var(TOOLCHAIN_ENV);
        let kernels = forced.unwrap();
        print(kernels.report());
        // Every CUDA module (and no fast path built for other GPUs).
        let d = kernels.device();
        let cuda_modules = registry::modules()
            .iter()
            .filter(|m| m.kind == ModuleKind::Cuda)
            .filter(|m| {
                fast_path_unavailable(d, Policy::Auto, &ModuleSource::from_record(m)).is_none()
            })
            .map(|m| m.name.to_string())
            .collect();
        EnvLoads {
            cuda12: kernels.report().clone(),
            cuda_modules,
            cuda99: bogus
                .err()
                .map(|e| (matches!(e, DispatchError::NoImage { .. }), e.to_string())),
        }
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_toolchain_environment_switch_forces_cuda12() {
    assert!(env_loads()
        .cuda12
        .modules
        .iter()
        .all(|m| m.toolchain == cuda12()));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_toolchain_environment_switch_to_cuda12_loads_every_cuda_module_and_no_triton_module() {
    // The Triton modules have no CUDA 12 images.
    let loads = env_loads();
    assert_eq!(loaded(&loads.cuda12), loads.cuda_modules);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (scripts/gpu-bundle.sh does)"]
fn gpu_toolchain_environment_switch_to_a_major_without_images_is_refused_naming_what_is_there() {
    // Every module errs, naming what is there.
    let (no_image, err) = env_loads()
        .cuda99
        .as_ref()
        .expect("the registry has no CUDA 99 images, yet the load succeeded");
    assert!(*no_image && err.contains("present [none]"), "{err}");
}
