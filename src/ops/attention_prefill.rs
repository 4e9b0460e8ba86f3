//! Causal prefill attention over the paged KV cache (module `attention_prefill`): the `tokens`
//! queries of one sequence at positions `start_pos ..`, each attending to cache positions
//! `0 ..= position` (earlier chunks included), GQA, head_dim 64, 128 or 256.
//!
//! The kernel visits keys in tiles of [`key_tile`] positions aligned to absolute positions, from
//! position 0 up, with an online softmax: each query's result is bitwise independent of how the
//! prompt was chunked. The reference below follows the same tiles (the running max decides where
//! probabilities are rounded to bf16 for P V) with float64 sums.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::kv_cache::{cache_blocks, cache_offset, BlockTable, KV_BLOCK_TOKENS};
use super::launch::{
    check_aligned, check_view, grid_dim, launch, to_i32, Arg, DevMut, DevRef, OpsError, MAX_GRID_X,
};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "attention_prefill";
pub const ENTRY_D64: &str = "attention_prefill_d64";
pub const ENTRY_D128: &str = "attention_prefill_d128";
pub const ENTRY_D256: &str = "attention_prefill_d256";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[
    (MODULE, ENTRY_D64),
    (MODULE, ENTRY_D128),
    (MODULE, ENTRY_D256),
];

/// Query rows per block (token x query head of one KV head) and threads per block.
const ROWS_PER_BLOCK: usize = 64;
const THREADS: u32 = 128;
/// The most query heads per KV head the kernel serves.
pub const MAX_GROUP: usize = 8;

/// Keys per tile of the online softmax for a head dimension (the kernel's `BN`).
pub const fn key_tile(head_dim: usize) -> usize {
    if head_dim > 128 {
        32
    } else {
        64
    }
}

/// The entry and its dynamic shared memory (Q tile + two stages of K and V tiles) for a head_dim.
fn entry(head_dim: usize) -> Option<(&'static str, u32)> {
    let name = match head_dim {
        64 => ENTRY_D64,
        128 => ENTRY_D128,
        256 => ENTRY_D256,
        _ => return None,
    };
    let bytes = (ROWS_PER_BLOCK + 4 * key_tile(head_dim)) * head_dim * 2;
    Some((name, bytes as u32))
}

/// Shape of one call: `tokens` queries of `q_heads` heads, `kv_heads` KV heads, at positions
/// `start_pos .. start_pos + tokens`; scores are scaled by `softmax_scale` (1/sqrt(head_dim)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionPrefillParams {
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub start_pos: usize,
    pub softmax_scale: f32,
}

impl AttentionPrefillParams {
    /// The usual scale `1/sqrt(head_dim)`.
    pub fn default_scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }
}

/// Reference for one query (`token`, `head`): `head_dim` outputs. `q` is `[tokens, q_heads,
/// head_dim]`; the caches one layer `[num_blocks][kv_heads][16][head_dim]`; `blocks` the
/// sequence's block-table row.
pub fn attention_prefill_row(
    q: &[bf16],
    k_cache: &[bf16],
    v_cache: &[bf16],
    blocks: &[i32],
    p: &AttentionPrefillParams,
    token: usize,
    head: usize,
) -> Vec<bf16> {
    let d = p.head_dim;
    let kv_head = head / (p.q_heads / p.kv_heads);
    let position = p.start_pos + token;
    let query: Vec<f64> = q[(token * p.q_heads + head) * d..][..d]
        .iter()
        .map(|x| f64::from(x.to_f32()))
        .collect();
    let cached = |cache: &[bf16], key: usize| -> Vec<f64> {
        let block = blocks[key / KV_BLOCK_TOKENS] as usize;
        let at = cache_offset(block, kv_head, key % KV_BLOCK_TOKENS, p.kv_heads, d);
        cache[at..at + d]
            .iter()
            .map(|x| f64::from(x.to_f32()))
            .collect()
    };
    // The kernel's log2-domain scale, an fp32 product.
    let scale_log2 = f64::from(p.softmax_scale * std::f32::consts::LOG2_E);
    let tile = key_tile(d);
    let (mut m, mut l) = (f64::NEG_INFINITY, 0.0f64);
    let mut acc = vec![0.0f64; d];
    for first in (0..=position).step_by(tile) {
        let keys = first..(first + tile).min(position + 1);
        let x: Vec<f64> = keys
            .clone()
            .map(|key| {
                let k = cached(k_cache, key);
                query.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() * scale_log2
            })
            .collect();
        let m_new = x.iter().copied().fold(m, f64::max);
        let alpha = if m_new == m { 1.0 } else { (m - m_new).exp2() };
        l *= alpha;
        acc.iter_mut().for_each(|a| *a *= alpha);
        for (key, &xi) in keys.zip(&x) {
            // P V multiplies bf16 probabilities, and the row sum adds the same rounded values.
            let prob = f64::from(bf16::from_f64((xi - m_new).exp2()).to_f32());
            l += prob;
            let v = cached(v_cache, key);
            acc.iter_mut().zip(&v).for_each(|(a, b)| *a += prob * b);
        }
        m = m_new;
    }
    acc.iter().map(|a| bf16::from_f64(a / l)).collect()
}

