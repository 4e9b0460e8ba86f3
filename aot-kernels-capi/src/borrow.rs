//! The caller's device memory as the launchers take it (`CudaSlice`), without ever owning it.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::args::DeviceArg;

/// A `CudaSlice` over memory the caller owns: cudarc's slice frees its memory when dropped, so it
/// is held in `ManuallyDrop` and handed back with `leak` (which frees nothing), also when a panic
/// unwinds through the launch.
pub(crate) struct Borrowed<T>(ManuallyDrop<CudaSlice<T>>);

impl<T> Borrowed<T> {
    /// # Safety
    /// `arg` passed the checks of [`crate::args::device_buffer`] and, by the C contract, addresses
    /// `arg.len` elements of device memory usable in `stream`'s context that stay allocated until
    /// the work queued on them is done. The context's event tracking is off (the backend turns it
    /// off on every context it uses), so the slice records no events.
    pub unsafe fn new(stream: &Arc<CudaStream>, arg: DeviceArg<T>) -> Self {
        Borrowed(ManuallyDrop::new(
            stream.upgrade_device_ptr(arg.ptr, arg.len),
        ))
    }
}

impl<T> Deref for Borrowed<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.0
    }
}

impl<T> DerefMut for Borrowed<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

impl<T> Drop for Borrowed<T> {
    fn drop(&mut self) {
        // SAFETY: the slice is not used after this; `leak` releases its stream reference and
        // returns the address without freeing it.
        let slice = unsafe { ManuallyDrop::take(&mut self.0) };
        let _caller_owns_it = slice.leak();
    }
}

/// A backend scratch struct that owns `CudaSlice`s ([`aot_kernels::ops::gated_delta_net::GdnScratch`],
/// [`aot_kernels::ops::moe::MoeScratch`]) whose slices lie in the caller's workspace: handed back
/// without freeing, as [`Borrowed`] does, also when a panic unwinds through the launch.
pub(crate) trait CallerSlices {
    /// Lets go of every slice without freeing it.
    fn leak_slices(self);
}

pub(crate) struct Lent<S: CallerSlices>(ManuallyDrop<S>);

impl<S: CallerSlices> Lent<S> {
    /// `scratch`'s slices were made with [`slice`] (or point nowhere the backend frees).
    pub fn new(scratch: S) -> Self {
        Lent(ManuallyDrop::new(scratch))
    }
}

impl<S: CallerSlices> Deref for Lent<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.0
    }
}

impl<S: CallerSlices> DerefMut for Lent<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.0
    }
}

impl<S: CallerSlices> Drop for Lent<S> {
    fn drop(&mut self) {
        // SAFETY: the scratch is not used after this; `leak_slices` frees none of its memory.
        unsafe { ManuallyDrop::take(&mut self.0) }.leak_slices();
    }
}

/// A `CudaSlice` over the caller's checked buffer (a part of its workspace), for a scratch struct
/// held in [`Lent`] at once.
///
/// # Safety
/// As for [`Borrowed::new`]; the slice must be leaked, never dropped.
pub(crate) unsafe fn slice<T>(stream: &Arc<CudaStream>, arg: DeviceArg<T>) -> CudaSlice<T> {
    stream.upgrade_device_ptr(arg.ptr, arg.len)
}
