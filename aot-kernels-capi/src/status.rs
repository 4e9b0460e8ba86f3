//! What every call returns: a status with a stable value, and the error behind a failure (its
//! message goes to the per-thread last error, [`crate::last_error`]).

use aot_kernels::dispatch::DispatchError;
use aot_kernels::ops::OpsError;

/// The result of every call. The values are part of the ABI: they never change meaning, and new
/// ones are only added (a caller treats a value it does not know as a failure).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AotStatus {
    Ok = 0,
    /// A pointer argument is null; the message names it.
    NullArgument = 1,
    /// A device pointer is not aligned as its kernel reads it; the message names it and the
    /// alignment.
    Misaligned = 2,
    /// A device buffer's declared length is below what the shape needs; the message names the
    /// buffer, its length and the need.
    DeviceBufferTooSmall = 3,
    /// A value is out of range (a zero or overflowing shape, an unknown policy or flag, a stride
    /// below a row); the message names it.
    InvalidArgument = 4,
    /// libcuda could not be opened: no NVIDIA driver here. Nothing else was tried.
    NoDriver = 5,
    /// The driver found no such device, or the context could not be read.
    Device = 6,
    /// No image fits the device under the policy, or loading one failed (the message says which
    /// module and the fix).
    Load = 7,
    /// The driver refused a launch.
    Launch = 8,
    /// The stream (or a device pointer) belongs to another CUDA context than the backend's.
    WrongContext = 9,
    /// A host output buffer is too small; `*len` now holds the size needed.
    HostBufferTooSmall = 10,
    /// A device pointer is not memory the driver knows, or its allocation is shorter than the
    /// declared length (the pointer check; see `AOT_BACKEND_NO_POINTER_CHECK`).
    BadPointer = 11,
    /// The header the caller was compiled with has another ABI major than this library, or a
    /// newer minor (it may call what this library lacks).
    AbiMismatch = 12,
    /// A bug in the library (a Rust panic, caught at the boundary); the message says where.
    Internal = 13,
}

/// A failure: its status and a message that names the argument or thing and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapiError {
    pub status: AotStatus,
    pub message: String,
}

impl CapiError {
    pub fn new(status: AotStatus, message: impl Into<String>) -> Self {
        CapiError {
            status,
            message: message.into(),
        }
    }

    pub fn null(what: &str) -> Self {
        Self::new(
            AotStatus::NullArgument,
            format!("`{what}` is null: pass a valid pointer"),
        )
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(AotStatus::InvalidArgument, message)
    }
}

impl From<DispatchError> for CapiError {
    fn from(e: DispatchError) -> Self {
        let status = match &e {
            DispatchError::NoDriver => AotStatus::NoDriver,
            DispatchError::Device { .. } | DispatchError::DriverPanic { .. } => AotStatus::Device,
            DispatchError::ForeignStream { .. } => AotStatus::WrongContext,
            _ => AotStatus::Load,
        };
        CapiError::new(status, e.to_string())
    }
}

impl From<OpsError> for CapiError {
    fn from(e: OpsError) -> Self {
        match e {
            // The C layer checks shapes first; a shape the launcher still refuses is a value the
            // C checks let through, reported as the launcher words it.
            OpsError::Shape { .. } => CapiError::invalid(e.to_string()),
            OpsError::Dispatch(d) => d.into(),
            OpsError::Driver { .. } => CapiError::new(AotStatus::Launch, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_are_the_published_ones() {
        // The header publishes these numbers; changing one breaks every compiled caller.
        let published = [
            (AotStatus::Ok, 0),
            (AotStatus::NullArgument, 1),
            (AotStatus::Misaligned, 2),
            (AotStatus::DeviceBufferTooSmall, 3),
            (AotStatus::InvalidArgument, 4),
            (AotStatus::NoDriver, 5),
            (AotStatus::Device, 6),
            (AotStatus::Load, 7),
            (AotStatus::Launch, 8),
            (AotStatus::WrongContext, 9),
            (AotStatus::HostBufferTooSmall, 10),
            (AotStatus::BadPointer, 11),
            (AotStatus::AbiMismatch, 12),
            (AotStatus::Internal, 13),
        ];
        for (status, value) in published {
            assert_eq!(status as i32, value, "{status:?}");
        }
    }

    #[test]
    fn no_driver_maps_to_its_own_status() {
        let e: CapiError = DispatchError::NoDriver.into();
        assert_eq!(e.status, AotStatus::NoDriver);
        assert!(e.message.contains("no CUDA driver"), "{}", e.message);
    }
}
