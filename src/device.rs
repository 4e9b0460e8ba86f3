//! Device memory, streams, events and graphs as the launchers take them: cudarc's types,
//! re-exported so that an engine uses exactly the ones the backend was built with, plus the two
//! calls graph capture needs.

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
pub use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, PinnedHostSlice, ValidAsZeroBits,
};

/// Starts recording the launches this thread makes on `stream` into a graph.
pub fn begin_capture(stream: &CudaStream) -> Result<(), DriverError> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
}

/// Stops recording and instantiates the graph (`None` if nothing was captured).
pub fn end_capture(stream: &Arc<CudaStream>) -> Result<Option<CudaGraph>, DriverError> {
    stream.end_capture(CUgraphInstantiate_flags(0))
}

/// An event that records time (cudarc's default events do not), for `elapsed_ms`.
pub fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, DriverError> {
    ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
}

/// `len` zeroed values of page-locked host memory: copies to and from it are asynchronous, so a
/// host can queue work and wait for one copy instead of the whole stream. The contexts the
/// dispatcher opens do not track events, so the slice's own accessors do not wait for copies:
/// record an event after a copy and wait for it before touching the memory.
pub fn pinned_host<T: DeviceRepr + ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<T>, DriverError> {
    // SAFETY: the memory is uninitialised until the zeroing below, and nothing reads it before.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0)? };
    let values = host.as_mut_slice()?;
    // SAFETY: T is valid as zero bits; the slice spans exactly the allocation.
    unsafe { std::ptr::write_bytes(values.as_mut_ptr(), 0, values.len()) };
    Ok(host)
}

pub use cudarc::driver::Profiler;

/// Starts the profiler's collection (`cuProfilerStart`) until the guard drops
/// (`cuProfilerStop`): with `ncu --profile-from-start off`, only what runs in between is captured.
pub fn profiler_start() -> Result<Profiler, DriverError> {
    Profiler::new()
}
