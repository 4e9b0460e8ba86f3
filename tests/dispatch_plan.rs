//! Simulated dispatch plans against the registry this crate embeds, and every check that runs
//! before the driver sees an image (hash, PTX `.version`). No GPU needed (CI).

mod common;
use common::{altered, cuda12, cuda13, ptx_with_version};

use aot_kernels::dispatch::source::parse_ptx_version;
use aot_kernels::dispatch::{
    check_module, oldest_driver_for_all, oldest_driver_for_plan, plan, verify_image, DeviceSpec,
    DispatchError, ModuleSource, Policy, Reason, ToolchainChoice, Version,
};
use aot_kernels::registry::{self, ModuleKind};
use fatbin_verify::Target;

fn dev(cap: &str, integrated: bool, driver: &str) -> DeviceSpec {
    DeviceSpec {
        capability: cap.parse().unwrap(),
        integrated,
        driver: driver.parse().unwrap(),
    }
}

/// The registry's portable modules (every one but the fast paths built for some GPUs only, which
/// `fast_path_modules_run_only_as_their_own_sass` covers); a build that left out a target the test
/// needs (`AOT_TARGETS`) cannot show the full plan, so the test fails rather than pass without
/// checking. A target names its architecture: `sm_90` is met by a Triton module's `sm_90a` too.
fn registry_with(targets: &[&str]) -> Vec<ModuleSource> {
    let modules: Vec<ModuleSource> = ModuleSource::registry()
        .into_iter()
        .filter(|m| m.portable)
        .collect();
    assert!(!modules.is_empty(), "the registry has no modules");
    assert!(
        modules.iter().any(|m| is_triton(&m.name)) && modules.iter().any(|m| !is_triton(&m.name)),
        "the registry has both CUDA and Triton modules"
    );
    for m in &modules {
        for t in targets {
            let t: Target = t.parse().unwrap();
            if !m.images.iter().any(|i| same_arch(i.target, t)) {
                panic!(
                    "module {} has no {t} image (AOT_TARGETS={:?}); build without AOT_TARGETS to run this test",
                    m.name,
                    registry::build_info().target_filter
                );
            }
        }
    }
    modules
}

/// Same architecture and kind (SASS or PTX), any variant: Triton builds `sm_90a` where nvcc builds `sm_90`.
fn same_arch(a: Target, b: Target) -> bool {
    a.sm == b.sm && a.virtual_arch == b.virtual_arch
}

fn is_triton(module: &str) -> bool {
    registry::module(module).is_some_and(|m| m.kind == ModuleKind::Triton)
}

/// Per module: `Some("sm_87@12.9")` (target and toolchain of the choice) or `None` (an error).
fn chosen(p: &aot_kernels::dispatch::Plan) -> Vec<(String, Option<String>)> {
    p.modules
        .iter()
        .map(|m| {
            (
                m.module.clone(),
                m.choice
                    .as_ref()
                    .map(|c| format!("{}@{}", c.target, c.toolchain)),
            )
        })
        .collect()
}

/// `sm_90a@13.0` -> `sm_90@13.0`: the architecture, whatever the variant.
fn arch_of(choice: &str) -> String {
    let (target, toolchain) = choice.split_once('@').unwrap();
    let t: Target = target.parse().unwrap();
    let base = if t.virtual_arch {
        Target::ptx(t.sm)
    } else {
        Target::sass(t.sm)
    };
    format!("{base}@{toolchain}")
}

/// Every module chose `want` (`sm_87@12.9`; a Triton module's `sm_87`/`sm_90a` counts as its arch).
fn assert_all(p: &aot_kernels::dispatch::Plan, want: &str) {
    assert!(!p.has_errors(), "{}", p.to_table());
    assert_eq!(p.unavailable().count(), 0, "{}", p.to_table());
    for (module, target) in chosen(p) {
        assert_eq!(
            target.as_deref().map(arch_of).as_deref(),
            Some(want),
            "{module}\n{}",
            p.to_table()
        );
    }
}

