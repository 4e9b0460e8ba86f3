//! How much freedom the dispatcher has: SASS first with PTX fallback, SASS only, or PTX only;
//! which toolchains' images it may use (every one, newest first; or one CUDA major only); and
//! where launches may be programmatic (auto, all, off).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Environment variable that sets the policy when the caller does not pass one.
pub const POLICY_ENV: &str = "AOT_KERNELS_POLICY";

/// Environment variable that limits the images to one CUDA major (`cuda12`, `cuda13`) when the
/// caller does not choose; `newest` (the default) lets selection take the newest the driver accepts.
pub const TOOLCHAIN_ENV: &str = "AOT_KERNELS_TOOLCHAIN";

/// Environment variable that sets where programmatic dependent launch is used ([`PdlMode`]).
pub const PDL_ENV: &str = "AOT_KERNELS_PDL";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Exact SASS, then compatible SASS, then PTX JIT.
    #[default]
    Auto,
    /// SASS or an error: never pay for (or trust) a JIT at load time.
    SassOnly,
    /// Always the PTX fallback: tests the path devices without SASS take.
    PtxOnly,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Auto, Policy::SassOnly, Policy::PtxOnly];

    pub const fn as_str(&self) -> &'static str {
        match self {
            Policy::Auto => "auto",
            Policy::SassOnly => "sass-only",
            Policy::PtxOnly => "ptx-only",
        }
    }

    /// The policy from [`POLICY_ENV`]; `auto` when it is unset or empty.
    pub fn from_env() -> Result<Policy, ParsePolicyError> {
        match std::env::var(POLICY_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().parse(),
            _ => Ok(Policy::Auto),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a dispatch policy: expected `auto`, `sass-only` or `ptx-only` (in --policy or {POLICY_ENV})")]
pub struct ParsePolicyError(pub String);

impl FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParsePolicyError(s.to_string()))
    }
}

/// Which toolchains' images the dispatcher may choose from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ToolchainChoice {
    /// Every image; selection prefers the newest toolchain the driver accepts.
    #[default]
    Newest,
    /// Only images of this CUDA major (`cuda12`: what an r525..r575 driver gets), e.g. to test
    /// the CUDA 12 images on a 13.x driver.
    Major(u32),
}

impl ToolchainChoice {
    pub fn allows(&self, toolchain: fatbin_verify::CudaRelease) -> bool {
        match self {
            ToolchainChoice::Newest => true,
            ToolchainChoice::Major(m) => toolchain.major == *m,
        }
    }

    /// The choice from [`TOOLCHAIN_ENV`]; `newest` when it is unset or empty.
    pub fn from_env() -> Result<ToolchainChoice, ParseToolchainChoiceError> {
        match std::env::var(TOOLCHAIN_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().parse(),
            _ => Ok(ToolchainChoice::Newest),
        }
    }
}

impl fmt::Display for ToolchainChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolchainChoice::Newest => f.write_str("newest"),
            ToolchainChoice::Major(m) => write!(f, "cuda{m}"),
        }
    }
}

impl Serialize for ToolchainChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a toolchain choice: expected `newest`, `cuda12` or `cuda13` (in --toolchain or {TOOLCHAIN_ENV})")]
pub struct ParseToolchainChoiceError(pub String);

impl FromStr for ToolchainChoice {
    type Err = ParseToolchainChoiceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        if lower == "newest" {
            return Ok(ToolchainChoice::Newest);
        }
        lower
            .strip_prefix("cuda")
            .filter(|d| !d.is_empty() && d.len() <= 3 && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse().ok())
            .map(ToolchainChoice::Major)
            .ok_or_else(|| ParseToolchainChoiceError(s.to_string()))
    }
}

/// Where kernels launch with programmatic dependent launch (Hopper and later, sm_90+ images only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PdlMode {
    /// Only the launches that ask for it and have work to do before their wait: the decode step's
    /// qkv and o_proj GEMVs, which stage their first weights meanwhile (docs/experiments.md has
    /// the measurement).
    #[default]
    Auto,
    /// Every launch of the modules whose kernels hold the hooks (the GEMVs and decode attention),
    /// where their image is sm_90+. It slowed the decode step on the H200 (docs/experiments.md):
    /// the next kernel's blocks land wherever the previous one's leave first, unevenly.
    All,
    /// None: every kernel waits for the one before it to end.
    Off,
}

impl PdlMode {
    pub const ALL: [PdlMode; 3] = [PdlMode::Auto, PdlMode::All, PdlMode::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            PdlMode::Auto => "auto",
            PdlMode::All => "all",
            PdlMode::Off => "off",
        }
    }

    /// `AOT_KERNELS_PDL`: `auto` (default, also when unset or empty), `all` (or `1`), `off` (or `0`).
    pub fn from_env() -> Result<PdlMode, ParsePdlModeError> {
        match std::env::var(PDL_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().parse(),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(PdlMode::Auto),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(ParsePdlModeError(v.to_string_lossy().into_owned()))
            }
        }
    }
}

impl FromStr for PdlMode {
    type Err = ParsePdlModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "1" => return Ok(PdlMode::All),
            "0" => return Ok(PdlMode::Off),
            _ => {}
        }
        PdlMode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParsePdlModeError(s.to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a programmatic-launch mode: set {PDL_ENV} to `auto` (the default), `all` (or `1`) or `off` (or `0`)")]
pub struct ParsePdlModeError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_modes_parse_by_name_and_by_the_old_switch() {
        assert_eq!("auto".parse(), Ok(PdlMode::Auto));
        assert_eq!("ALL".parse(), Ok(PdlMode::All));
        assert_eq!("1".parse(), Ok(PdlMode::All));
        assert_eq!("off".parse(), Ok(PdlMode::Off));
        assert_eq!("0".parse(), Ok(PdlMode::Off));
        let err = "yes".parse::<PdlMode>().unwrap_err();
        assert!(err.to_string().contains("AOT_KERNELS_PDL"), "{err}");
        assert!(err.to_string().contains("`yes`"), "{err}");
        assert_eq!(PdlMode::default(), PdlMode::Auto);
    }

    #[test]
    fn parses_toolchain_choices_and_rejects_others() {
        assert_eq!("newest".parse(), Ok(ToolchainChoice::Newest));
        assert_eq!("CUDA12".parse(), Ok(ToolchainChoice::Major(12)));
        assert_eq!("cuda13".parse(), Ok(ToolchainChoice::Major(13)));
        for bad in ["", "12", "cuda", "cuda12.9", "cuda-12", "oldest"] {
            let err = bad.parse::<ToolchainChoice>().unwrap_err();
            assert!(err.to_string().contains("cuda12"), "{bad}: {err}");
        }
        let cu12 = fatbin_verify::CudaRelease::new(12, 9);
        assert!(ToolchainChoice::Major(12).allows(cu12));
        assert!(!ToolchainChoice::Major(13).allows(cu12));
        assert!(ToolchainChoice::Newest.allows(cu12));
        assert_eq!(ToolchainChoice::Major(12).to_string(), "cuda12");
    }

    #[test]
    fn parses_every_policy_and_rejects_others() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
        }
        assert_eq!("PTX-ONLY".parse::<Policy>(), Ok(Policy::PtxOnly));
        for bad in ["", "sass", "ptx_only", "jit"] {
            let err = bad.parse::<Policy>().unwrap_err();
            assert!(err.to_string().contains("sass-only"), "{err}");
        }
    }

    #[test]
    fn serializes_as_the_cli_spelling() {
        assert_eq!(
            serde_json::to_string(&Policy::SassOnly).unwrap(),
            "\"sass-only\""
        );
    }
}
