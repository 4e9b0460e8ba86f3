//! Which image of a module runs on a given device and driver: a pure decision, no GPU needed.
//!
//! Every image needs a driver at least as new as [`min_driver_for_image`] says (CUDA 13 output:
//! 13.0; CUDA 12 cubins: 12.0; PTX: the driver that knows its ISA); images the driver cannot
//! load are left out first. Then (policy `auto`): exact SASS -> compatible SASS (same major, lower
//! minor; baseline cubins on desktop GPUs only, family `f` cubins on every member of the family)
//! -> the PTX with the highest virtual architecture not above the GPU -> an error naming the
//! images present and what this device would need. Among equally good images the newest
//! toolchain wins.

use std::fmt;
use std::str::FromStr;

use fatbin_verify::{CudaRelease, Target, Variant};
use serde::{Deserialize, Serialize};

use super::policy::Policy;

/// A `MAJOR.MINOR` pair as CUDA prints compute capabilities and driver versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Self {
        Version { major, minor }
    }

    /// `cuDriverGetVersion` reports 13000 for 13.0 and 12080 for 12.8.
    pub const fn from_driver_int(v: i32) -> Self {
        let v = if v < 0 { 0 } else { v as u32 };
        Version {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }

    /// The SM number nvcc uses for this capability: 11.0 -> 110, 8.7 -> 87.
    pub const fn sm(&self) -> u32 {
        self.major * 10 + self.minor
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A version string that is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a version: expected MAJOR.MINOR with a one-digit minor, for example `11.0` or `8.7`")]
pub struct ParseVersionError(pub String);

impl FromStr for Version {
    type Err = ParseVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseVersionError(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit());
        // Capabilities and driver minors are single digits (12.8, 8.7); `12.10` would be ambiguous.
        if !digits(major) || minor.len() != 1 || !digits(minor) {
            return Err(err());
        }
        Ok(Version {
            major: major.parse().map_err(|_| err())?,
            minor: minor.parse().map_err(|_| err())?,
        })
    }
}

/// What selection needs to know about the device: read from the driver, or given by `--simulate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub capability: Version,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: Jetson (Tegra) and other integrated GPUs.
    pub integrated: bool,
    /// The CUDA version the driver supports (`cuDriverGetVersion`).
    pub driver: Version,
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.integrated {
            "integrated"
        } else {
            "discrete"
        };
        write!(
            f,
            "compute capability {} ({kind}), driver CUDA {}",
            self.capability, self.driver
        )
    }
}

/// What selection needs to know about one image of a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageCandidate {
    pub target: Target,
    /// PTX `.version` (ISA), for PTX images only.
    pub ptx_version: Option<(u32, u32)>,
    /// CUDA release of the toolchain that made it.
    pub toolchain: CudaRelease,
}

/// The oldest driver (as `cuDriverGetVersion` reports it) that loads this image. A cubin needs
/// its toolkit's major: NVIDIA supports CUDA 13 output on 13.x drivers only, and CUDA 12 output
/// on every 12.x driver (minor-version compatibility). PTX also needs a driver that knows its
/// ISA. `Err` says why it cannot be known (PTX without a known `.version`).
pub fn min_driver_for_image(c: &ImageCandidate) -> Result<Version, String> {
    let family = Version::new(c.toolchain.major, 0);
    if !c.target.virtual_arch {
        return Ok(family);
    }
    let Some(isa) = c.ptx_version else {
        return Err(format!(
            "{} has no recorded .version, so its driver needs are unknown",
            describe(c)
        ));
    };
    let Some(min) = min_driver_for_ptx_isa(isa) else {
        return Err(format!(
            "{} has PTX ISA {}.{}, which this dispatcher does not know",
            describe(c),
            isa.0,
            isa.1
        ));
    };
    Ok(min.max(family))
}

/// Minimum driver (CUDA version as `cuDriverGetVersion` reports it) that accepts a PTX ISA
/// version; `None` for an ISA this table does not know, which we refuse rather than guess.
pub fn min_driver_for_ptx_isa(isa: (u32, u32)) -> Option<Version> {
    let v = match isa {
        // CUDA 11.x introduced ISA 7.x one for one.
        (7, m @ 0..=8) => Version::new(11, m),
        (8, m @ 0..=5) => Version::new(12, m),
        (8, 6) => Version::new(12, 7),
        (8, 7) => Version::new(12, 8),
        (8, 8) => Version::new(12, 9),
        (9, 0) => Version::new(13, 0),
        (9, 1) => Version::new(13, 1),
        _ => return None,
    };
    Some(v)
}

/// The newest PTX ISA a driver accepts, by the same table.
pub fn max_ptx_isa_for_driver(driver: Version) -> Option<(u32, u32)> {
    const KNOWN: &[(u32, u32)] = &[
        (9, 1),
        (9, 0),
        (8, 8),
        (8, 7),
        (8, 6),
        (8, 5),
        (8, 4),
        (8, 3),
        (8, 2),
        (8, 1),
        (8, 0),
        (7, 8),
        (7, 7),
        (7, 6),
        (7, 5),
        (7, 4),
        (7, 3),
        (7, 2),
        (7, 1),
        (7, 0),
    ];
    KNOWN
        .iter()
        .copied()
        .find(|&isa| min_driver_for_ptx_isa(isa).is_some_and(|d| d <= driver))
}

