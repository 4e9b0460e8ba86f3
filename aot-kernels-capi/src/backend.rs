//! The backend handle: the kernels loaded once on a device (its primary context) or on the
//! caller's context, and the per-stream handles launches go through.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use aot_kernels::dispatch::{
    self, driver::driver_present, load_available, LoadedKernels, ModuleSource, Policy,
};
use cudarc::driver::sys;

use crate::args::{DeviceArg, Extent};
use crate::driver::{self as raw, ContextLoan, RestoreCurrentContext};
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

/// The dispatch policy, as `aot_backend_create*` takes it (a `uint32_t`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AotPolicy {
    /// Exact SASS, then compatible SASS, then PTX the driver compiles.
    Auto = 0,
    /// Always the PTX fallback (tests the path GPUs without SASS take).
    PtxOnly = 1,
    /// SASS or an error: never a JIT at load.
    SassOnly = 2,
}

/// Flag of `aot_backend_create*`: skip the check that each device pointer lies in an allocation
/// the driver knows, long enough for its declared length (one `cuPointerGetAttribute` pair per
/// buffer and launch). For memory the driver cannot describe, or a launch path measured to need it.
pub const AOT_BACKEND_NO_POINTER_CHECK: u32 = 1;
const KNOWN_FLAGS: u32 = AOT_BACKEND_NO_POINTER_CHECK;

/// Streams whose handles a backend keeps; an engine that makes and drops streams without end
/// starts the list over rather than grow it.
const MAX_STREAMS: usize = 64;

pub(crate) fn policy(value: u32) -> Result<Policy, CapiError> {
    match value {
        0 => Ok(Policy::Auto),
        1 => Ok(Policy::PtxOnly),
        2 => Ok(Policy::SassOnly),
        _ => Err(CapiError::invalid(format!(
            "`policy` {value} is not a policy: AOT_POLICY_AUTO (0), AOT_POLICY_PTX_ONLY (1) or AOT_POLICY_SASS_ONLY (2)"
        ))),
    }
}

fn flags(value: u32) -> Result<bool, CapiError> {
    if value & !KNOWN_FLAGS != 0 {
        return Err(CapiError::invalid(format!(
            "`flags` {value:#x} has unknown bits {:#x}: the flags are AOT_BACKEND_NO_POINTER_CHECK (1)",
            value & !KNOWN_FLAGS
        )));
    }
    Ok(value & AOT_BACKEND_NO_POINTER_CHECK == 0)
}

/// Kernels loaded on one device. Opaque to C. `Send + Sync`: any thread may launch through it,
/// concurrently; destroying it while another thread uses it is the caller's bug, as with any
/// handle.
pub struct AotBackend {
    kernels: LoadedKernels,
    /// Handles on the caller's streams, by stream handle.
    streams: Mutex<Vec<(usize, Arc<LoadedKernels>)>>,
    check_pointers: bool,
    /// The caller's context, when the backend was made in one: declared last, so that it is
    /// released after the modules and streams that use it.
    _loan: Option<ContextLoan>,
}

// Threads share a backend (the C contract above): checked at compile time.
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<AotBackend>();
};

impl AotBackend {
    pub(crate) fn kernels(&self) -> &LoadedKernels {
        &self.kernels
    }

