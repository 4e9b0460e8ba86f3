//! Checks of what a caller passes, before anything reaches the driver: every device buffer is
//! non-null, aligned as its kernel reads it, and declared long enough for the shape; every shape
//! is positive and fits the address space. Pure functions: they run without a GPU.

use std::marker::PhantomData;

use crate::status::{AotStatus, CapiError};

/// A device address (`CUdeviceptr`, or a `cudaMalloc` pointer cast to an integer).
pub type AotDevicePtr = u64;

/// A device buffer that passed the checks: its address and declared length in elements of `T`.
#[derive(Debug)]
pub(crate) struct DeviceArg<T> {
    pub name: &'static str,
    pub ptr: u64,
    pub len: usize,
    _elem: PhantomData<T>,
}

impl<T> Clone for DeviceArg<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceArg<T> {}

impl<T> DeviceArg<T> {
    /// Bytes the caller declared.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

/// The elements a shape holds, and how to say it in a message (`rows 4 x hidden 2048`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Need {
    pub elements: usize,
    pub text: String,
}

/// `dims` multiplied out; an error naming the shape when the product overflows.
pub(crate) fn need(dims: &[(&str, usize)]) -> Result<Need, CapiError> {
    let text = dims
        .iter()
        .map(|(name, v)| format!("{name} {v}"))
        .collect::<Vec<_>>()
        .join(" x ");
    let elements = dims
        .iter()
        .try_fold(1usize, |n, &(_, d)| n.checked_mul(d))
        .ok_or_else(|| {
            CapiError::invalid(format!("the shape {text} overflows the address space"))
        })?;
    Ok(Need { elements, text })
}

/// `rows` rows of `row` elements whose starts are `stride` apart: `(rows - 1) * stride + row`.
pub(crate) fn strided_need(
    rows: usize,
    row: (&str, usize),
    stride: (&str, usize),
) -> Result<Need, CapiError> {
    if stride.1 < row.1 {
        return Err(CapiError::invalid(format!(
            "`{}` {} is below the row width {} {}: rows would overlap",
            stride.0, stride.1, row.0, row.1
        )));
    }
    let text = format!(
        "rows {rows} of {} {} every {} {}",
        row.0, row.1, stride.0, stride.1
    );
    let elements = rows
        .checked_sub(1)
        .map_or(Some(0), |r| r.checked_mul(stride.1)?.checked_add(row.1))
        .ok_or_else(|| {
            CapiError::invalid(format!("the shape {text} overflows the address space"))
        })?;
    Ok(Need { elements, text })
}

/// A shape dimension that must be positive.
pub(crate) fn positive(name: &str, value: usize) -> Result<usize, CapiError> {
    if value == 0 {
        return Err(CapiError::invalid(format!(
            "`{name}` is 0: it must be at least 1"
        )));
    }
    Ok(value)
}

/// A device buffer of `T`: non-null, `align`-byte aligned, `len >= need`, and its bytes inside the
/// address space. `why_align` says why the kernel needs the alignment.
pub(crate) fn device_buffer<T>(
    name: &'static str,
    ptr: AotDevicePtr,
    len: usize,
    need: &Need,
    align: u64,
) -> Result<DeviceArg<T>, CapiError> {
    if ptr == 0 {
        return Err(CapiError::null(name));
    }
    if !ptr.is_multiple_of(align) {
        let why = if align > std::mem::size_of::<T>() as u64 {
            "its kernel reads it in 16-byte vectors"
        } else {
            "the size of its element"
        };
        return Err(CapiError::new(
            AotStatus::Misaligned,
            format!("`{name}` ({ptr:#x}) is not {align}-byte aligned ({why}): pass an address that is a multiple of {align}"),
        ));
    }
    if len < need.elements {
        return Err(CapiError::new(
            AotStatus::DeviceBufferTooSmall,
            format!(
                "`{name}` is declared {len} elements long; the shape ({}) needs {}",
                need.text, need.elements
            ),
        ));
    }
    let fits = (len as u64)
        .checked_mul(std::mem::size_of::<T>() as u64)
        .and_then(|bytes| ptr.checked_add(bytes))
        .is_some();
    if !fits {
        return Err(CapiError::invalid(format!(
            "`{name}` ({ptr:#x}) declared {len} elements long runs past the end of the address space"
        )));
    }
    Ok(DeviceArg {
        name,
        ptr,
        len,
        _elem: PhantomData,
    })
}