/// The CUDA modules chose `want`; every Triton module (CUDA 13 only) is unavailable, not an
/// error, and says why: each reason contains every one of `why`.
fn assert_cuda_and_triton_unavailable(p: &aot_kernels::dispatch::Plan, want: &str, why: &[&str]) {
    assert!(!p.has_errors(), "{}", p.to_table());
    for m in &p.modules {
        if is_triton(&m.module) {
            let reason = m
                .unavailable
                .as_deref()
                .unwrap_or_else(|| panic!("{} is not unavailable\n{}", m.module, p.to_table()));
            assert!(m.choice.is_none() && m.error.is_some(), "{}", m.module);
            assert!(
                reason.starts_with("built with CUDA 13.0 only; "),
                "{reason}"
            );
            for w in why {
                assert!(reason.contains(w), "{}: {reason} lacks {w}", m.module);
            }
        } else {
            let c = m
                .choice
                .as_ref()
                .unwrap_or_else(|| panic!("{}\n{}", m.module, p.to_table()));
            assert_eq!(
                format!("{}@{}", c.target, c.toolchain),
                want,
                "{}",
                m.module
            );
        }
    }
    assert!(
        p.to_table()
            .contains("UNAVAILABLE: built with CUDA 13.0 only"),
        "{}",
        p.to_table()
    );
}

fn at(target: &str, toolchain: fatbin_verify::CudaRelease) -> String {
    format!("{target}@{toolchain}")
}

#[test]
fn thor_orin_hopper_and_spark_get_their_exact_sass() {
    let modules = registry_with(&["sm_110", "sm_87", "sm_90", "sm_121"]);
    for (cap, integrated, want) in [
        ("11.0", true, "sm_110"),
        ("8.7", true, "sm_87"),
        ("9.0", false, "sm_90"),
        ("12.1", false, "sm_121"),
    ] {
        // On a 13.x driver: the CUDA 13 images.
        let p = plan(dev(cap, integrated, "13.0"), Policy::Auto, true, &modules);
        assert_all(&p, &at(want, cuda13()));
        assert!(p.modules.iter().all(|m| {
            let c = m.choice.as_ref().unwrap();
            c.reason == Reason::ExactSass && c.min_driver == Version::new(13, 0)
        }));
    }
}

#[test]
fn drivers_older_than_13_get_the_cuda12_images_and_thor_stays_on_cuda13() {
    let modules = registry_with(&["sm_110", "sm_87", "sm_90"]);
    for (cap, integrated, driver, want) in [
        // Jetson Orin on JetPack 6; an H100 on r550; Thor on JetPack 7.
        ("8.7", true, "12.6", at("sm_87", cuda12())),
        ("9.0", false, "12.4", at("sm_90", cuda12())),
        ("9.0", false, "12.0", at("sm_90", cuda12())),
        ("11.0", true, "13.0", at("sm_110", cuda13())),
    ] {
        let p = plan(dev(cap, integrated, driver), Policy::Auto, true, &modules);
        if driver == "13.0" {
            assert_all(&p, &want);
        } else {
            // The Triton modules are CUDA 13 only: SASS and the ISA 9.0 PTX need a 13.0 driver.
            let sass = if cap == "8.7" { "sm_87" } else { "sm_90a" };
            assert_cuda_and_triton_unavailable(
                &p,
                &want,
                &[
                    &format!("images for this GPU ({sass}, compute_80 PTX ISA 9.0)"),
                    "need driver >= 13.0",
                    &format!("this driver is CUDA {driver}"),
                ],
            );
        }
        for m in &p.modules {
            let Some(c) = m.choice.as_ref() else { continue };
            assert_eq!(c.reason, Reason::ExactSass);
            assert_eq!(c.min_driver, Version::new(c.toolchain.major, 0));
            assert!(c.min_driver <= p.device.driver);
        }
        let table = p.to_table();
        assert!(
            table.contains("cuda  driver>=")
                && table.contains(&format!(" {} ", want.split('@').nth(1).unwrap())),
            "{table}"
        );
    }
    // Thor on a 12.x driver: no CUDA 12 sm_110 exists; only CUDA 12.9's PTX, on a 12.9 driver.
    let p = plan(dev("11.0", true, "12.9"), Policy::Auto, true, &modules);
    assert_cuda_and_triton_unavailable(
        &p,
        &at("compute_80", cuda12()),
        &["(sm_110a, compute_80 PTX ISA 9.0) need driver >= 13.0"],
    );
    let p = plan(dev("11.0", true, "12.8"), Policy::Auto, true, &modules);
    assert!(p.has_errors());
    assert!(
        p.modules.iter().all(|m| m.error.is_some()),
        "{}",
        p.to_table()
    );
    // The CUDA modules are errors; the Triton ones unavailable as on any 12.x driver.
    assert!(p
        .modules
        .iter()
        .all(|m| m.unavailable.is_some() == is_triton(&m.module)));
}

