//! Bounds-checked little-endian reads. Every parser reads through these, so no offset taken
//! from the input can index past the buffer.

use crate::error::Error;

/// `len` bytes at `offset`, or a `Truncated` error naming `what`.
pub(crate) fn bytes_at<'a>(
    buf: &'a [u8],
    offset: usize,
    len: u64,
    what: &'static str,
) -> Result<&'a [u8], Error> {
    let truncated = || Error::Truncated {
        what,
        offset,
        needed: len,
        available: buf.len().saturating_sub(offset),
    };
    let len_usize = usize::try_from(len).map_err(|_| truncated())?;
    let end = offset.checked_add(len_usize).ok_or_else(truncated)?;
    buf.get(offset..end).ok_or_else(truncated)
}

fn array_at<const N: usize>(
    buf: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<[u8; N], Error> {
    let slice = bytes_at(buf, offset, N as u64, what)?;
    let mut out = [0u8; N];
    out.copy_from_slice(slice);
    Ok(out)
}

pub(crate) fn u16_at(buf: &[u8], offset: usize, what: &'static str) -> Result<u16, Error> {
    array_at(buf, offset, what).map(u16::from_le_bytes)
}

pub(crate) fn u32_at(buf: &[u8], offset: usize, what: &'static str) -> Result<u32, Error> {
    array_at(buf, offset, what).map(u32::from_le_bytes)
}

pub(crate) fn u64_at(buf: &[u8], offset: usize, what: &'static str) -> Result<u64, Error> {
    array_at(buf, offset, what).map(u64::from_le_bytes)
}

/// `base + delta` as a buffer offset, or a `Malformed` error when it overflows.
pub(crate) fn offset_add(base: usize, delta: u64, what: &'static str) -> Result<usize, Error> {
    usize::try_from(delta)
        .ok()
        .and_then(|d| base.checked_add(d))
        .ok_or_else(|| {
            Error::malformed(
                what,
                base,
                format!("offset {base:#x} + {delta:#x} overflows"),
            )
        })
}

/// The bytes before the first NUL (all of them when there is none).
pub(crate) fn until_nul(buf: &[u8]) -> &[u8] {
    match buf.iter().position(|&b| b == 0) {
        Some(end) => buf.get(..end).unwrap_or(buf),
        None => buf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_in_bounds() {
        let buf = [0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0];
        assert_eq!(u32_at(&buf, 0, "magic").unwrap(), 0xBA55_ED50);
        assert_eq!(u16_at(&buf, 6, "size").unwrap(), 0x10);
        assert_eq!(u64_at(&buf, 0, "all").unwrap(), 0x0010_0001_ba55_ed50);
    }

    #[test]
    fn refuses_reads_past_the_end_or_overflowing() {
        let buf = [0u8; 4];
        let err = u32_at(&buf, 2, "field").unwrap_err();
        assert_eq!(
            err,
            Error::Truncated {
                what: "field",
                offset: 2,
                needed: 4,
                available: 2
            }
        );
        assert!(bytes_at(&buf, usize::MAX, 2, "x").is_err());
        assert!(bytes_at(&buf, 0, u64::MAX, "x").is_err());
        assert!(offset_add(usize::MAX, 1, "x").is_err());
        assert!(u16_at(&buf, 10, "x").is_err());
    }

    #[test]
    fn cuts_at_the_first_nul() {
        assert_eq!(until_nul(b"ab\0cd\0"), b"ab");
        assert_eq!(until_nul(b"abc"), b"abc");
        assert_eq!(until_nul(b""), b"");
    }
}