/// Two buffers of one call must not share bytes: the kernels read one while writing the other
/// (their pointers are `__restrict__`).
pub(crate) fn disjoint<A, B>(a: &DeviceArg<A>, b: &DeviceArg<B>) -> Result<(), CapiError> {
    let (a_end, b_end) = (a.ptr + a.bytes() as u64, b.ptr + b.bytes() as u64);
    if a.ptr < b_end && b.ptr < a_end {
        return Err(CapiError::invalid(format!(
            "`{}` and `{}` overlap: the kernel reads one while it writes the other; pass separate buffers",
            a.name, b.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn rows_x_hidden() -> Need {
        need(&[("rows", 4), ("hidden", 64)]).unwrap()
    }

    #[test]
    fn a_null_buffer_is_named() {
        let e = device_buffer::<bf16>("weight", 0, 256, &rows_x_hidden(), 2).unwrap_err();
        assert_eq!(e.status, AotStatus::NullArgument);
        assert_eq!(e.message, "`weight` is null");
    }

    #[test]
    fn a_misaligned_buffer_is_named_with_its_alignment() {
        let e = device_buffer::<bf16>("x", 0x1000_0008, 256, &rows_x_hidden(), 16).unwrap_err();
        assert_eq!(e.status, AotStatus::Misaligned);
        assert!(
            e.message
                .starts_with("`x` (0x10000008) is not 16-byte aligned"),
            "{}",
            e.message
        );
        assert!(device_buffer::<bf16>("x", 0x1000_0010, 256, &rows_x_hidden(), 16).is_ok());
    }

    #[test]
    fn a_short_buffer_is_named_with_its_length_and_the_need() {
        let e = device_buffer::<bf16>("out", 0x1000, 255, &rows_x_hidden(), 2).unwrap_err();
        assert_eq!(e.status, AotStatus::DeviceBufferTooSmall);
        assert_eq!(
            e.message,
            "`out` is declared 255 elements long; the shape (rows 4 x hidden 64) needs 256"
        );
    }

    #[test]
    fn a_buffer_past_the_address_space_is_refused() {
        let e = device_buffer::<f32>("logits", u64::MAX - 15, usize::MAX / 4, &rows_x_hidden(), 4)
            .unwrap_err();
        assert_eq!(e.status, AotStatus::InvalidArgument);
        assert!(
            e.message.contains("past the end of the address space"),
            "{}",
            e.message
        );
    }

    #[test]
    fn an_overflowing_shape_is_an_error_not_a_wrapped_product() {
        let e = need(&[("rows", usize::MAX), ("hidden", 2)]).unwrap_err();
        assert_eq!(e.status, AotStatus::InvalidArgument);
        assert!(e.message.contains("overflows"), "{}", e.message);
        assert!(strided_need(usize::MAX, ("vocab", 8), ("row_stride", 8)).is_err());
    }

    #[test]
    fn strided_rows_need_the_last_row_only_to_its_width() {
        let n = strided_need(3, ("vocab", 10), ("row_stride", 16)).unwrap();
        assert_eq!(n.elements, 2 * 16 + 10);
        let e = strided_need(3, ("vocab", 10), ("row_stride", 8)).unwrap_err();
        assert!(
            e.message
                .starts_with("`row_stride` 8 is below the row width vocab 10"),
            "{}",
            e.message
        );
    }

    #[test]
    fn overlapping_buffers_are_named_and_adjacent_ones_pass() {
        let n = need(&[("hidden", 8)]).unwrap();
        let out = device_buffer::<bf16>("out", 0x1000, 8, &n, 2).unwrap();
        let x = device_buffer::<bf16>("x", 0x1008, 8, &n, 2).unwrap();
        let e = disjoint(&out, &x).unwrap_err();
        assert!(
            e.message.starts_with("`out` and `x` overlap"),
            "{}",
            e.message
        );
        let next = device_buffer::<bf16>("x", 0x1010, 8, &n, 2).unwrap();
        assert!(disjoint(&out, &next).is_ok());
    }

    #[test]
    fn a_zero_dimension_is_named() {
        assert_eq!(
            positive("hidden", 0).unwrap_err().message,
            "`hidden` is 0: it must be at least 1"
        );
        assert_eq!(positive("hidden", 8).unwrap(), 8);
    }
}