#[test]
fn a_driver_too_old_for_everything_says_which_driver_would_do() {
    let modules = registry_with(&["sm_90"]);
    let old = dev("9.0", false, "11.8");
    let p = plan(old, Policy::Auto, true, &modules);
    assert!(p.modules.iter().all(|m| m.error.is_some()) && p.has_errors());
    for m in &p.modules {
        let e = m.error.as_deref().unwrap();
        // The oldest image that fits: CUDA 12.9's sm_90, or a Triton module's CUDA 13.0 sm_90a.
        let oldest = if is_triton(&m.module) {
            "sm_90a (CUDA 13.0), needs driver >= 13.0"
        } else {
            "sm_90 (CUDA 12.9), needs driver >= 12.0"
        };
        assert!(
            e.contains("the driver (CUDA 11.8) is older than every image that fits this GPU")
                && e.contains(oldest)
                && e.contains("Update the NVIDIA driver"),
            "{e}"
        );
    }
    // The oldest driver that runs the plan (the CUDA 13 only Triton modules unavailable there),
    // and the oldest that runs every module.
    assert_eq!(
        oldest_driver_for_plan(old, Policy::Auto, &modules),
        Some(Version::new(12, 0))
    );
    assert_eq!(
        oldest_driver_for_all(old, Policy::Auto, &modules),
        Some(Version::new(13, 0))
    );
    // PTX only: the CUDA 12.9 PTX needs 12.9.
    assert_eq!(
        oldest_driver_for_plan(old, Policy::PtxOnly, &modules),
        Some(Version::new(12, 9))
    );
    assert_eq!(
        oldest_driver_for_all(old, Policy::PtxOnly, &modules),
        Some(Version::new(13, 0))
    );
}

#[test]
fn orin_without_sm_87_takes_ptx_not_sm_80() {
    let modules = registry_with(&["sm_80", "sm_87", "compute_80"]);
    let without: Vec<_> = modules
        .into_iter()
        .map(|m| m.without_target(Target::sass(87)))
        .collect();
    let p = plan(dev("8.7", true, "13.0"), Policy::Auto, true, &without);
    assert_all(&p, &at("compute_80", cuda13()));
    // On JetPack 6's 12.6 driver neither PTX fits (ISA 9.0 needs 13.0, 8.8 needs 12.9).
    let p = plan(dev("8.7", true, "12.6"), Policy::Auto, true, &without);
    assert!(
        p.modules.iter().all(|m| m.error.is_some()),
        "{}",
        p.to_table()
    );
    // The same registry on a desktop 8.7-like minor takes the compatible cubin (sm_86).
    let p = plan(dev("8.7", false, "13.0"), Policy::Auto, true, &without);
    assert_all(&p, &at("sm_86", cuda13()));
    let p = plan(dev("8.7", false, "12.6"), Policy::Auto, true, &without);
    assert_cuda_and_triton_unavailable(
        &p,
        &at("sm_86", cuda12()),
        &["(sm_80, sm_86, compute_80 PTX ISA 9.0) need driver >= 13.0"],
    );
}

#[test]
fn hopper_on_a_12_8_driver_with_only_sm_80_and_nvcc13_ptx_is_an_error_that_says_what_is_needed() {
    let modules = registry_with(&["sm_80", "compute_80"]);
    // A CUDA-13-only build, as this crate was before it carried CUDA 12 images.
    let only: Vec<_> = modules
        .iter()
        .cloned()
        .map(|m| {
            m.retain_images(|i| {
                i.toolchain == cuda13() && (i.target == Target::sass(80) || i.target.virtual_arch)
            })
        })
        .collect();
    let p = plan(dev("9.0", false, "12.8"), Policy::Auto, true, &only);
    assert!(p.has_errors());
    for m in &p.modules {
        let e = m.error.as_deref().unwrap();
        assert!(
            e.contains("present [CUDA 13.0: sm_80, compute_80 (PTX 9.0)]"),
            "{e}"
        );
        assert!(e.contains("needs SASS sm_90"), "{e}");
        assert!(e.contains(".version <= 8.7"), "{e}");
        assert!(
            e.contains(
                "compute_80 (CUDA 13.0, PTX 9.0) has PTX ISA 9.0, which needs driver >= 13.0"
            ),
            "{e}"
        );
    }
    assert!(p.to_table().contains("ERROR"));
    // With the CUDA 12 images beside them, the same device runs CUDA 12.9's sm_90 (the Triton
    // modules, CUDA 13 only, are unavailable).
    let p = plan(dev("9.0", false, "12.8"), Policy::Auto, true, &modules);
    assert_cuda_and_triton_unavailable(&p, &at("sm_90", cuda12()), &["need driver >= 13.0"]);
}