    /// Runs `launch` on the kernels bound to the caller's `stream` (null: the legacy default
    /// stream, as in CUDA), after checking the stream's context and, unless turned off, each
    /// buffer against its allocation. The caller's current context is restored afterwards.
    pub(crate) fn launch(
        &self,
        stream: *mut c_void,
        buffers: &[(&'static str, u64, usize)],
        launch: impl FnOnce(&LoadedKernels) -> Result<(), aot_kernels::ops::OpsError>,
    ) -> Result<(), CapiError> {
        let _restore = RestoreCurrentContext::save();
        if self.check_pointers {
            for &(name, ptr, bytes) in buffers {
                raw::check_allocation(name, ptr, bytes, self.kernels.context().ordinal())?;
            }
        }
        let kernels = self.on_stream(stream.cast())?;
        launch(&kernels).map_err(CapiError::from)
    }

    /// `AOT_STATUS_LOAD` naming the first of `modules` this backend did not load, and why (the
    /// plan's reason: the Triton modules are built with CUDA 13 only, so a 12.x driver has none),
    /// before `op` reaches a launcher that would word it as a bad argument.
    pub(crate) fn require_modules(&self, op: &str, modules: &[&str]) -> Result<(), CapiError> {
        let report = self.kernels.report();
        let Some(missing) = modules.iter().find(|name| report.module(name).is_none()) else {
            return Ok(());
        };
        let plan = dispatch::plan(
            report.device,
            report.policy,
            false,
            &ModuleSource::registry(),
        );
        let why = plan
            .modules
            .iter()
            .find(|m| m.module == *missing)
            .and_then(|m| m.unavailable.clone().or_else(|| m.error.clone()))
            .unwrap_or_else(|| "no image of it was loaded".to_string());
        Err(CapiError::new(
            AotStatus::Load,
            format!(
                "{op} needs module `{missing}`, which this backend did not load: {why} (device {}: {}; the Triton modules of the Gated DeltaNet and MoE ops are built with CUDA 13 only and need a driver that supports CUDA 13.0; aot_backend_report_json lists what was loaded)",
                report.ordinal, report.device
            ),
        ))
    }

    fn on_stream(&self, stream: sys::CUstream) -> Result<Arc<LoadedKernels>, CapiError> {
        let ours = self.kernels.context().cu_ctx();
        if !stream.is_null() {
            // SAFETY: a non-null handle the caller passed as a live stream (the C contract).
            let owner = unsafe { raw::stream_context(stream)? };
            if owner != ours {
                return Err(CapiError::new(
                    AotStatus::WrongContext,
                    format!(
                        "`stream` belongs to another CUDA context than the backend's (device {}): launch on a stream of the backend's context, or create a backend in that context (aot_backend_create_in_context)",
                        self.kernels.context().ordinal()
                    ),
                ));
            }
        }
        let key = stream as usize;
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = streams.iter().find(|(s, _)| *s == key) {
            return Ok(k.clone());
        }
        if streams.len() >= MAX_STREAMS {
            streams.clear();
        }
        // SAFETY: the stream belongs to this context (checked above; null is the legacy stream);
        // the wrapper never destroys it, and the caller keeps it alive while launching on it.
        let wrapped = unsafe { self.kernels.context().wrap_borrowed_stream(stream) };
        let handle = Arc::new(self.kernels.on_stream(wrapped)?);
        streams.push((key, handle.clone()));
        Ok(handle)
    }
}

/// The backend behind a caller's pointer.
///
/// # Safety
/// `backend` is null or a pointer `aot_backend_create*` returned and not yet destroyed.
pub(crate) unsafe fn backend_ref<'a>(
    backend: *const AotBackend,
) -> Result<&'a AotBackend, CapiError> {
    backend.as_ref().ok_or_else(|| CapiError::null("backend"))
}

/// The bytes of a checked buffer, as [`AotBackend::launch`] checks them against the driver.
pub(crate) fn span<T>(arg: &DeviceArg<T>) -> Extent {
    arg.extent()
}

/// Writes NULL to `*out` (when `out` is not null) before anything can fail, so that a failed
/// create leaves NULL, which `aot_backend_destroy` takes, rather than whatever the caller's
/// variable held.
///
/// # Safety
/// `out` is null or points to writable storage for one pointer.
unsafe fn clear(out: *mut *mut AotBackend) {
    // SAFETY: the function's contract.
    if let Some(out) = unsafe { out.as_mut() } {
        *out = std::ptr::null_mut();
    }
}

fn create(
    out: *mut *mut AotBackend,
    policy_value: u32,
    flag_bits: u32,
    open: impl FnOnce() -> Result<(dispatch::OpenDevice, Option<ContextLoan>), CapiError>,
) -> Result<(), CapiError> {
    if out.is_null() {
        return Err(CapiError::null("out"));
    }
    let policy = policy(policy_value)?;
    let check_pointers = flags(flag_bits)?;
    if !driver_present() {
        return Err(dispatch::DispatchError::NoDriver.into());
    }
    let _restore = RestoreCurrentContext::save();
    let (device, loan) = open()?;
    let kernels = load_available(&device, policy, &ModuleSource::registry())?;
    let backend = Box::new(AotBackend {
        kernels,
        streams: Mutex::new(Vec::new()),
        check_pointers,
        _loan: loan,
    });
    // SAFETY: `out` is non-null (checked) and points to writable storage for one pointer.
    unsafe { *out = Box::into_raw(backend) };
    Ok(())
}

