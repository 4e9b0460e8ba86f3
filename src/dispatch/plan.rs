//! The dispatch plan: for every module, which image a device would load and why. Pure, so
//! `qwen-decode kernels --simulate` and CI can show any device's plan without a GPU.

use std::fmt::Write as _;

use fatbin_verify::{CudaRelease, Target};
use serde::Serialize;

use super::policy::Policy;
use super::select::{
    min_driver_for_image, select_image, DeviceSpec, NoImageError, Reason, Selection, Version,
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
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub device: DeviceSpec,
    /// The device was described by the caller, not read from a GPU.
    pub simulated: bool,
    pub policy: Policy,
    pub modules: Vec<ModulePlan>,
}

/// Selection for one module, as `select_image` decides it.
pub fn select_for_module(
    device: &DeviceSpec,
    policy: Policy,
    module: &ModuleSource,
) -> Result<Selection, NoImageError> {
    select_image(device, policy, &module.candidates())
}

pub fn plan(device: DeviceSpec, policy: Policy, simulated: bool, modules: &[ModuleSource]) -> Plan {
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
            let (choice, error) = match select_for_module(&device, policy, m) {
                Ok(sel) => (
                    Some(Choice {
                        target: sel.target,
                        toolchain: sel.toolchain,
                        min_driver: sel.min_driver,
                        reason: sel.reason,
                        jit: sel.target.virtual_arch,
                        why: sel.reason.to_string(),
                    }),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            };
            ModulePlan {
                module: m.name.clone(),
                entries: m.entries.clone(),
                images,
                choice,
                error,
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

/// The oldest driver with which every module has an image on this GPU under `policy`, if any
/// driver would do: what to tell a user whose driver is too old for everything.
pub fn oldest_driver_for_all(
    device: DeviceSpec,
    policy: Policy,
    modules: &[ModuleSource],
) -> Option<Version> {
    let mut drivers: Vec<Version> = modules
        .iter()
        .flat_map(|m| m.images.iter())
        .filter_map(|img| min_driver_for_image(&img.candidate()).ok())
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers.into_iter().find(|&driver| {
        let d = DeviceSpec { driver, ..device };
        modules
            .iter()
            .all(|m| select_for_module(&d, policy, m).is_ok())
    })
}

impl Plan {
    pub fn has_errors(&self) -> bool {
        self.modules.iter().any(|m| m.error.is_some())
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

    /// A fixed-width table: one row per module.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
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
            "{:<12} {:<12} {:<5} {:<8} {:<5} why",
            "module", "image", "cuda", "driver>=", "jit"
        );
        for m in &self.modules {
            match (&m.choice, &m.error) {
                (Some(c), _) => {
                    let jit = if c.jit { "yes" } else { "no" };
                    let _ = writeln!(
                        out,
                        "{:<12} {:<12} {:<5} {:<8} {:<5} {}",
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
                        "{:<12} {:<12} {:<5} {:<8} {:<5} ERROR: {e}",
                        m.module, "-", "-", "-", "-"
                    );
                }
                (None, None) => {}
            }
        }
        out
    }
}
