//! The dispatch plan: for every module, which image a device would load and why. Pure, so
//! `qwen-decode kernels --simulate` and CI can show any device's plan without a GPU.

use std::fmt::Write as _;

use fatbin_verify::Target;
use serde::Serialize;

use super::policy::Policy;
use super::select::{select_image, DeviceSpec, NoImageError, Reason, Selection};
use super::source::ModuleSource;

#[derive(Debug, Clone, Serialize)]
pub struct ImageSummary {
    pub target: Target,
    pub format: &'static str,
    pub size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx_version: Option<String>,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    pub target: Target,
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
                    target: img.target,
                    format: if img.is_ptx() { "ptx" } else { "cubin" },
                    size: img.bytes.as_slice().len(),
                    ptx_version: img.ptx_version.map(|(a, b)| format!("{a}.{b}")),
                    sha256: img.sha256.clone(),
                })
                .collect();
            let (choice, error) = match select_for_module(&device, policy, m) {
                Ok(sel) => (
                    Some(Choice {
                        target: sel.target,
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

impl Plan {
    pub fn has_errors(&self) -> bool {
        self.modules.iter().any(|m| m.error.is_some())
    }

    /// The chosen target of `module`, if it has one.
    pub fn chosen(&self, module: &str) -> Option<Target> {
        self.modules
            .iter()
            .find(|m| m.module == module)?
            .choice
            .as_ref()
            .map(|c| c.target)
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
        let _ = writeln!(out, "{:<12} {:<12} {:<5} why", "module", "image", "jit");
        for m in &self.modules {
            match (&m.choice, &m.error) {
                (Some(c), _) => {
                    let jit = if c.jit { "yes" } else { "no" };
                    let _ = writeln!(
                        out,
                        "{:<12} {:<12} {:<5} {}",
                        m.module,
                        c.target.to_string(),
                        jit,
                        c.why
                    );
                }
                (None, Some(e)) => {
                    let _ = writeln!(out, "{:<12} {:<12} {:<5} ERROR: {e}", m.module, "-", "-");
                }
                (None, None) => {}
            }
        }
        out
    }
}
