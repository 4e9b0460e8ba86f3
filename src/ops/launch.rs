//! The one thin layer that launches kernels: shape checks, then the unsafe driver launch.
//! Typed launchers in the op modules build on [`launch`]; nothing above them sees raw pointers.

use cudarc::driver::{CudaFunction, CudaSlice, DriverError, LaunchConfig, PushKernelArg};

use crate::dispatch::{DispatchError, LoadedKernels};

/// Every (module, entry) a typed launcher calls. A test checks this against the manifest, so a
/// kernel added to the manifest without a launcher (or the reverse) is caught.
pub const LAUNCHED_ENTRIES: &[(&str, &str)] = &[
    (super::rmsnorm::MODULE, super::rmsnorm::ENTRY_PLAIN),
    (super::rmsnorm::MODULE, super::rmsnorm::ENTRY_FUSED_ADD),
    (super::rotary::MODULE, super::rotary::ENTRY),
    (super::activation::MODULE, super::activation::ENTRY),
    (
        super::gated_delta_net::MODULE_CONV,
        super::gated_delta_net::ENTRY_CONV,
    ),
    (
        super::gated_delta_net::MODULE_RECURRENT,
        super::gated_delta_net::ENTRY_RECURRENT,
    ),
    (
        super::gated_delta_net::MODULE_PREFILL,
        super::gated_delta_net::ENTRY_PREFILL,
    ),
    (
        super::gated_delta_net::MODULE_NORM,
        super::gated_delta_net::ENTRY_NORM,
    ),
    (super::moe::MODULE_ROUTER, super::moe::ENTRY_ROUTER),
    (super::moe::MODULE_ROUTE, super::moe::ENTRY_ROUTE),
    (super::moe::MODULE_GATE_UP, super::moe::ENTRY_GATE_UP),
    (super::moe::MODULE_DOWN, super::moe::ENTRY_DOWN),
];

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("{op}: {message}")]
    Shape { op: &'static str, message: String },
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    #[error("{op}: launch failed: {source}")]
    Driver {
        op: &'static str,
        source: DriverError,
    },
}

/// Checks that `slice` holds at least the elements of the shape `dims` (an overflowing shape is
/// an error too, so a wrapped product can never let a small buffer pass).
pub(crate) fn check_len<T>(
    op: &'static str,
    what: &str,
    slice: &CudaSlice<T>,
    dims: &[usize],
) -> Result<(), OpsError> {
    let want = elements(op, what, dims)?;
    if slice.len() < want {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "`{what}` holds {} elements, the shape needs {want}",
                slice.len()
            ),
        });
    }
    Ok(())
}

/// The number of elements of a shape, or a shape error if it does not fit in memory.
pub(crate) fn elements(op: &'static str, what: &str, dims: &[usize]) -> Result<usize, OpsError> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| OpsError::Shape {
            op,
            message: format!("`{what}` of shape {dims:?} overflows the address space"),
        })
}

pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32, OpsError> {
    i32::try_from(v).map_err(|_| OpsError::Shape {
        op,
        message: format!("`{what}` = {v} does not fit the kernel's 32-bit index"),
    })
}

/// Threads per block for a row of `work` items: a whole number of warps, at most 1024.
pub(crate) fn block_threads(work: usize) -> u32 {
    (work.max(1).next_multiple_of(32)).min(1024) as u32
}

/// A kernel argument, in the order of the kernel's parameter list.
pub(crate) enum Arg<'a> {
    Out(&'a mut CudaSlice<half::bf16>),
    In(&'a CudaSlice<half::bf16>),
    InI32(&'a CudaSlice<i32>),
    InF32(&'a CudaSlice<f32>),
    I32(i32),
    F32(f32),
}

/// Launches `entry` of `module` with arguments whose shapes the caller has checked.
pub(crate) fn launch(
    kernels: &LoadedKernels,
    op: &'static str,
    module: &str,
    entry: &str,
    cfg: LaunchConfig,
    args: &mut [Arg<'_>],
) -> Result<(), OpsError> {
    let function: CudaFunction = kernels.function(module, entry)?;
    let stream = kernels.stream();
    let mut builder = stream.launch_builder(&function);
    // Scalars are pushed by reference; they live in `args` until the launch returns.
    for arg in args.iter_mut() {
        match arg {
            Arg::Out(s) => builder.arg(&mut **s),
            Arg::In(s) => builder.arg(&**s),
            Arg::InI32(s) => builder.arg(&**s),
            Arg::InF32(s) => builder.arg(&**s),
            Arg::I32(v) => builder.arg(&*v),
            Arg::F32(v) => builder.arg(&*v),
        };
    }
    // SAFETY: each op checks every buffer against its shape before calling here, the argument
    // list follows the kernel's signature in kernels/, and cudarc orders the launch on `stream`
    // after earlier work on the same buffers.
    unsafe { builder.launch(cfg) }
        .map(|_| ())
        .map_err(|source| OpsError::Driver { op, source })
}