#[test]
fn a_future_gpu_falls_back_to_ptx_and_an_old_driver_cannot() {
    let modules = registry_with(&["compute_80"]);
    let p = plan(dev("13.0", false, "13.0"), Policy::Auto, true, &modules);
    assert_all(&p, &at("compute_80", cuda13()));
    assert!(p.modules.iter().all(|m| m.choice.as_ref().unwrap().jit));
    // A 12.9 driver takes CUDA 12.9's PTX (ISA 8.8); a 12.8 driver knows neither ISA.
    let p = plan(dev("13.0", false, "12.9"), Policy::Auto, true, &modules);
    assert_cuda_and_triton_unavailable(
        &p,
        &at("compute_80", cuda12()),
        &["(compute_80 PTX ISA 9.0) need driver >= 13.0"],
    );
    let p = plan(dev("13.0", false, "12.8"), Policy::Auto, true, &modules);
    assert!(
        p.modules.iter().all(|m| m.error.is_some()),
        "{}",
        p.to_table()
    );
}

#[test]
fn h200_policies() {
    let modules = registry_with(&["sm_90", "compute_80"]);
    let h200 = dev("9.0", false, "13.0");
    assert_all(
        &plan(h200, Policy::Auto, false, &modules),
        &at("sm_90", cuda13()),
    );
    assert_all(
        &plan(h200, Policy::SassOnly, false, &modules),
        &at("sm_90", cuda13()),
    );
    assert_all(
        &plan(h200, Policy::PtxOnly, false, &modules),
        &at("compute_80", cuda13()),
    );
    // Forcing the CUDA 12 images (what the H200 GPU test does on its 13.0 driver): every CUDA
    // module has them, no Triton module does (CUDA 13 only), so those are unavailable.
    let cu12: Vec<_> = modules
        .iter()
        .cloned()
        .map(|m| m.with_toolchains(ToolchainChoice::Major(12)))
        .collect();
    assert!(cu12.iter().all(|m| if is_triton(&m.name) {
        m.images.is_empty()
    } else {
        !m.images.is_empty() && m.images.iter().all(|i| i.toolchain == cuda12())
    }));
    let choice_out = ["the toolchain choice leaves out its CUDA 13.0 images"];
    assert_cuda_and_triton_unavailable(
        &plan(h200, Policy::Auto, false, &cu12),
        &at("sm_90", cuda12()),
        &choice_out,
    );
    let p = plan(h200, Policy::PtxOnly, false, &cu12);
    assert_cuda_and_triton_unavailable(&p, &at("compute_80", cuda12()), &choice_out);
    assert!(p
        .modules
        .iter()
        .filter_map(|m| m.choice.as_ref())
        .all(|c| c.reason
            == Reason::PtxJit {
                isa: (8, 8),
                min_driver: Version::new(12, 9),
                forced: true
            }));
    // As a build without any sm_90 SASS (sm_90a included) would carry.
    let without: Vec<_> = modules
        .into_iter()
        .map(|m| m.retain_images(|i| i.target.virtual_arch || i.target.sm != 90))
        .collect();
    assert_all(
        &plan(h200, Policy::Auto, false, &without),
        &at("compute_80", cuda13()),
    );
}

