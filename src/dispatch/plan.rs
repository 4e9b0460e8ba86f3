//! The dispatch plan: for every module, which image a device would load and why. Pure, so
//! `qwen-decode kernels --simulate` and CI can show any device's plan without a GPU.
//!
//! A module without a usable image is an error, except where the build made it with only some of
//! its toolchains (the Triton modules: CUDA 13 only) and none of those can serve here: a driver
//! older than every such image that fits the GPU needs (CUDA 13 output on a 12.x driver), or a
//! toolchain choice that leaves them out (`--toolchain cuda12`). Such a module is *unavailable*:
//! the plan says why, and the other modules' plans stand ([`Plan::has_errors`] does not count it).
//! A module built as a fast path for some GPUs only (manifest `portable = false`, such as the
//! sm_90a wgmma GEMM) is unavailable wherever the selection would take its PTX.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use fatbin_verify::{CudaRelease, Target};
use serde::Serialize;

use super::policy::Policy;
use super::select::{
    fits_device, min_driver_for_image, select_image, DeviceSpec, NoImageError, Reason, Selection,
    Version,
};
use super::source::ModuleSource;

#[derive(Debug, Clone, Serialize)]
pub struct ImageSummary {
    pub toolchain: CudaRelease,
    pub target: Target,
    pub format: &'static str,
    /// The oldest driver that loads it (`None`: PTX of an unknown ISA).
    pub min_driver: Option<Version>,
    pub size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx_version: Option<String>,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    pub target: Target,
    /// CUDA release of the toolchain that made the image.
    pub toolchain: CudaRelease,
    /// The oldest driver that loads it.
    pub min_driver: Version,
    pub reason: Reason,
    /// The driver compiles this image at load (PTX).
    pub jit: bool,
    /// Human-readable form of `reason`.
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModulePlan {
    pub module: String,
    pub entries: Vec<String>,
    pub images: Vec<ImageSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `error`: why the module is unavailable here by the build's design rather than broken
    /// (made with only some toolchains, none of which can serve this driver or choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub device: DeviceSpec,
    /// The device was described by the caller, not read from a GPU.
    pub simulated: bool,
    pub policy: Policy,
    pub modules: Vec<ModulePlan>,
}

/// Selection for one module, as `select_image` decides it. A fast path (manifest `portable =
/// false`) is selected among its SASS only: its PTX holds no working code, and is never chosen.
pub fn select_for_module(
    device: &DeviceSpec,
    policy: Policy,
    module: &ModuleSource,
) -> Result<Selection, NoImageError> {
    if module.portable {
        return select_image(device, policy, &module.candidates());
    }
    let (index, sass): (Vec<usize>, Vec<_>) = module
        .candidates()
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !c.target.virtual_arch)
        .unzip();
    let mut sel = select_image(device, policy, &sass)?;
    sel.index = index[sel.index];
    Ok(sel)
}

/// Why a fast path (manifest `portable = false`) does not run here, whatever the driver: the
/// policy loads no SASS (`ptx-only`), or none of its SASS fits this GPU. `None` for a portable
/// module, or where one of its SASS fits (a driver too old for it is then an error, as for any
/// module).
pub fn fast_path_unavailable(
    device: &DeviceSpec,
    policy: Policy,
    m: &ModuleSource,
) -> Option<String> {
    if m.portable {
        return None;
    }
    let fits = policy != Policy::PtxOnly
        && m.images
            .iter()
            .any(|i| !i.is_ptx() && fits_device(i.target, device, policy));
    (!fits).then(|| not_portable_reason(device, policy, m))
}

