//! Device memory, streams, events and graphs as the launchers take them: cudarc's types,
//! re-exported so that an engine uses exactly the ones the backend was built with, plus the two
//! calls graph capture needs.

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
pub use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, ValidAsZeroBits,
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
