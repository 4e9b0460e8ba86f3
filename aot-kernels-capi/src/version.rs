//! The ABI version: `major << 16 | minor`, in the header (`AOT_KERNELS_ABI_VERSION`) and from the
//! library (`aot_abi_version`).
//!
//! The rule: the major changes with any change a compiled caller could trip on (a function
//! removed or renamed, a parameter, struct field or status value changed in meaning or type);
//! the minor changes with additions only (functions, status values, flags). A caller runs with a
//! library of the same major and a minor at least its header's, which `aot_check_abi` checks.

use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

pub const AOT_KERNELS_ABI_VERSION_MAJOR: u32 = 1;
pub const AOT_KERNELS_ABI_VERSION_MINOR: u32 = 2;
/// What the header was generated for; pass it to `aot_check_abi`.
pub const AOT_KERNELS_ABI_VERSION: u32 =
    (AOT_KERNELS_ABI_VERSION_MAJOR << 16) | AOT_KERNELS_ABI_VERSION_MINOR;

/// The library's ABI version, `major << 16 | minor`.
#[no_mangle]
pub extern "C" fn aot_abi_version() -> u32 {
    AOT_KERNELS_ABI_VERSION
}

/// Whether a caller compiled against `header_version` (pass `AOT_KERNELS_ABI_VERSION`) may use
/// this library: the same major and a library minor at least the header's. `AOT_STATUS_ABI_MISMATCH`
/// otherwise, the message naming both versions.
#[no_mangle]
pub extern "C" fn aot_check_abi(header_version: u32) -> AotStatus {
    boundary("aot_check_abi", || {
        compatible(header_version, AOT_KERNELS_ABI_VERSION)
    })
}

fn compatible(header: u32, library: u32) -> Result<(), CapiError> {
    let show = |v: u32| format!("{}.{}", v >> 16, v & 0xffff);
    if header >> 16 == library >> 16 && header & 0xffff <= library & 0xffff {
        return Ok(());
    }
    Err(CapiError::new(
        AotStatus::AbiMismatch,
        format!(
            "the caller was compiled against ABI {} (aot_kernels.h) but this library is ABI {}: build against the header shipped with the library",
            show(header),
            show(library)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_reports_the_header_version() {
        assert_eq!(aot_abi_version(), AOT_KERNELS_ABI_VERSION);
        assert_eq!(aot_abi_version() >> 16, AOT_KERNELS_ABI_VERSION_MAJOR);
        assert_eq!(aot_check_abi(AOT_KERNELS_ABI_VERSION), AotStatus::Ok);
    }

    #[test]
    fn an_older_minor_is_accepted_a_newer_minor_or_other_major_refused() {
        let v = |major: u32, minor: u32| (major << 16) | minor;
        assert!(compatible(v(1, 0), v(1, 2)).is_ok());
        assert!(compatible(v(1, 2), v(1, 2)).is_ok());
        let newer = compatible(v(1, 3), v(1, 2)).unwrap_err();
        assert_eq!(newer.status, AotStatus::AbiMismatch);
        assert!(
            newer.message.contains("ABI 1.3") && newer.message.contains("ABI 1.2"),
            "{}",
            newer.message
        );
        assert!(compatible(v(2, 0), v(1, 2)).is_err());
        assert!(compatible(v(0, 9), v(1, 2)).is_err());
    }
}
