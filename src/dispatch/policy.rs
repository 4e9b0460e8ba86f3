//! How much freedom the dispatcher has: SASS first with PTX fallback, SASS only, or PTX only.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Environment variable that sets the policy when the caller does not pass one.
pub const POLICY_ENV: &str = "AOT_KERNELS_POLICY";

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

#[cfg(test)]
mod tests {
    use super::*;

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