/// Why `m`, which has no usable image here, is unavailable by design rather than broken: the
/// build made it with fewer toolchains than `every` module's, and each of its toolchains is out
/// of reach (its images left out by the toolchain choice, or every one of them that fits this GPU
/// needs a newer driver). `None`: an error like any other.
fn unavailable_reason(
    device: &DeviceSpec,
    policy: Policy,
    m: &ModuleSource,
    every: &BTreeSet<CudaRelease>,
) -> Option<String> {
    if m.toolchains.is_empty() || every.iter().all(|t| m.toolchains.contains(t)) {
        return None;
    }
    let mut why = Vec::new();
    for &t in &m.toolchains {
        let mine: Vec<_> = m.images.iter().filter(|i| i.toolchain == t).collect();
        if mine.is_empty() {
            why.push(format!(
                "the toolchain choice leaves out its CUDA {t} images"
            ));
            continue;
        }
        let fitting: Vec<(String, Version)> = mine
            .iter()
            .filter(|i| fits_device(i.target, device, policy))
            .filter_map(|i| {
                let driver = min_driver_for_image(&i.candidate()).ok()?;
                let what = match i.ptx_version {
                    Some((a, b)) if i.is_ptx() => format!("{} PTX ISA {a}.{b}", i.target),
                    _ => i.target.to_string(),
                };
                Some((what, driver))
            })
            .collect();
        let oldest = fitting.iter().map(|(_, d)| *d).min()?;
        if oldest <= device.driver {
            return None;
        }
        let list: Vec<&str> = fitting.iter().map(|(w, _)| w.as_str()).collect();
        why.push(format!(
            "its CUDA {t} images for this GPU ({}) need driver >= {oldest}",
            list.join(", ")
        ));
    }
    let built: Vec<String> = m.toolchains.iter().map(|t| format!("CUDA {t}")).collect();
    Some(format!(
        "built with {} only; {}; this driver is CUDA {}",
        built.join(" and "),
        why.join("; "),
        device.driver
    ))
}

/// Why a fast path (manifest `portable = false`) does not run here: no SASS of it fits this GPU
/// or the policy, and its PTX is no fallback.
fn not_portable_reason(device: &DeviceSpec, policy: Policy, m: &ModuleSource) -> String {
    let mut sass: Vec<String> = m
        .images
        .iter()
        .filter(|i| !i.is_ptx())
        .map(|i| i.target.to_string())
        .collect();
    sass.sort();
    sass.dedup();
    let here = if policy == Policy::PtxOnly {
        "the ptx-only policy loads no SASS".to_string()
    } else {
        format!("none runs on compute capability {}", device.capability)
    };
    format!(
        "a fast path built as SASS for {} only ({here}); its PTX is no fallback, so the portable kernels serve",
        if sass.is_empty() { "no target of this build".to_string() } else { sass.join(", ") }
    )
}

pub fn plan(device: DeviceSpec, policy: Policy, simulated: bool, modules: &[ModuleSource]) -> Plan {
    let every: BTreeSet<CudaRelease> = modules
        .iter()
        .flat_map(|m| m.toolchains.iter().copied())
        .collect();
    let modules = modules
        .iter()
        .map(|m| {
            let images = m
                .images
                .iter()
                .map(|img| ImageSummary {
                    toolchain: img.toolchain,
                    target: img.target,
                    format: if img.is_ptx() { "ptx" } else { "cubin" },
                    min_driver: min_driver_for_image(&img.candidate()).ok(),
                    size: img.bytes.as_slice().len(),
                    ptx_version: img.ptx_version.map(|(a, b)| format!("{a}.{b}")),
                    sha256: img.sha256.clone(),
                })
                .collect();
            let selection = match fast_path_unavailable(&device, policy, m) {
                Some(why) => Err(why),
                None => Ok(select_for_module(&device, policy, m)),
            };
            let (choice, error, unavailable) = match selection {
                Err(why) => (None, Some(why.clone()), Some(why)),
                Ok(Ok(sel)) => (
                    Some(Choice {
                        target: sel.target,
                        toolchain: sel.toolchain,
                        min_driver: sel.min_driver,
                        reason: sel.reason,
                        jit: sel.target.virtual_arch,
                        why: sel.reason.to_string(),
                    }),
                    None,
                    None,
                ),
                Ok(Err(e)) => (
                    None,
                    Some(e.to_string()),
                    unavailable_reason(&device, policy, m, &every),
                ),
            };
            ModulePlan {
                module: m.name.clone(),
                entries: m.entries.clone(),
                images,
                choice,
                error,
                unavailable,
            }
        })
        .collect();
    Plan {
        device,
        simulated,
        policy,
        modules,
    }
}