/// Loads the kernels on device `ordinal` (its primary context, retained until destroy) under
/// `policy` (an `AotPolicy` value) with `flags` (0 or `AOT_BACKEND_NO_POINTER_CHECK`), and
/// writes the backend to `*out` (NULL when it fails, so that destroying it is harmless). Arguments
/// are checked before the driver is opened: a bad one gets its status even on a machine without a
/// GPU.
///
/// # Safety
/// `out` is null (an error) or points to storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn aot_backend_create(
    ordinal: i32,
    policy: u32,
    flags: u32,
    out: *mut *mut AotBackend,
) -> AotStatus {
    boundary("aot_backend_create", || {
        // SAFETY: `out` is null or storage for one pointer (the caller's contract).
        unsafe { clear(out) };
        let ordinal = usize::try_from(ordinal).map_err(|_| {
            CapiError::invalid(format!(
                "`ordinal` {ordinal} is negative: pass a device index from 0"
            ))
        })?;
        create(out, policy, flags, || {
            Ok((dispatch::open_device(ordinal)?, None))
        })
    })
}

/// Loads the kernels on the caller's `cu_context` (a `CUcontext`, current or not, on any device),
/// which stays the caller's: the backend never destroys it, and the caller destroys it only after
/// `aot_backend_destroy`. The calling thread's current context is the same after the call.
///
/// # Safety
/// `cu_context` is null (an error) or a live `CUcontext`; `out` as for [`aot_backend_create`].
#[no_mangle]
pub unsafe extern "C" fn aot_backend_create_in_context(
    cu_context: *mut c_void,
    policy: u32,
    flags: u32,
    out: *mut *mut AotBackend,
) -> AotStatus {
    boundary("aot_backend_create_in_context", || {
        // SAFETY: as for `aot_backend_create`.
        unsafe { clear(out) };
        if cu_context.is_null() {
            return Err(CapiError::null("cu_context"));
        }
        create(out, policy, flags, || {
            let ctx: sys::CUcontext = cu_context.cast();
            // SAFETY: a live context, the caller's contract.
            let (device, ordinal) = unsafe { raw::context_device(ctx)? };
            // SAFETY: as above; it outlives the backend (the caller's contract).
            let loan = unsafe { raw::borrow_context(ctx, device, ordinal)? };
            let open = dispatch::open_context(loan.context().clone())?;
            Ok((open, Some(loan)))
        })
    })
}

/// Releases the backend: its modules, its own stream and (for `aot_backend_create`) its
/// reference to the primary context. Null is accepted (nothing to do). Wait for the launches
/// queued through it to finish first (synchronise the streams).
///
/// # Safety
/// `backend` is null or a pointer `aot_backend_create*` returned, not yet destroyed, that no
/// other thread is using.
#[no_mangle]
pub unsafe extern "C" fn aot_backend_destroy(backend: *mut AotBackend) -> AotStatus {
    boundary("aot_backend_destroy", || {
        if !backend.is_null() {
            let _restore = RestoreCurrentContext::save();
            // SAFETY: a pointer from `Box::into_raw` in `create`, released once (the contract).
            drop(unsafe { Box::from_raw(backend) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_the_published_values_and_others_are_named() {
        assert_eq!(policy(AotPolicy::Auto as u32).unwrap(), Policy::Auto);
        assert_eq!(policy(AotPolicy::PtxOnly as u32).unwrap(), Policy::PtxOnly);
        assert_eq!(
            policy(AotPolicy::SassOnly as u32).unwrap(),
            Policy::SassOnly
        );
        let e = policy(3).unwrap_err();
        assert_eq!(e.status, AotStatus::InvalidArgument);
        assert!(
            e.message.starts_with("`policy` 3 is not a policy"),
            "{}",
            e.message
        );
    }

    #[test]
    fn unknown_flag_bits_are_named_and_the_pointer_check_is_on_by_default() {
        assert!(flags(0).unwrap());
        assert!(!flags(AOT_BACKEND_NO_POINTER_CHECK).unwrap());
        let e = flags(0x6).unwrap_err();
        assert!(e.message.contains("unknown bits 0x6"), "{}", e.message);
    }
}
