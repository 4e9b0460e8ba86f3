//! The paged KV cache as the prefill kernels see it (`kernels/include/aot_paged_kv.cuh` is the
//! device side): per layer, `k` and `v` are `[num_blocks][kv_heads][16][head_dim]` bf16, and a
//! sequence's block-table row lists its blocks: position `p` lives at row `p % 16` of block
//! `row[p / 16]`.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::launch::{to_i32, OpsError};

/// Tokens per cache block.
pub const KV_BLOCK_TOKENS: usize = 16;

/// One sequence's block-table row: entries `offset .. offset + len` of `table` (a whole table of
/// many rows may be passed with the row's offset). Block ids are read on the device; one outside
/// the cache makes the kernel trap instead of touching another sequence's memory.
#[derive(Debug, Clone, Copy)]
pub struct BlockTable<'a> {
    pub table: &'a CudaSlice<i32>,
    pub offset: usize,
    pub len: usize,
}

impl BlockTable<'_> {
    /// Checks that the row lies in `table` and covers positions `0 .. positions`; returns
    /// `(offset, len)` as kernel arguments.
    pub(crate) fn check(&self, op: &'static str, positions: usize) -> Result<(i32, i32), OpsError> {
        let end = self.offset.checked_add(self.len);
        if end.is_none_or(|e| e > self.table.len()) {
            return Err(OpsError::Shape {
                op,
                message: format!(
                    "block table row {}..+{} lies outside the table of {} entries",
                    self.offset,
                    self.len,
                    self.table.len()
                ),
            });
        }
        let needed = positions.div_ceil(KV_BLOCK_TOKENS);
        if needed > self.len {
            return Err(OpsError::Shape {
                op,
                message: format!(
                    "positions up to {} need {needed} cache blocks; the sequence's block table has {}",
                    positions.saturating_sub(1),
                    self.len
                ),
            });
        }
        Ok((
            to_i32(op, "block table offset", self.offset)?,
            to_i32(op, "block table length", self.len)?,
        ))
    }
}

/// Elements in one cache block of one layer (all kv heads).
pub fn block_elements(kv_heads: usize, head_dim: usize) -> usize {
    kv_heads * KV_BLOCK_TOKENS * head_dim
}

/// The element offset of `(block, kv_head, row)` in a cache layer.
pub fn cache_offset(
    block: usize,
    kv_head: usize,
    row: usize,
    kv_heads: usize,
    head_dim: usize,
) -> usize {
    ((block * kv_heads + kv_head) * KV_BLOCK_TOKENS + row) * head_dim
}

/// The number of whole blocks in `k` and `v`, which must hold the same number.
pub(crate) fn cache_blocks(
    op: &'static str,
    k: &CudaSlice<bf16>,
    v: &CudaSlice<bf16>,
    kv_heads: usize,
    head_dim: usize,
) -> Result<i32, OpsError> {
    let per_block = block_elements(kv_heads, head_dim);
    let blocks = k.len() / per_block.max(1);
    if blocks == 0 || v.len() / per_block.max(1) != blocks {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "the k and v caches hold {} and {} elements: need the same whole number (>= 1) of blocks of {per_block}",
                k.len(),
                v.len()
            ),
        });
    }
    to_i32(op, "cache blocks", blocks)
}
