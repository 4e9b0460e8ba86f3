//! Which CUDA toolkit made an image, as far as the image itself says.
//!
//! Evidence, best first: a toolkit string (`Cuda compilation tools, release 12.9, V12.9.86`, in a
//! cubin's `.note.nv.tkinfo` or a PTX file's header comment) gives the release; without one, a
//! cubin's ELF ABI version or a PTX `.version` (ISA 8.x comes from CUDA 12, 9.x from CUDA 13)
//! gives the major only. ABI 7 (layout v1) is CUDA 12's (and older); ABI 8 (layout v2) is what
//! ptxas 13.x writes for every SM, but ptxas 12.9 writes it too for sm_100 and later, so ABI 8
//! says CUDA 13 only below sm_100. (fatbinary blanks PTX comments, so PTX inside a fatbin has
//! only its ISA to tell.)

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A CUDA release: `13.0`, or `12.x` when only the major is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaRelease {
    pub major: u32,
    pub minor: Option<u32>,
}

impl CudaRelease {
    pub const fn new(major: u32, minor: u32) -> Self {
        CudaRelease {
            major,
            minor: Some(minor),
        }
    }

    pub const fn major_only(major: u32) -> Self {
        CudaRelease { major, minor: None }
    }

    /// Whether an image of this release can be one of `toolchain`'s: same release, or the same
    /// major when the image records only that.
    pub fn matches(&self, toolchain: &CudaRelease) -> bool {
        self.major == toolchain.major && (self.minor.is_none() || self.minor == toolchain.minor)
    }
}

impl fmt::Display for CudaRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.minor {
            Some(minor) => write!(f, "{}.{minor}", self.major),
            None => write!(f, "{}.x", self.major),
        }
    }
}

/// A release string that is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a CUDA release: expected MAJOR.MINOR, for example `13.0` or `12.9`")]
pub struct ParseReleaseError(pub String);

impl FromStr for CudaRelease {
    type Err = ParseReleaseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseReleaseError(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let number = |p: &str| -> Result<u32, ParseReleaseError> {
            if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse().map_err(|_| err())
        };
        Ok(CudaRelease::new(number(major)?, number(minor)?))
    }
}

impl Serialize for CudaRelease {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CudaRelease {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `Cuda compilation tools, release 12.9, V12.9.86` -> 12.9.
pub fn release_of_toolkit_string(s: &str) -> Option<CudaRelease> {
    let rest = &s[s.find("release ")? + "release ".len()..];
    let word = rest.split([',', ' ']).next()?;
    word.parse().ok()
}

/// `Cuda compilation tools, release 12.9, V12.9.86` -> "12.9.86".
pub fn version_of_toolkit_string(s: &str) -> Option<String> {
    s.split([' ', ','])
        .filter_map(|w| w.strip_prefix('V'))
        .find(|v| {
            v.split('.').count() == 3
                && v.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// The toolkit string in the header comment nvcc and NVRTC write at the top of PTX
/// (`// Cuda compilation tools, release 12.9, V12.9.86`); only leading comment lines are read.
pub fn ptx_toolkit_string(ptx: &[u8]) -> Option<String> {
    for line in ptx.split(|&b| b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let comment = line.strip_prefix(b"//")?;
        let text = String::from_utf8_lossy(comment.trim_ascii());
        if text.starts_with("Cuda compilation tools") {
            return Some(text.into_owned());
        }
    }
    None
}

/// The CUDA major whose ptxas writes this cubin ELF ABI version for SM `sm`. 7 was written by
/// CUDA 11 and 12 alike, taken here as 12 (no toolchain older than 12 is supported); 8 below
/// sm_100 only by CUDA 13 (ptxas 12.9 writes 8 for sm_100 and later too: unknown there).
pub fn major_of_elf_abi(abi: u32, sm: u32) -> Option<u32> {
    match abi {
        8 if sm < 100 => Some(13),
        7 => Some(12),
        _ => None,
    }
}

/// The CUDA major that emits a PTX ISA version: 7.x came with CUDA 11, 8.x with 12, 9.x with 13.
pub fn major_of_ptx_isa(isa: (u32, u32)) -> Option<u32> {
    match isa.0 {
        7 => Some(11),
        8 => Some(12),
        9 => Some(13),
        _ => None,
    }
}

/// The release an image records: its toolkit string if it has one, else the major its format
/// implies. `elf_abi` is a cubin's (ABI version, SM).
pub fn image_release(
    toolkit: Option<&str>,
    elf_abi: Option<(u32, u32)>,
    ptx_version: Option<(u32, u32)>,
) -> Option<CudaRelease> {
    toolkit
        .and_then(release_of_toolkit_string)
        .or_else(|| {
            elf_abi
                .and_then(|(abi, sm)| major_of_elf_abi(abi, sm))
                .map(CudaRelease::major_only)
        })
        .or_else(|| {
            ptx_version
                .and_then(major_of_ptx_isa)
                .map(CudaRelease::major_only)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TK: &str = "Cuda compilation tools, release 12.9, V12.9.86";

    #[test]
    fn reads_release_and_version_from_toolkit_strings() {
        assert_eq!(release_of_toolkit_string(TK), Some(CudaRelease::new(12, 9)));
        assert_eq!(version_of_toolkit_string(TK).as_deref(), Some("12.9.86"));
        assert_eq!(release_of_toolkit_string("no release here"), None);
        assert_eq!(release_of_toolkit_string("release x.y"), None);
    }

    #[test]
    fn finds_the_toolkit_comment_in_the_ptx_header_only() {
        let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n//\n// Compiler Build ID: CL-1\n// Cuda compilation tools, release 12.9, V12.9.86\n// Based on NVVM 7.0.1\n//\n\n.version 8.8\n";
        assert_eq!(ptx_toolkit_string(ptx).as_deref(), Some(TK));
        // A comment after the first directive is not the header.
        assert_eq!(
            ptx_toolkit_string(
                b".version 9.0\n// Cuda compilation tools, release 13.0, V13.0.88\n"
            ),
            None
        );
        assert_eq!(ptx_toolkit_string(b""), None);
    }

    #[test]
    fn falls_back_to_the_major_the_format_implies() {
        assert_eq!(
            image_release(None, Some((8, 90)), None),
            Some(CudaRelease::major_only(13))
        );
        // ptxas 12.9 writes ABI 8 for Blackwell: no toolkit string, no verdict.
        assert_eq!(image_release(None, Some((8, 100)), None), None);
        assert_eq!(
            image_release(None, Some((7, 90)), None),
            Some(CudaRelease::major_only(12))
        );
        assert_eq!(
            image_release(None, None, Some((8, 8))),
            Some(CudaRelease::major_only(12))
        );
        assert_eq!(
            image_release(Some(TK), Some((8, 120)), None),
            Some(CudaRelease::new(12, 9))
        );
        assert_eq!(image_release(None, Some((5, 90)), Some((6, 0))), None);
    }

    #[test]
    fn releases_parse_print_and_match() {
        let r: CudaRelease = "12.9".parse().unwrap();
        assert_eq!(r.to_string(), "12.9");
        assert_eq!(CudaRelease::major_only(12).to_string(), "12.x");
        assert!(CudaRelease::major_only(12).matches(&r));
        assert!(r.matches(&r));
        assert!(!CudaRelease::new(12, 8).matches(&r));
        assert!(!CudaRelease::major_only(13).matches(&r));
        for bad in ["", "12", "12.", ".9", "12.9.86", "x.y"] {
            assert!(bad.parse::<CudaRelease>().is_err(), "{bad}");
        }
    }
}
