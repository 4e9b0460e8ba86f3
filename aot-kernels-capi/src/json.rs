//! The dispatch plan and the load report as JSON, copied into the caller's buffer.
//!
//! The buffer protocol: `*len` holds the buffer's capacity in bytes on entry and, on return,
//! the bytes the text needs with its terminating NUL. When the capacity is short (a null buffer
//! with `*len == 0` asks for the size), nothing is written and the status is
//! `AOT_STATUS_HOST_BUFFER_TOO_SMALL`; call again with a buffer of `*len` bytes.

use std::ffi::c_char;

use aot_kernels::dispatch::{plan, DeviceSpec, ModuleSource, Version};

use crate::backend::{backend_ref, policy, AotBackend};
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

/// # Safety
/// `len` is null (an error) or points to a `size_t`; `buf` is null or holds `*len` bytes.
unsafe fn write_text(text: &str, buf: *mut c_char, len: *mut usize) -> Result<(), CapiError> {
    let len = len.as_mut().ok_or_else(|| CapiError::null("len"))?;
    let capacity = *len;
    if buf.is_null() && capacity > 0 {
        return Err(CapiError::null("buf"));
    }
    let needed = text.len() + 1;
    *len = needed;
    if capacity < needed {
        return Err(CapiError::new(
            AotStatus::HostBufferTooSmall,
            format!("`buf` holds {capacity} bytes; the text needs {needed} (now in `*len`)"),
        ));
    }
    // SAFETY: `buf` holds at least `needed` bytes (the caller's capacity, checked above).
    std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
    *buf.add(text.len()) = 0;
    Ok(())
}

fn to_json(value: &impl serde::Serialize) -> Result<String, CapiError> {
    serde_json::to_string_pretty(value)
        .map_err(|e| CapiError::new(AotStatus::Internal, format!("serialising to JSON: {e}")))
}

/// The dispatch plan for the backend's device and policy: for every module, the image chosen
/// and why, or why none fits.
///
/// # Safety
/// `backend` is null or live; `buf` and `len` as the buffer protocol says.
#[no_mangle]
pub unsafe extern "C" fn aot_backend_plan_json(
    backend: *const AotBackend,
    buf: *mut c_char,
    len: *mut usize,
) -> AotStatus {
    boundary("aot_backend_plan_json", || {
        let kernels = backend_ref(backend)?.kernels();
        let plan = plan(
            *kernels.device(),
            kernels.report().policy,
            false,
            &ModuleSource::registry(),
        );
        write_text(&to_json(&plan)?, buf, len)
    })
}

/// The load report: what each module loaded (image, toolchain, JIT or not, load time) and the
/// driver's view of every entry point.
///
/// # Safety
/// As for [`aot_backend_plan_json`].
#[no_mangle]
pub unsafe extern "C" fn aot_backend_report_json(
    backend: *const AotBackend,
    buf: *mut c_char,
    len: *mut usize,
) -> AotStatus {
    boundary("aot_backend_report_json", || {
        let report = backend_ref(backend)?.kernels().report();
        write_text(&to_json(report)?, buf, len)
    })
}

/// The dispatch plan a device of capability `major.minor` on a driver of CUDA
/// `driver_major.driver_minor` would get under `policy`: no GPU or driver needed (what
/// `qwen-decode kernels --simulate` prints).
///
/// # Safety
/// `buf` and `len` as the buffer protocol says.
#[no_mangle]
pub unsafe extern "C" fn aot_plan_json_simulated(
    major: u32,
    minor: u32,
    driver_major: u32,
    driver_minor: u32,
    integrated: u32,
    policy_value: u32,
    buf: *mut c_char,
    len: *mut usize,
) -> AotStatus {
    boundary("aot_plan_json_simulated", || {
        if major == 0 || driver_major == 0 {
            return Err(CapiError::invalid(format!(
                "capability {major}.{minor} on driver {driver_major}.{driver_minor}: `major` and `driver_major` must be at least 1"
            )));
        }
        // `Version::sm` is `major * 10 + minor`: a minor past 9 would name another architecture
        // (12.10 is sm_130), as `X.Y` on the command line refuses.
        for (name, value, max) in [
            ("major", major, 999),
            ("minor", minor, 9),
            ("driver_major", driver_major, 999),
            ("driver_minor", driver_minor, 9),
        ] {
            if value > max {
                return Err(CapiError::invalid(format!(
                    "`{name}` {value}: at most {max} (a capability or CUDA version is X.Y with one minor digit)"
                )));
            }
        }
        if integrated > 1 {
            return Err(CapiError::invalid(format!(
                "`integrated` {integrated} must be 0 (a discrete GPU) or 1 (Jetson-class)"
            )));
        }
        let device = DeviceSpec {
            capability: Version::new(major, minor),
            integrated: integrated == 1,
            driver: Version::new(driver_major, driver_minor),
        };
        let plan = plan(
            device,
            policy(policy_value)?,
            true,
            &ModuleSource::registry(),
        );
        write_text(&to_json(&plan)?, buf, len)
    })
}