/// Reference for every query: `[tokens, q_heads, head_dim]`.
pub fn attention_prefill_reference(
    q: &[bf16],
    k_cache: &[bf16],
    v_cache: &[bf16],
    blocks: &[i32],
    p: &AttentionPrefillParams,
) -> Vec<bf16> {
    (0..p.tokens)
        .flat_map(|t| {
            (0..p.q_heads)
                .flat_map(move |h| attention_prefill_row(q, k_cache, v_cache, blocks, p, t, h))
        })
        .collect()
}

/// Runs causal prefill attention on the GPU: `out` and `q` are `[tokens, q_heads, head_dim]`
/// (views, so that one sequence's rows of a packed batch can be passed), the caches one layer
/// holding every position up to `start_pos + tokens - 1` at the rows the block-table row `blocks`
/// gives (the caller wrote them, this chunk's too). The block table must
/// cover those positions (checked here); a block id outside the cache makes the kernel trap.
pub fn attention_prefill(
    kernels: &LoadedKernels,
    out: DevMut<'_, bf16>,
    q: DevRef<'_, bf16>,
    k_cache: &CudaSlice<bf16>,
    v_cache: &CudaSlice<bf16>,
    blocks: &BlockTable<'_>,
    p: &AttentionPrefillParams,
) -> Result<(), OpsError> {
    let op = "attention_prefill";
    let bad = |message: String| Err(OpsError::Shape { op, message });
    if p.tokens == 0 || p.q_heads == 0 || p.kv_heads == 0 {
        return bad(format!("{p:?}: empty shape"));
    }
    let Some((name, shared)) = entry(p.head_dim) else {
        return bad(format!("head_dim {} is not 64, 128 or 256", p.head_dim));
    };
    let group = p.q_heads / p.kv_heads;
    if !p.q_heads.is_multiple_of(p.kv_heads) || group > MAX_GROUP {
        return bad(format!(
            "{} query heads over {} KV heads: need a whole group of at most {MAX_GROUP}",
            p.q_heads, p.kv_heads
        ));
    }
    if !(p.softmax_scale.is_finite() && p.softmax_scale > 0.0) {
        return bad(format!(
            "softmax_scale {} must be finite and > 0",
            p.softmax_scale
        ));
    }
    let end = p.start_pos.saturating_add(p.tokens);
    check_view(op, "q", q.len(), &[p.tokens, p.q_heads, p.head_dim])?;
    check_view(op, "out", out.len(), &[p.tokens, p.q_heads, p.head_dim])?;
    check_aligned(op, "q", q.addr(), 16)?;
    check_aligned(op, "out", out.addr(), 16)?;
    let num_blocks = cache_blocks(op, k_cache, v_cache, p.kv_heads, p.head_dim)?;
    let (table_offset, table_len) = blocks.check(op, end)?;
    // Row indices (token x group) and positions stay within 32 bits.
    to_i32(op, "query rows", p.tokens * group + ROWS_PER_BLOCK)?;
    to_i32(op, "last position", end)?;
    let row_blocks = (p.tokens * group).div_ceil(ROWS_PER_BLOCK);
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(op, "row blocks", row_blocks, MAX_GRID_X)?,
            grid_dim(op, "KV heads", p.kv_heads, 65535)?,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared,
    };
    launch(
        kernels,
        op,
        MODULE,
        name,
        cfg,
        &mut [
            Arg::U64(out.addr()),
            Arg::U64(q.addr()),
            Arg::In(k_cache),
            Arg::In(v_cache),
            Arg::InI32(blocks.table),
            Arg::I32(table_offset),
            Arg::I32(table_len),
            Arg::I32(num_blocks),
            Arg::I32(p.tokens as i32),
            Arg::I32(to_i32(op, "q_heads", p.q_heads)?),
            Arg::I32(to_i32(op, "kv_heads", p.kv_heads)?),
            Arg::I32(p.start_pos as i32),
            Arg::F32(p.softmax_scale),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_returns_its_value_and_equal_scores_average() {
        // head_dim 64, one KV head, two query heads; cache block 1 holds positions 0..16.
        let d = 64;
        let p = AttentionPrefillParams {
            tokens: 2,
            q_heads: 2,
            kv_heads: 1,
            head_dim: d,
            start_pos: 0,
            softmax_scale: AttentionPrefillParams::default_scale(d),
        };
        let q = vec![bf16::ZERO; 2 * 2 * d];
        let mut k = vec![bf16::ZERO; 2 * 16 * d];
        let mut v = vec![bf16::ZERO; 2 * 16 * d];
        for i in 0..d {
            k[16 * d + i] = bf16::from_f32(0.5);
            v[16 * d + i] = bf16::from_f32(1.0 + i as f32);
            v[17 * d + i] = bf16::from_f32(3.0 - i as f32);
        }
        let out = attention_prefill_reference(&q, &k, &v, &[1], &p);
        // Token 0 sees only position 0; token 1 sees two equal scores (q = 0): the mean.
        for i in 0..d {
            assert_eq!(out[i].to_f32(), 1.0 + i as f32);
            assert_eq!(out[d + i].to_f32(), 1.0 + i as f32);
            assert_eq!(out[2 * d + i].to_f32(), 2.0);
        }
    }

    #[test]
    fn entries_fit_every_gpu_shared_memory() {
        for d in [64, 128, 256] {
            let (_, bytes) = entry(d).unwrap();
            assert!(bytes <= 99 * 1024, "head_dim {d}: {bytes}");
        }
        assert!(entry(96).is_none());
    }
}
