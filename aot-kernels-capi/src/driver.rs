//! The raw driver calls the C layer needs beyond cudarc's owning types: the device of a caller's
//! context, the context of a caller's stream, what the driver knows of a caller's pointer, and
//! leaving the caller's current context as it was. Everything unsafe about foreign handles is here.
//!
//! Each function is called only after `driver_present()` said libcuda opens (cudarc panics on a
//! missing library; the boundary would catch it, but the status would be `INTERNAL`).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use aot_kernels::device::CudaContext;
use aot_kernels::dispatch::translate;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

use crate::status::{AotStatus, CapiError};

fn check(status: AotStatus, what: &str, r: CUresult) -> Result<(), CapiError> {
    r.result()
        .map_err(|e: DriverError| CapiError::new(status, format!("{what}: {}", translate(e))))
}

/// The calling thread's current context, put back on drop: the backend binds its own context to
/// launch (cudarc does), and an engine that keeps another context current on this thread must
/// find it there after the call.
pub(crate) struct RestoreCurrentContext(Option<sys::CUcontext>);

impl RestoreCurrentContext {
    pub fn save() -> Self {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        match unsafe { sys::cuCtxGetCurrent(&mut current) } {
            CUresult::CUDA_SUCCESS => RestoreCurrentContext(Some(current)),
            // Before cuInit no context can be current: restore "none".
            CUresult::CUDA_ERROR_NOT_INITIALIZED => {
                RestoreCurrentContext(Some(std::ptr::null_mut()))
            }
            _ => RestoreCurrentContext(None),
        }
    }
}

impl Drop for RestoreCurrentContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: `ctx` was current on this thread when saved (or null: none); an engine that
            // destroyed it during our call broke its own contract. A failure leaves ours current.
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

/// The device handle and ordinal of a context the caller made.
///
/// # Safety
/// `ctx` must be a live CUDA context (the driver does not validate handles).
pub(crate) unsafe fn context_device(
    ctx: sys::CUcontext,
) -> Result<(sys::CUdevice, usize), CapiError> {
    let dev_err = AotStatus::Device;
    check(dev_err, "cuInit", sys::cuInit(0))?;
    check(
        dev_err,
        "making `cu_context` current to read its device",
        sys::cuCtxPushCurrent_v2(ctx),
    )?;
    let mut device: sys::CUdevice = 0;
    let got = sys::cuCtxGetDevice(&mut device);
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    let _ = sys::cuCtxPopCurrent_v2(&mut popped);
    check(dev_err, "the device of `cu_context`", got)?;
    let mut count = 0;
    check(
        dev_err,
        "cuDeviceGetCount",
        sys::cuDeviceGetCount(&mut count),
    )?;
    for ordinal in 0..count {
        let mut d: sys::CUdevice = 0;
        check(dev_err, "cuDeviceGet", sys::cuDeviceGet(&mut d, ordinal))?;
        if d == device {
            return Ok((device, ordinal as usize));
        }
    }
    Err(CapiError::new(
        dev_err,
        format!("the device of `cu_context` (handle {device}) is none of the {count} devices the driver lists"),
    ))
}

/// Wraps the caller's context without taking it over: see [`ContextLoan`].
///
/// # Safety
/// `ctx` must be a live context on `device` and stay alive while the wrapper (and the backend
/// holding it) is used.
pub(crate) unsafe fn borrow_context(
    ctx: sys::CUcontext,
    device: sys::CUdevice,
    ordinal: usize,
) -> Result<ContextLoan, CapiError> {
    let wrapped = CudaContext::from_raw_context(ordinal, device, ctx).map_err(|e| {
        CapiError::new(
            AotStatus::Device,
            format!("wrapping `cu_context`: {}", translate(e)),
        )
    })?;
    // Event tracking is a flag of this wrapper, not of the driver's context: the backend never
    // allocates through it, and the caller orders its own buffers across its streams.
    wrapped.disable_event_tracking();
    Ok(ContextLoan(ManuallyDrop::new(wrapped)))
}

