//! Payload decompression with hard caps: the output never grows past the size the entry header
//! declares, nor past what the caller's `Limits` still allow, so a decompression bomb is an error
//! and never an allocation.

use std::io::Read;

use crate::error::Error;

/// How much a caller lets the parser allocate for decompressed payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes all decompressed payloads of one call may take together.
    pub max_decompressed_total: u64,
}

impl Limits {
    /// 512 MiB: far above any real fatbin (a few MB) and far below what would hurt a build machine.
    pub const DEFAULT_MAX_DECOMPRESSED_TOTAL: u64 = 512 << 20;
}

/// Largest uncompressed size an entry may declare for `compressed` stored bytes: 256:1 plus
/// 1 MiB. Real payloads compress about 5:1; without a ratio cap a few KiB of zstd RLE blocks
/// could make one call spend the whole budget in allocation and decoding.
pub(crate) fn max_uncompressed_for(compressed: u64) -> u64 {
    compressed.saturating_mul(256).saturating_add(1 << 20)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decompressed_total: Self::DEFAULT_MAX_DECOMPRESSED_TOTAL,
        }
    }
}

/// What is left of a `Limits` budget during one call.
#[derive(Debug)]
pub(crate) struct Budget {
    left: u64,
    limit: u64,
}

impl Budget {
    pub(crate) fn new(limits: &Limits) -> Self {
        Budget {
            left: limits.max_decompressed_total,
            limit: limits.max_decompressed_total,
        }
    }

    /// Reserves `size` bytes, or says which entry would go over the limit.
    fn take(&mut self, size: u64, what: &'static str, offset: usize) -> Result<(), Error> {
        if size > self.left {
            return Err(Error::TooLarge {
                what,
                offset,
                size,
                limit: self.limit,
            });
        }
        self.left -= size;
        Ok(())
    }
}

/// Starting capacity for an output buffer: never the declared size of an untrusted header
/// outright, so a lying header costs at most what the data really expands to.
fn initial_capacity(declared: u64, input_len: usize) -> usize {
    let guess = (input_len as u64)
        .saturating_mul(8)
        .min(declared)
        .min(64 << 20);
    usize::try_from(guess).unwrap_or(0)
}

/// Decodes one zstd frame that must yield exactly `declared` bytes.
pub(crate) fn zstd(
    input: &[u8],
    declared: u64,
    budget: &mut Budget,
    what: &'static str,
    offset: usize,
) -> Result<Vec<u8>, Error> {
    budget.take(declared, what, offset)?;
    let fail = |detail: String| Error::Decompress {
        what,
        offset,
        codec: "zstd",
        detail,
    };
    let mut source = input;
    let decoder = ruzstd::StreamingDecoder::new(&mut source).map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::with_capacity(initial_capacity(declared, input.len()));
    // One byte past the declared size tells "too long" apart from "exactly right" without
    // ever holding more than declared + 1 bytes.
    decoder
        .take(declared.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| fail(e.to_string()))?;
    if out.len() as u64 != declared {
        let got = if out.len() as u64 > declared {
            format!("more than {declared}")
        } else {
            out.len().to_string()
        };
        return Err(fail(format!(
            "decompressed to {got} bytes, but the entry header declares {declared}"
        )));
    }
    Ok(out)
}