/// Why an image was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// SASS built for exactly this capability.
    ExactSass,
    /// SASS of the same major and a lower minor (baseline on desktop GPUs only; family anywhere).
    CompatibleSass,
    /// PTX the driver compiles at load; `forced` when the policy was `ptx-only`.
    PtxJit {
        isa: (u32, u32),
        min_driver: Version,
        forced: bool,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::ExactSass => write!(f, "exact SASS"),
            Reason::CompatibleSass => write!(f, "compatible SASS (same major, lower minor)"),
            Reason::PtxJit {
                isa,
                min_driver,
                forced,
            } => {
                let why = if *forced {
                    "forced by policy ptx-only"
                } else {
                    "no SASS fits"
                };
                write!(
                    f,
                    "PTX JIT ({why}; ISA {}.{} needs driver >= {min_driver})",
                    isa.0, isa.1
                )
            }
        }
    }
}

/// The image selection picked: its index in the candidate list, its target, toolchain, the
/// oldest driver it needs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    pub index: usize,
    pub target: Target,
    pub reason: Reason,
    pub toolchain: CudaRelease,
    pub min_driver: Version,
}

/// No image of a module can run here under the policy; the message says what would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no usable image for {device} under policy {policy}: present [{present}]; {needed}")]
pub struct NoImageError {
    pub device: DeviceSpec,
    pub policy: Policy,
    /// The images the module carries, e.g. `CUDA 13.0: sm_80, compute_80 (PTX 9.0)`.
    pub present: String,
    /// What this device and driver would accept, and why the PTX present was refused.
    pub needed: String,
}

/// Whether SASS for `target` runs on `device`, and how well it fits.
fn sass_fit(target: Target, device: &DeviceSpec) -> Option<Reason> {
    if target.virtual_arch {
        return None;
    }
    let (major, minor) = target.capability();
    let cap = device.capability;
    if (major, minor) == (cap.major, cap.minor) {
        return Some(Reason::ExactSass);
    }
    // Never across a major. Baseline minor-version compatibility is documented for desktop GPUs
    // only (docs/dispatch.md: an sm_80 cubin did not load on Orin); family (`f`) code is built to
    // run on every member of its family, integrated ones included.
    let same_major_lower_minor = major == cap.major && minor < cap.minor;
    match target.variant {
        Variant::Baseline if same_major_lower_minor && !device.integrated => {
            Some(Reason::CompatibleSass)
        }
        Variant::Family if same_major_lower_minor => Some(Reason::CompatibleSass),
        _ => None,
    }
}

/// Whether PTX for `target` may be JIT-compiled for this capability (driver not considered).
fn ptx_arch_fits(target: Target, cap: Version) -> bool {
    if !target.virtual_arch {
        return false;
    }
    let (major, minor) = target.capability();
    match target.variant {
        Variant::Baseline => target.sm <= cap.sm(),
        Variant::ArchSpecific => (major, minor) == (cap.major, cap.minor),
        Variant::Family => major == cap.major && minor <= cap.minor,
    }
}

/// Whether `policy` lets `device` run an image for `target` at all, the driver aside (SASS that
/// fits, or PTX of an architecture it may JIT).
pub(crate) fn fits_device(target: Target, device: &DeviceSpec, policy: Policy) -> bool {
    (policy != Policy::PtxOnly && sass_fit(target, device).is_some())
        || (policy != Policy::SassOnly && ptx_arch_fits(target, device.capability))
}

/// Rank among exact SASS: arch-specific code uses features the baseline cannot, so prefer it.
fn variant_rank(v: Variant) -> u8 {
    match v {
        Variant::ArchSpecific => 2,
        Variant::Family => 1,
        Variant::Baseline => 0,
    }
}

fn describe(c: &ImageCandidate) -> String {
    let tc = c.toolchain;
    match c.ptx_version {
        Some((a, b)) if c.target.virtual_arch => format!("{} (CUDA {tc}, PTX {a}.{b})", c.target),
        None if c.target.virtual_arch => format!("{} (CUDA {tc}, PTX, .version unknown)", c.target),
        _ => format!("{} (CUDA {tc})", c.target),
    }
}