/// The caller's context, wrapped for cudarc but never destroyed: cudarc's wrapper of a raw
/// context calls `cuCtxDestroy` when its last reference drops, so the loan keeps one reference
/// and, when it drops, forgets the wrapper instead (a wrapper holds only handles and counters;
/// the driver's context stays the caller's). Declared after everything that holds the context,
/// so that modules and streams are released first.
pub(crate) struct ContextLoan(ManuallyDrop<Arc<CudaContext>>);

impl ContextLoan {
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.0
    }
}

impl Drop for ContextLoan {
    fn drop(&mut self) {
        // SAFETY: the field is not used after this line.
        let ctx = unsafe { ManuallyDrop::take(&mut self.0) };
        match Arc::try_unwrap(ctx) {
            Ok(last) => std::mem::forget(last),
            // Someone still holds the wrapper: keep it alive forever rather than let their drop
            // destroy the caller's context.
            Err(shared) => std::mem::forget(shared),
        }
    }
}

/// The context `stream` belongs to.
///
/// # Safety
/// `stream` must be a live, non-null stream handle.
pub(crate) unsafe fn stream_context(stream: sys::CUstream) -> Result<sys::CUcontext, CapiError> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    check(
        AotStatus::WrongContext,
        "the context of `stream`",
        sys::cuStreamGetCtx(stream, &mut ctx),
    )?;
    Ok(ctx)
}

/// Checks that `[ptr, ptr + bytes)` lies in one allocation the driver knows and, for device memory
/// that is not managed, that it is on device `ordinal`. Managed and host memory pass whatever
/// device they were allocated under (the driver names that one, not where the pages live, and
/// every device may reach them).
pub(crate) fn check_allocation(
    name: &str,
    ptr: u64,
    bytes: usize,
    ordinal: usize,
) -> Result<(), CapiError> {
    let mut start: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    let query = |data: *mut c_void, attribute| {
        // SAFETY: a query that writes one value of the attribute's type (CUdeviceptr, size_t)
        // through a valid pointer; the driver validates `ptr` itself.
        unsafe { sys::cuPointerGetAttribute(data, attribute, ptr) }
    };
    let known = query(
        (&mut start as *mut sys::CUdeviceptr).cast(),
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    )
    .result()
    .and_then(|()| {
        query(
            (&mut size as *mut usize).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        )
        .result()
    });
    if let Err(e) = known {
        return Err(CapiError::new(
            AotStatus::BadPointer,
            format!(
                "`{name}` ({ptr:#x}) is not device memory the driver knows ({:?}): pass memory from cuMemAlloc or cudaMalloc, or create the backend with AOT_BACKEND_NO_POINTER_CHECK for memory the driver cannot describe",
                e.0
            ),
        ));
    }
    let end = start.saturating_add(size as u64);
    let wanted_end = ptr.saturating_add(bytes as u64);
    if wanted_end > end {
        return Err(CapiError::new(
            AotStatus::BadPointer,
            format!(
                "`{name}` ({ptr:#x}) is declared {bytes} bytes long but its allocation ends {} bytes after it: declare the length the allocation holds",
                end.saturating_sub(ptr)
            ),
        ));
    }
    let mut device: std::ffi::c_int = -1;
    let named = query(
        (&mut device as *mut std::ffi::c_int).cast(),
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    )
    .result();
    // Another device named: refused only for device memory that is not managed (asked only
    // then, so the common case stays at three queries). The memory type is a CUmemorytype (4
    // bytes); "is managed" a boolean the driver may write in fewer bytes than its zeroed word.
    let device_memory = || {
        let mut memory_type: u32 = 0;
        let mut managed: u32 = 0;
        query(
            (&mut memory_type as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        )
        .result()
        .is_ok()
            && memory_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            && query(
                (&mut managed as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            )
            .result()
            .is_ok()
            && managed == 0
    };
    if named.is_ok() && device >= 0 && device as usize != ordinal && device_memory() {
        return Err(CapiError::new(
            AotStatus::WrongContext,
            format!(
                "`{name}` ({ptr:#x}) is memory of device {device}, the backend's is device {ordinal}: copy it to device {ordinal}, or create the backend with AOT_BACKEND_NO_POINTER_CHECK to pass another device's memory with peer access on"
            ),
        ));
    }
    Ok(())
}
