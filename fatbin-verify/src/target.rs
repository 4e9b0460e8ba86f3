//! GPU code targets as nvcc names them: `sm_90`, `sm_90a`, `sm_100f` (SASS) and `compute_80` (PTX).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// SM numbers the pinned CUDA 13.0 toolchain accepts (`nvcc --list-gpu-code`).
pub const KNOWN_SM: &[u32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

/// Whether code is tied to one capability, its family, or the baseline rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// `sm_90`: runs on the same major with minor >= its own (desktop GPUs).
    Baseline,
    /// `sm_90a`: runs on exactly this capability.
    ArchSpecific,
    /// `sm_100f`: runs on the family (same major, minor >= its own, per NVIDIA's family rules).
    Family,
}

/// One code target: real (SASS, `sm_`) or virtual (PTX, `compute_`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// SM number: 80 for 8.0, 110 for 11.0.
    pub sm: u32,
    pub variant: Variant,
    /// `compute_XY` (PTX) rather than `sm_XY` (SASS).
    pub virtual_arch: bool,
}

impl Target {
    pub const fn sass(sm: u32) -> Self {
        Target {
            sm,
            variant: Variant::Baseline,
            virtual_arch: false,
        }
    }

    pub const fn ptx(sm: u32) -> Self {
        Target {
            sm,
            variant: Variant::Baseline,
            virtual_arch: true,
        }
    }

    pub const fn with_variant(self, variant: Variant) -> Self {
        Target { variant, ..self }
    }

    /// Compute capability `(major, minor)`: `sm_110` -> `(11, 0)`.
    pub const fn capability(&self) -> (u32, u32) {
        (self.sm / 10, self.sm % 10)
    }

    /// Whether the pinned toolchain knows this SM number.
    pub fn is_known(&self) -> bool {
        KNOWN_SM.contains(&self.sm)
    }

    /// The name nvcc uses in `-arch`/`-gencode`: `sm_90a`, `compute_80`.
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.virtual_arch { "compute" } else { "sm" };
        let suffix = match self.variant {
            Variant::Baseline => "",
            Variant::ArchSpecific => "a",
            Variant::Family => "f",
        };
        write!(f, "{prefix}_{}{suffix}", self.sm)
    }
}

/// A target string that is not of the form `sm_NN[a|f]` or `compute_NN[a|f]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a CUDA target: expected `sm_NN`, `sm_NNa`, `sm_NNf` or `compute_NN` (for example `sm_110` or `compute_80`)")]
pub struct ParseTargetError(pub String);

impl FromStr for Target {
    type Err = ParseTargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTargetError(s.to_string());
        let (virtual_arch, rest) = if let Some(rest) = s.strip_prefix("sm_") {
            (false, rest)
        } else if let Some(rest) = s.strip_prefix("compute_") {
            (true, rest)
        } else {
            return Err(err());
        };
        let (digits, variant) = match rest.as_bytes().last() {
            Some(b'a') => (&rest[..rest.len() - 1], Variant::ArchSpecific),
            Some(b'f') => (&rest[..rest.len() - 1], Variant::Family),
            _ => (rest, Variant::Baseline),
        };
        if digits.len() < 2 || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let sm: u32 = digits.parse().map_err(|_| err())?;
        Ok(Target {
            sm,
            variant,
            virtual_arch,
        })
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_form() {
        for name in [
            "sm_80",
            "sm_87",
            "sm_90a",
            "sm_100f",
            "sm_110",
            "sm_121",
            "compute_80",
            "compute_90a",
        ] {
            let t: Target = name.parse().unwrap();
            assert_eq!(t.to_string(), name);
        }
    }

    #[test]
    fn reads_capability_and_variant() {
        let t: Target = "sm_110".parse().unwrap();
        assert_eq!(t.capability(), (11, 0));
        assert!(!t.virtual_arch);
        let t: Target = "sm_90a".parse().unwrap();
        assert_eq!((t.sm, t.variant), (90, Variant::ArchSpecific));
        let t: Target = "compute_80".parse().unwrap();
        assert_eq!((t.capability(), t.virtual_arch), ((8, 0), true));
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in [
            "", "sm", "sm_", "sm_9", "sm_9000", "sm_90b", "SM_90", "gfx90a", "sm_x0", "compute_",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn knows_the_toolchain_list() {
        assert!(Target::sass(110).is_known());
        assert!(Target::sass(87).is_known());
        assert!(!Target::sass(111).is_known());
    }
}
