//! The one thin layer that launches kernels: shape checks, then the unsafe driver launch.
//! Typed launchers in the op modules build on `launch`; nothing above them sees raw pointers.

use std::marker::PhantomData;

use cudarc::driver::{
    CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};

use crate::dispatch::{DispatchError, LoadedKernels};

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
    check_view(op, what, slice.len(), dims)
}

/// Checks that a buffer of `len` elements holds `rows` rows of `row_len` elements whose starts
/// are `stride` apart.
pub(crate) fn check_rows(
    op: &'static str,
    what: &str,
    len: usize,
    rows: usize,
    row_len: usize,
    stride: usize,
) -> Result<(), OpsError> {
    if stride < row_len {
        return Err(OpsError::Shape {
            op,
            message: format!("`{what}` row stride {stride} is shorter than a row ({row_len})"),
        });
    }
    let want = match rows {
        0 => 0,
        _ => (rows - 1)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(row_len))
            .ok_or_else(|| OpsError::Shape {
                op,
                message: format!("`{what}`: {rows} rows {stride} apart overflow the address space"),
            })?,
    };
    if len < want {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "`{what}` holds {len} elements, {rows} rows of {row_len} with stride {stride} need {want}"
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

/// `n` as a grid dimension (x allows up to 2^31 - 1 blocks, y and z 65535: pass the limit).
pub(crate) fn grid_dim(
    op: &'static str,
    what: &str,
    n: usize,
    limit: u32,
) -> Result<u32, OpsError> {
    u32::try_from(n)
        .ok()
        .filter(|&v| v >= 1 && v <= limit)
        .ok_or_else(|| OpsError::Shape {
            op,
            message: format!("{n} {what} do not fit one launch (1..={limit})"),
        })
}

/// The largest x grid dimension.
pub(crate) const MAX_GRID_X: u32 = i32::MAX as u32;

/// Threads per block for a row of `work` items: a whole number of warps, at most 1024.
pub(crate) fn block_threads(work: usize) -> u32 {
    (work.max(1).next_multiple_of(32)).min(1024) as u32
}

/// A kernel argument, in the order of the kernel's parameter list.
pub(crate) enum Arg<'a> {
    Out(&'a mut CudaSlice<half::bf16>),
    OutF32(&'a mut CudaSlice<f32>),
    OutI32(&'a mut CudaSlice<i32>),
    In(&'a CudaSlice<half::bf16>),
    InI32(&'a CudaSlice<i32>),
    InF32(&'a CudaSlice<f32>),
    I32(i32),
    U64(u64),
    F32(f32),
}

/// A read-only device buffer of `T` (a whole allocation or a view of one), as launchers take it.
/// The address stays private to the launch layer.
#[derive(Debug)]
pub struct DevRef<'a, T> {
    ptr: u64,
    len: usize,
    _borrow: PhantomData<&'a T>,
}

impl<T> Clone for DevRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevRef<'_, T> {}

/// A writable device buffer of `T`.
#[derive(Debug)]
pub struct DevMut<'a, T> {
    ptr: u64,
    len: usize,
    _borrow: PhantomData<&'a mut T>,
}

impl<'a, T> DevRef<'a, T> {
    /// A view of `len` elements at device address `ptr`, for tests of the launchers' checks
    /// (nothing is launched on it).
    #[cfg(test)]
    pub(crate) fn at(ptr: u64, len: usize) -> Self {
        DevRef {
            ptr,
            len,
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements from `start` on (an error if `start` is past the end).
    pub fn skip(self, start: usize) -> Result<DevRef<'a, T>, OpsError> {
        if start > self.len {
            return Err(OpsError::Shape {
                op: "buffer view",
                message: format!(
                    "offset {start} is past the end of a {}-element buffer",
                    self.len
                ),
            });
        }
        Ok(DevRef {
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: self.len - start,
            _borrow: PhantomData,
        })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr
    }
}

impl<'a, T> DevMut<'a, T> {
    /// As [`DevRef::at`], writable.
    #[cfg(test)]
    pub(crate) fn at(ptr: u64, len: usize) -> Self {
        DevMut {
            ptr,
            len,
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reborrows, writable, for a shorter time (to pass it on and keep it).
    pub fn reborrow(&mut self) -> DevMut<'_, T> {
        DevMut {
            ptr: self.ptr,
            len: self.len,
            _borrow: PhantomData,
        }
    }

    /// Reborrows as read-only.
    pub fn as_ref(&self) -> DevRef<'_, T> {
        DevRef {
            ptr: self.ptr,
            len: self.len,
            _borrow: PhantomData,
        }
    }

    /// The elements from `start` on.
    pub fn skip(self, start: usize) -> Result<DevMut<'a, T>, OpsError> {
        if start > self.len {
            return Err(OpsError::Shape {
                op: "buffer view",
                message: format!(
                    "offset {start} is past the end of a {}-element buffer",
                    self.len
                ),
            });
        }
        Ok(DevMut {
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: self.len - start,
            _borrow: PhantomData,
        })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr
    }
}

/// A read-only view of a device allocation (or cudarc view) on the kernels' stream.
pub fn dev<'a, T>(kernels: &'a LoadedKernels, buf: &'a impl DevicePtr<T>) -> DevRef<'a, T> {
    let (ptr, _sync) = buf.device_ptr(kernels.stream());
    DevRef {
        ptr,
        len: buf.len(),
        _borrow: PhantomData,
    }
}

/// A writable view of a device allocation on the kernels' stream.
pub fn dev_mut<'a, T>(
    kernels: &'a LoadedKernels,
    buf: &'a mut impl DevicePtrMut<T>,
) -> DevMut<'a, T> {
    let len = buf.len();
    let (ptr, _sync) = buf.device_ptr_mut(kernels.stream());
    DevMut {
        ptr,
        len,
        _borrow: PhantomData,
    }
}

/// Checks that a view starts on an `align`-byte boundary, as kernels that move vectors of that
/// size need (a view of bf16 read 16 bytes at a time must start a multiple of 8 elements into its
/// allocation).
pub(crate) fn check_aligned(
    op: &'static str,
    what: &str,
    addr: u64,
    align: u64,
) -> Result<(), OpsError> {
    if !addr.is_multiple_of(align) {
        let elems = align / 2;
        return Err(OpsError::Shape {
            op,
            message: format!(
                "`{what}` starts at {addr:#x}, not on a {align}-byte boundary: offset views by a multiple of {align} bytes ({elems} bf16 or {} f32)",
                align / 4
            ),
        });
    }
    Ok(())
}

/// Checks that a view holds at least the elements of shape `dims`.
pub(crate) fn check_view(
    op: &'static str,
    what: &str,
    len: usize,
    dims: &[usize],
) -> Result<(), OpsError> {
    let want = elements(op, what, dims)?;
    if len < want {
        return Err(OpsError::Shape {
            op,
            message: format!("`{what}` holds {len} elements, the shape needs {want}"),
        });
    }
    Ok(())
}

/// Launches `entry` with one by-value parameter block (a `#[repr(C)]` mirror of the kernel's
/// struct, filled from checked views). Raises the function's dynamic shared-memory limit first
/// when static plus dynamic shared memory pass the default 48 KiB. With programmatic dependent
/// launch as the caller chooses (it must have checked [`LoadedKernels::overlap_launch`] or
/// `programmatic_launch` for `module` first), and as thread-block clusters of `cluster` blocks
/// (x, y, z) when given (it must have checked [`LoadedKernels::cluster_fits`] for the entry, and
/// each cluster dimension must divide the grid's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_params_pdl<P: DeviceRepr + Copy>(
    kernels: &LoadedKernels,
    op: &'static str,
    module: &str,
    entry: &str,
    cfg: LaunchConfig,
    params: &P,
    programmatic: bool,
    cluster: Option<(u32, u32, u32)>,
) -> Result<(), OpsError> {
    let function: CudaFunction = kernels.function(module, entry)?;
    if cfg.shared_mem_bytes > 0 {
        kernels.allow_dynamic_smem(module, entry, cfg.shared_mem_bytes as usize)?;
    }
    let mut value = *params;
    // SAFETY: `P` mirrors the kernel's parameter struct field for field (see each op's module),
    // every address in it comes from a view the launcher checked against the kernel's shapes,
    // and the views borrow their allocations for the duration of this call; the launch is
    // ordered on the kernels' single stream, before any later free of those allocations. With
    // `programmatic`, the module's image was built for sm_90+, whose code waits for the previous
    // kernel (griddepcontrol.wait) before reading its results; with `cluster`, the caller checked
    // that the image is sm_90+ code on a GPU with clusters.
    unsafe {
        crate::dispatch::driver::launch_with_params(
            &function,
            kernels.stream(),
            cfg,
            (&mut value as *mut P).cast(),
            programmatic,
            cluster,
        )
    }
    .map_err(|source| OpsError::Driver { op, source })
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
    if cfg.shared_mem_bytes > 0 {
        kernels.allow_dynamic_smem(module, entry, cfg.shared_mem_bytes as usize)?;
    }
    let stream = kernels.stream();
    let mut builder = stream.launch_builder(&function);
    // Scalars are pushed by reference; they live in `args` until the launch returns.
    for arg in args.iter_mut() {
        match arg {
            Arg::Out(s) => builder.arg(&mut **s),
            Arg::OutF32(s) => builder.arg(&mut **s),
            Arg::OutI32(s) => builder.arg(&mut **s),
            Arg::In(s) => builder.arg(&**s),
            Arg::InI32(s) => builder.arg(&**s),
            Arg::InF32(s) => builder.arg(&**s),
            Arg::I32(v) => builder.arg(&*v),
            Arg::U64(v) => builder.arg(&*v),
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