/// The oldest driver whose plan on this GPU under `policy` has no errors (modules unavailable by
/// design aside), if any driver would do: what to tell a user whose driver is too old.
pub fn oldest_driver_for_plan(
    device: DeviceSpec,
    policy: Policy,
    modules: &[ModuleSource],
) -> Option<Version> {
    oldest_driver_where(device, modules, |d| {
        !plan(d, policy, true, modules).has_errors()
    })
}

/// The oldest driver with which every module (those a build made with only some toolchains
/// included) has an image on this GPU under `policy`, if any driver would do. Fast paths that do
/// not run on this GPU under `policy` at all are no part of "every module" here.
pub fn oldest_driver_for_all(
    device: DeviceSpec,
    policy: Policy,
    modules: &[ModuleSource],
) -> Option<Version> {
    oldest_driver_where(device, modules, |d| {
        modules.iter().all(|m| {
            fast_path_unavailable(&d, policy, m).is_some()
                || select_for_module(&d, policy, m).is_ok()
        })
    })
}

/// The oldest driver some image needs for which `ok` holds on `device` with that driver.
fn oldest_driver_where(
    device: DeviceSpec,
    modules: &[ModuleSource],
    ok: impl Fn(DeviceSpec) -> bool,
) -> Option<Version> {
    let mut drivers: Vec<Version> = modules
        .iter()
        .flat_map(|m| m.images.iter())
        .filter_map(|img| min_driver_for_image(&img.candidate()).ok())
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers
        .into_iter()
        .find(|&driver| ok(DeviceSpec { driver, ..device }))
}

impl Plan {
    /// A module that should run here has no usable image (unavailable modules do not count).
    pub fn has_errors(&self) -> bool {
        self.modules
            .iter()
            .any(|m| m.error.is_some() && m.unavailable.is_none())
    }

    /// The modules unavailable here by design (no image of their toolchains can serve).
    pub fn unavailable(&self) -> impl Iterator<Item = &ModulePlan> {
        self.modules.iter().filter(|m| m.unavailable.is_some())
    }

    /// The chosen target of `module`, if it has one.
    pub fn chosen(&self, module: &str) -> Option<Target> {
        self.choice(module).map(|c| c.target)
    }

    /// The choice for `module`, if it has one.
    pub fn choice(&self, module: &str) -> Option<&Choice> {
        self.modules
            .iter()
            .find(|m| m.module == module)?
            .choice
            .as_ref()
    }

    /// A fixed-width table: one row per module (the module column as wide as the longest name).
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let w = self
            .modules
            .iter()
            .map(|m| m.module.len())
            .max()
            .unwrap_or(0)
            .max(12);
        let source = if self.simulated {
            "simulated"
        } else {
            "this machine"
        };
        let _ = writeln!(
            out,
            "dispatch plan for {} [{source}], policy {}",
            self.device, self.policy
        );
        let _ = writeln!(
            out,
            "{:<w$} {:<12} {:<5} {:<8} {:<5} why",
            "module", "image", "cuda", "driver>=", "jit"
        );
        for m in &self.modules {
            match (&m.choice, &m.error) {
                (None, Some(_)) if m.unavailable.is_some() => {
                    let _ = writeln!(
                        out,
                        "{:<w$} {:<12} {:<5} {:<8} {:<5} UNAVAILABLE: {}",
                        m.module,
                        "-",
                        "-",
                        "-",
                        "-",
                        m.unavailable.as_deref().unwrap_or_default()
                    );
                }
                (Some(c), _) => {
                    let jit = if c.jit { "yes" } else { "no" };
                    let _ = writeln!(
                        out,
                        "{:<w$} {:<12} {:<5} {:<8} {:<5} {}",
                        m.module,
                        c.target.to_string(),
                        c.toolchain.to_string(),
                        c.min_driver.to_string(),
                        jit,
                        c.why
                    );
                }
                (None, Some(e)) => {
                    let _ = writeln!(
                        out,
                        "{:<w$} {:<12} {:<5} {:<8} {:<5} ERROR: {e}",
                        m.module, "-", "-", "-", "-"
                    );
                }
                (None, None) => {}
            }
        }
        out
    }
}