#[test]
fn plan_serializes_with_device_policy_and_choices() {
    let modules = ModuleSource::registry();
    let p = plan(dev("11.0", true, "13.0"), Policy::Auto, true, &modules);
    let json: serde_json::Value = serde_json::to_value(&p).unwrap();
    assert_eq!(json["device"]["capability"], "11.0");
    assert_eq!(json["device"]["integrated"], true);
    assert_eq!(json["policy"], "auto");
    assert_eq!(json["simulated"], true);
    assert_eq!(json["modules"].as_array().unwrap().len(), modules.len());
    let choice = &json["modules"][0]["choice"];
    assert_eq!(
        (choice["toolchain"].as_str(), choice["min_driver"].as_str()),
        (Some("13.0"), Some("13.0"))
    );
    let images = json["modules"][0]["images"].as_array().unwrap();
    assert!(images
        .iter()
        .any(|i| i["toolchain"] == "12.9" && i["min_driver"] == "12.0"));
    // Orin on JetPack 6: a Triton module is unavailable, with the error and the reason.
    let p = plan(dev("8.7", true, "12.6"), Policy::Auto, true, &modules);
    let json: serde_json::Value = serde_json::to_value(&p).unwrap();
    let triton = json["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| is_triton(m["module"].as_str().unwrap()))
        .unwrap();
    assert!(triton.get("choice").is_none());
    assert!(triton["error"]
        .as_str()
        .unwrap()
        .contains("needs driver >= 13.0"));
    assert!(triton["unavailable"]
        .as_str()
        .unwrap()
        .contains("compute_80 PTX ISA 9.0"));
    assert!(json["modules"][0].get("unavailable").is_none());
}

#[test]
fn every_embedded_image_matches_its_recorded_hash_and_ptx_version() {
    let mut bytes = 0usize;
    let mut micros = 0u64;
    for m in registry::modules() {
        assert!(!m.images.is_empty(), "{} has no images", m.name);
        for img in m.images {
            let b = img.bytes();
            assert_eq!(b.len(), img.size, "{} {}", m.name, img.target);
            micros += verify_image(m.name, img.target, b, img.sha256)
                .unwrap()
                .micros;
            bytes += b.len();
            if img.target.virtual_arch {
                assert_eq!(
                    parse_ptx_version(b),
                    img.ptx_version,
                    "{} {}",
                    m.name,
                    img.target
                );
                assert!(!b.contains(&0), "PTX records carry no NUL");
            } else {
                assert_eq!(img.ptx_version, None);
            }
        }
    }
    // Not an assertion (no timing in tests): the figure the issue asks to measure.
    eprintln!("hashed {bytes} bytes of images in {micros} us (debug build; release is far faster)");
}

fn h200() -> DeviceSpec {
    dev("9.0", false, "13.0")
}

#[test]
fn a_tampered_cubin_is_refused_naming_module_and_target() {
    registry_with(&["sm_90"]);
    let rec = registry::module("rmsnorm").unwrap();
    // The image each driver would load: CUDA 13's on 13.0, CUDA 12's on 12.4.
    for (toolchain, device) in [(cuda13(), h200()), (cuda12(), dev("9.0", false, "12.4"))] {
        let orig = rec
            .images
            .iter()
            .find(|i| i.toolchain == toolchain && i.target == Target::sass(90))
            .unwrap();
        let mut bytes = orig.bytes().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        // The record keeps the build's hash: the bytes no longer match it.
        let m = altered(
            "rmsnorm",
            toolchain,
            Target::sass(90),
            bytes,
            orig.sha256.to_string(),
            None,
        );
        match check_module(&device, Policy::Auto, &m) {
            Err(DispatchError::Tampered(e)) => {
                assert_eq!((e.module.as_str(), e.target), ("rmsnorm", Target::sass(90)));
                assert_eq!(e.expected, orig.sha256);
                let msg = e.to_string();
                assert!(
                    msg.contains("rmsnorm") && msg.contains("sm_90") && msg.contains("refusing"),
                    "{msg}"
                );
            }
            other => panic!("expected a hash refusal, got {other:?}"),
        }
    }
}

#[test]
fn ptx_newer_than_the_driver_is_refused_before_the_driver_sees_it() {
    // 9.9: newer than any ISA we know.
    let (m, _) = ptx_with_version("activation", "9.9");
    match check_module(&h200(), Policy::PtxOnly, &m) {
        Err(DispatchError::NoImage { module, source }) => {
            assert_eq!(module, "activation");
            assert!(
                source
                    .needed
                    .contains("PTX ISA 9.9, which this dispatcher does not know"),
                "{}",
                source.needed
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // 9.1: known, but needs a 13.1 driver; the H200's is 13.0.
    let (m, _) = ptx_with_version("activation", "9.1");
    let err = check_module(&h200(), Policy::PtxOnly, &m).unwrap_err();
    assert!(err.to_string().contains("needs driver >= 13.1"), "{err}");
    // The same image is fine for a 13.1 driver.
    let (sel, _) = check_module(&dev("9.0", false, "13.1"), Policy::PtxOnly, &m).unwrap();
    assert_eq!(
        sel.reason,
        Reason::PtxJit {
            isa: (9, 1),
            min_driver: Version::new(13, 1),
            forced: true
        }
    );
}

#[test]
fn a_recorded_ptx_version_that_disagrees_with_the_text_is_refused() {
    let (honest, _) = ptx_with_version("rotary", "9.1");
    // Record 9.0 (what selection would accept on 13.0) over text that says 9.1.
    let mut m = honest.clone();
    m.images
        .iter_mut()
        .find(|i| i.target.virtual_arch)
        .unwrap()
        .ptx_version = Some((9, 0));
    match check_module(&h200(), Policy::PtxOnly, &m) {
        Err(DispatchError::PtxVersionMismatch {
            module,
            recorded,
            found,
            ..
        }) => {
            assert_eq!(
                (module.as_str(), recorded.as_str(), found.as_str()),
                ("rotary", "9.0", "9.1")
            );
        }
        other => panic!("expected a .version mismatch, got {other:?}"),
    }
}

#[test]
fn registry_images_are_hashed_once_per_process() {
    let modules = registry_with(&["sm_90"]);
    let m = &modules[0];
    let (_, first) = check_module(&h200(), Policy::Auto, m).unwrap();
    let (_, second) = check_module(&h200(), Policy::Auto, m).unwrap();
    // The first may itself be cached if another test in this process got there first.
    assert!(second.cached && second.micros == 0, "{first:?} {second:?}");
}

/// The modules built as a fast path for some GPUs only (manifest `portable = false`).
fn fast_path_modules() -> Vec<ModuleSource> {
    let fast: Vec<ModuleSource> = ModuleSource::registry()
        .into_iter()
        .filter(|m| !m.portable)
        .collect();
    assert!(
        fast.iter().any(|m| m.name == "gemm_bf16_sm90"),
        "the wgmma GEMM is a fast-path module"
    );
    fast
}

#[test]
fn fast_path_modules_run_only_as_their_own_sass() {
    let modules = fast_path_modules();
    let sm90a: Target = "sm_90a".parse().unwrap();
    let unavailable = |p: &aot_kernels::dispatch::Plan, why: &str| {
        assert!(!p.has_errors(), "{}", p.to_table());
        for m in &p.modules {
            let reason = m
                .unavailable
                .as_deref()
                .unwrap_or_else(|| panic!("{} is not unavailable\n{}", m.module, p.to_table()));
            assert!(m.choice.is_none(), "{}", m.module);
            assert!(
                reason.contains("a fast path built as SASS for sm_90a only")
                    && reason.contains(why)
                    && reason.contains("the portable kernels serve"),
                "{reason}"
            );
        }
        assert!(
            p.to_table().contains("UNAVAILABLE: a fast path"),
            "{}",
            p.to_table()
        );
    };
    // An H100/H200: its sm_90a SASS under auto and sass-only, from CUDA 13 on a 13.x driver and
    // from CUDA 12.9 on a 12.x one.
    for (driver, toolchain) in [("13.0", cuda13()), ("12.4", cuda12())] {
        for policy in [Policy::Auto, Policy::SassOnly] {
            let p = plan(dev("9.0", false, driver), policy, true, &modules);
            assert!(
                !p.has_errors() && p.unavailable().count() == 0,
                "{}",
                p.to_table()
            );
            for m in &p.modules {
                let c = m.choice.as_ref().unwrap();
                assert_eq!(
                    (c.target, c.toolchain, c.reason),
                    (sm90a, toolchain, Reason::ExactSass)
                );
            }
        }
    }
    // ptx-only on the same GPU: the PTX is no fallback.
    unavailable(
        &plan(dev("9.0", false, "13.0"), Policy::PtxOnly, true, &modules),
        "the ptx-only policy loads no SASS",
    );
    // Every other GPU (sm_90a runs on 9.0 only), however new its driver.
    for (cap, integrated) in [
        ("8.0", false),
        ("8.7", true),
        ("8.9", false),
        ("10.0", false),
        ("11.0", true),
        ("12.1", false),
        ("13.0", false),
    ] {
        unavailable(
            &plan(dev(cap, integrated, "13.0"), Policy::Auto, true, &modules),
            &format!("none runs on compute capability {cap}"),
        );
    }
    // Orin on JetPack 6: unavailable (not an error, though its CUDA 12.9 PTX needs 12.9).
    unavailable(
        &plan(dev("8.7", true, "12.6"), Policy::Auto, true, &modules),
        "none runs on compute capability 8.7",
    );
    // An H100 whose driver is older than every sm_90a image: an error like any module's.
    let p = plan(dev("9.0", false, "11.8"), Policy::Auto, true, &modules);
    assert!(
        p.has_errors() && p.unavailable().count() == 0,
        "{}",
        p.to_table()
    );
    assert!(
        p.modules.iter().all(|m| m
            .error
            .as_deref()
            .is_some_and(|e| e.contains("Update the NVIDIA driver"))),
        "{}",
        p.to_table()
    );
    // Loading one directly where it does not run is refused with the reason, before any driver
    // call: its trapping PTX is never handed out.
    for (cap, policy) in [("8.0", Policy::Auto), ("9.0", Policy::PtxOnly)] {
        let err = check_module(&dev(cap, false, "13.0"), policy, &modules[0]).unwrap_err();
        assert!(
            matches!(err, DispatchError::Unavailable { .. })
                && err
                    .to_string()
                    .contains("a fast path built as SASS for sm_90a only")
                && err.to_string().contains("load_available"),
            "{err}"
        );
    }
    // The oldest drivers the CLI names are those of the portable modules: a fast path that does
    // not run on a GPU (or under a policy) adds no requirement there.
    let all = ModuleSource::registry();
    let portable: Vec<_> = all.iter().filter(|m| m.portable).cloned().collect();
    for (cap, policy) in [
        ("8.0", Policy::SassOnly),
        ("8.0", Policy::Auto),
        ("11.0", Policy::Auto),
        ("9.0", Policy::Auto),
        ("9.0", Policy::SassOnly),
        ("9.0", Policy::PtxOnly),
    ] {
        let d = dev(cap, false, "11.8");
        assert_eq!(
            oldest_driver_for_all(d, policy, &all),
            oldest_driver_for_all(d, policy, &portable),
            "{cap} {policy}"
        );
        assert_eq!(
            oldest_driver_for_plan(d, policy, &all),
            oldest_driver_for_plan(d, policy, &portable),
            "{cap} {policy}"
        );
        assert!(
            oldest_driver_for_all(d, policy, &all).is_some(),
            "{cap} {policy}"
        );
    }
    // A build without sm_90a: unavailable on the H200 too, never its PTX.
    let without: Vec<_> = modules
        .iter()
        .cloned()
        .map(|m| m.without_target(sm90a))
        .collect();
    let p = plan(dev("9.0", false, "13.0"), Policy::Auto, true, &without);
    assert!(!p.has_errors(), "{}", p.to_table());
    assert!(
        p.modules.iter().all(|m| m
            .unavailable
            .as_deref()
            .is_some_and(|r| r.contains("built as SASS for no target of this build"))),
        "{}",
        p.to_table()
    );
}

#[test]
fn a_module_cut_to_its_ptx_takes_the_ptx_only_choice_under_auto_and_the_others_keep_sass() {
    let modules = ModuleSource::registry();
    let h200 = dev("9.0", false, "13.0");
    let ptx = plan(h200, Policy::PtxOnly, true, &modules);
    let auto = plan(h200, Policy::Auto, true, &modules);
    for cut in [0, modules.len() - 1] {
        let mixed: Vec<ModuleSource> = modules
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, m)| if i == cut { m.ptx_only() } else { m })
            .collect();
        let p = plan(h200, Policy::Auto, true, &mixed);
        for (i, m) in p.modules.iter().enumerate() {
            let want = if i == cut { &ptx } else { &auto };
            let (got, want) = (m.choice.as_ref(), want.modules[i].choice.as_ref());
            assert_eq!(
                got.map(|c| (c.target, c.toolchain)),
                want.map(|c| (c.target, c.toolchain)),
                "{}: cut module {cut}",
                m.module
            );
        }
        assert!(p.modules[cut].choice.as_ref().is_some_and(|c| c.jit));
    }
}