/// Decodes one raw LZ4 block (no frame, no size prefix) that must yield exactly `declared` bytes.
pub(crate) fn lz4(
    input: &[u8],
    declared: u64,
    budget: &mut Budget,
    what: &'static str,
    offset: usize,
) -> Result<Vec<u8>, Error> {
    // An LZ4 block expands at most about 255:1; a larger claim is a lie, refused before
    // the output buffer is allocated.
    let max_plausible = (input.len() as u64).saturating_mul(255).saturating_add(16);
    if declared > max_plausible {
        return Err(Error::Decompress {
            what,
            offset,
            codec: "lz4",
            detail: format!(
                "declared size {declared:#x} is more than LZ4 can expand {:#x} input bytes to",
                input.len()
            ),
        });
    }
    budget.take(declared, what, offset)?;
    let len = usize::try_from(declared).map_err(|_| Error::TooLarge {
        what,
        offset,
        size: declared,
        limit: budget.limit,
    })?;
    let mut out = vec![0u8; len];
    let written =
        lz4_flex::block::decompress_into(input, &mut out).map_err(|e| Error::Decompress {
            what,
            offset,
            codec: "lz4",
            detail: e.to_string(),
        })?;
    if written != len {
        return Err(Error::Decompress {
            what,
            offset,
            codec: "lz4",
            detail: format!(
                "decompressed to {written} bytes, but the entry header declares {declared}"
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zstd frame of RLE blocks: `n` bytes of 'A' from 4 bytes of input per 128 KiB.
    pub(crate) fn zstd_rle_frame(n: u32) -> Vec<u8> {
        const MAX_BLOCK: u32 = 128 << 10;
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
        // Frame header descriptor: content size field 4 bytes (FCS flag 2), single segment.
        f.push(0b1010_0000);
        f.extend_from_slice(&n.to_le_bytes());
        let mut left = n;
        loop {
            let size = left.min(MAX_BLOCK);
            left -= size;
            // Block header: last-block bit, type RLE (1), size.
            let header = u32::from(left == 0) | (1 << 1) | (size << 3);
            f.extend_from_slice(&header.to_le_bytes()[..3]);
            f.push(b'A');
            if left == 0 {
                return f;
            }
        }
    }

    #[test]
    fn zstd_roundtrips_an_exact_size() {
        let frame = zstd_rle_frame(1000);
        let mut budget = Budget::new(&Limits::default());
        let out = zstd(&frame, 1000, &mut budget, "entry", 0x10).unwrap();
        assert_eq!(out.len(), 1000);
        assert!(out.iter().all(|&b| b == b'A'));
    }

    #[test]
    fn zstd_bomb_over_the_limit_is_refused_before_decoding() {
        let frame = zstd_rle_frame(1 << 20);
        let mut budget = Budget::new(&Limits {
            max_decompressed_total: 1 << 16,
        });
        let err = zstd(&frame, 1 << 20, &mut budget, "fatbin entry", 0x40).unwrap_err();
        assert_eq!(
            err,
            Error::TooLarge {
                what: "fatbin entry",
                offset: 0x40,
                size: 1 << 20,
                limit: 1 << 16
            }
        );
    }

    #[test]
    fn zstd_output_longer_than_declared_is_cut_and_refused() {
        let frame = zstd_rle_frame(1 << 20);
        let mut budget = Budget::new(&Limits::default());
        let err = zstd(&frame, 100, &mut budget, "e", 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("decompressed to more than 100 bytes"),
            "{err}"
        );
    }

    #[test]
    fn zstd_short_output_and_garbage_are_errors() {
        let frame = zstd_rle_frame(10);
        let mut budget = Budget::new(&Limits::default());
        assert!(zstd(&frame, 11, &mut budget, "e", 0)
            .unwrap_err()
            .to_string()
            .contains("decompressed to 10 bytes"));
        assert!(matches!(
            zstd(b"not zstd at all", 5, &mut budget, "e", 0),
            Err(Error::Decompress { codec: "zstd", .. })
        ));
    }

    #[test]
    fn budget_is_shared_across_payloads() {
        let frame = zstd_rle_frame(600);
        let mut budget = Budget::new(&Limits {
            max_decompressed_total: 1000,
        });
        zstd(&frame, 600, &mut budget, "e", 0).unwrap();
        assert!(matches!(
            zstd(&frame, 600, &mut budget, "e", 8),
            Err(Error::TooLarge { offset: 8, .. })
        ));
    }

    #[test]
    fn lz4_roundtrips_and_refuses_bombs() {
        let data = b"hello hello hello hello hello hello".repeat(10);
        let block = lz4_flex::block::compress(&data);
        let mut budget = Budget::new(&Limits::default());
        assert_eq!(
            lz4(&block, data.len() as u64, &mut budget, "e", 0).unwrap(),
            data
        );
        // Declared size huge: refused without allocating it.
        assert!(matches!(
            lz4(&block, 1 << 40, &mut budget, "e", 0),
            Err(Error::Decompress { codec: "lz4", .. })
        ));
        // Over the budget but plausible for the input length.
        let mut small = Budget::new(&Limits {
            max_decompressed_total: 10,
        });
        assert!(matches!(
            lz4(&block, data.len() as u64, &mut small, "e", 0),
            Err(Error::TooLarge { .. })
        ));
        // Declared larger than what the block really holds.
        let mut budget = Budget::new(&Limits::default());
        assert!(lz4(&block, data.len() as u64 + 1, &mut budget, "e", 0).is_err());
        assert!(lz4(&[0xff, 0xff, 0xff], 100, &mut budget, "e", 0).is_err());
    }
}