/// `CUDA 13.0: sm_80, compute_80 (PTX 9.0); CUDA 12.9: sm_80`, toolchains in the order met.
fn describe_all(images: &[ImageCandidate]) -> String {
    let mut groups: Vec<(CudaRelease, Vec<String>)> = Vec::new();
    for c in images {
        let item = match c.ptx_version {
            Some((a, b)) if c.target.virtual_arch => format!("{} (PTX {a}.{b})", c.target),
            None if c.target.virtual_arch => format!("{} (PTX, .version unknown)", c.target),
            _ => c.target.to_string(),
        };
        match groups.iter_mut().find(|(t, _)| *t == c.toolchain) {
            Some((_, items)) => items.push(item),
            None => groups.push((c.toolchain, vec![item])),
        }
    }
    if groups.is_empty() {
        return "none".into();
    }
    groups
        .iter()
        .map(|(t, items)| format!("CUDA {t}: {}", items.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Pick the image of one module to load on `device` under `policy`.
pub fn select_image(
    device: &DeviceSpec,
    policy: Policy,
    images: &[ImageCandidate],
) -> Result<Selection, NoImageError> {
    // What each image fits on this GPU (driver aside), and whether the driver can load it.
    let mut refused = Vec::new();
    // The oldest driver any image that fits this GPU would need, with that image.
    let mut oldest: Option<(Version, String)> = None;
    let mut usable = Vec::new();
    for (i, c) in images.iter().enumerate() {
        let sass = (policy != Policy::PtxOnly)
            .then(|| sass_fit(c.target, device))
            .flatten();
        let ptx = policy != Policy::SassOnly && ptx_arch_fits(c.target, device.capability);
        if sass.is_none() && !ptx {
            continue;
        }
        let min_driver = match min_driver_for_image(c) {
            Ok(v) => v,
            Err(why) => {
                refused.push(why);
                continue;
            }
        };
        if min_driver > device.driver {
            refused.push(match c.ptx_version {
                Some((a, b)) if c.target.virtual_arch => format!(
                    "{} has PTX ISA {a}.{b}, which needs driver >= {min_driver}",
                    describe(c)
                ),
                _ => format!("{} needs driver >= {min_driver}", describe(c)),
            });
            if oldest.as_ref().is_none_or(|(v, _)| min_driver < *v) {
                oldest = Some((min_driver, describe(c)));
            }
            continue;
        }
        usable.push((i, c, sass, min_driver));
    }

    // Exact beats compatible; among compatible the highest minor; among exact `a` > `f` >
    // baseline; then the newest toolchain.
    let best_sass = usable
        .iter()
        .filter_map(|&(i, c, sass, min)| sass.map(|r| (i, c, r, min)))
        .max_by_key(|(_, c, r, _)| {
            (
                *r == Reason::ExactSass,
                c.target.sm,
                variant_rank(c.target.variant),
                c.toolchain,
            )
        });
    if let Some((index, c, reason, min_driver)) = best_sass {
        return Ok(Selection {
            index,
            target: c.target,
            reason,
            toolchain: c.toolchain,
            min_driver,
        });
    }
    // The highest virtual architecture the driver can load, then the newest toolchain.
    let best_ptx = usable
        .iter()
        .filter(|(_, c, _, _)| c.target.virtual_arch)
        .max_by_key(|(_, c, _, _)| (c.target.sm, variant_rank(c.target.variant), c.toolchain));
    if let Some(&(index, c, _, min_driver)) = best_ptx {
        // min_driver_for_image succeeded, so the ISA is recorded and known.
        let isa = c.ptx_version.unwrap_or_default();
        return Ok(Selection {
            index,
            target: c.target,
            reason: Reason::PtxJit {
                isa,
                min_driver,
                forced: policy == Policy::PtxOnly,
            },
            toolchain: c.toolchain,
            min_driver,
        });
    }

    let cap = device.capability;
    let sass_need = if device.integrated {
        format!(
            "SASS for exactly sm_{} (integrated GPUs take no other minor)",
            cap.sm()
        )
    } else if cap.minor == 0 {
        format!("SASS sm_{}", cap.sm())
    } else {
        format!(
            "SASS sm_{} (or a baseline sm_{}X with X < {})",
            cap.sm(),
            cap.major,
            cap.minor
        )
    };
    let isa_need = match max_ptx_isa_for_driver(device.driver) {
        Some((a, b)) => format!(
            "PTX compute_XY with XY <= {} and .version <= {a}.{b}",
            cap.sm()
        ),
        None => format!("a driver newer than {} for any PTX", device.driver),
    };
    let mut needed = match policy {
        Policy::Auto => format!("needs {sass_need}, or {isa_need}"),
        Policy::SassOnly => format!("needs {sass_need} (policy sass-only refuses PTX JIT)"),
        Policy::PtxOnly => format!("needs {isa_need} (policy ptx-only ignores SASS)"),
    };
    if let Some((version, image)) = &oldest {
        needed.push_str(&format!(
            "; the driver (CUDA {}) is older than every image that fits this GPU: the oldest, {image}, needs driver >= {version}. Update the NVIDIA driver to one that supports CUDA {version} or later (nvidia-smi shows the CUDA version it supports)",
            device.driver
        ));
    }
    if !refused.is_empty() {
        needed.push_str(&format!("; refused: {}", refused.join("; ")));
    }
    Err(NoImageError {
        device: *device,
        policy,
        present: describe_all(images),
        needed,
    })
}
