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

    /// Its name, address and bytes, whatever its element.
    pub fn extent(&self) -> Extent {
        (self.name, self.ptr, self.bytes())
    }

    /// `len` elements of `U` from byte `offset` on, under this buffer's name: a caller's workspace
    /// cut into the arrays a kernel takes. `None` when they would run past its declared end.
    pub fn part<U>(&self, offset: usize, len: usize) -> Option<DeviceArg<U>> {
        let end = len
            .checked_mul(std::mem::size_of::<U>())?
            .checked_add(offset)?;
        (end <= self.bytes()).then(|| DeviceArg {
            name: self.name,
            ptr: self.ptr + offset as u64,
            len,
            _elem: PhantomData,
        })
    }
}

/// A checked buffer's name, address and declared bytes.
pub(crate) type Extent = (&'static str, u64, usize);

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
            format!("its kernel reads it in {align}-byte vectors")
        } else {
            "the size of its element".to_string()
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
    apart(a.extent(), b.extent())
}

fn apart((a_name, a, a_bytes): Extent, (b_name, b, b_bytes): Extent) -> Result<(), CapiError> {
    if a < b + b_bytes as u64 && b < a + a_bytes as u64 {
        return Err(CapiError::invalid(format!(
            "`{a_name}` and `{b_name}` overlap: the kernel reads one while it writes the other; pass separate buffers"
        )));
    }
    Ok(())
}

/// [`disjoint`] for a call of many buffers: each one it writes shares no byte with any other; the
/// ones it only reads may share bytes with each other.
pub(crate) fn written_apart(written: &[Extent], read: &[Extent]) -> Result<(), CapiError> {
    for (i, &w) in written.iter().enumerate() {
        for &other in written[i + 1..].iter().chain(read) {
            apart(w, other)?;
        }
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
        assert!(
            e.message
                .starts_with("`weight` is null: pass a valid pointer"),
            "{}",
            e.message
        );
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
    fn written_buffers_stay_apart_from_all_and_read_ones_may_share() {
        let n = need(&[("hidden", 8)]).unwrap();
        let buf = |name, ptr| device_buffer::<bf16>(name, ptr, 8, &n, 2).unwrap().extent();
        let (q, k) = (buf("q_norm", 0x1000), buf("k_norm", 0x1000));
        let (out, cache) = (buf("out", 0x2000), buf("cache", 0x3000));
        assert!(written_apart(&[out, cache], &[q, k]).is_ok());
        let e = written_apart(&[out, cache, buf("v_cache", 0x3008)], &[q]).unwrap_err();
        assert!(
            e.message.starts_with("`cache` and `v_cache` overlap"),
            "{}",
            e.message
        );
        let e = written_apart(&[cache], &[q, buf("positions", 0x300e)]).unwrap_err();
        assert!(
            e.message.starts_with("`cache` and `positions` overlap"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_part_lies_inside_its_buffer_under_its_name() {
        let ws = device_buffer::<u8>("workspace", 0x1000, 64, &need(&[("bytes", 64)]).unwrap(), 8)
            .unwrap();
        let counters = ws.part::<u32>(48, 4).unwrap();
        assert_eq!(
            (counters.name, counters.ptr, counters.len),
            ("workspace", 0x1030, 4)
        );
        assert!(ws.part::<u32>(52, 4).is_none());
        assert!(ws.part::<f32>(usize::MAX, 1).is_none());
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
