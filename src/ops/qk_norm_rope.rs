//! Per-head q/k RMSNorm, NeoX RoPE and the paged KV-cache write for prefill (module
//! `qk_norm_rope_cache`): the step between the QKV projection and attention for the tokens of one
//! sequence at positions `start_pos ..`.
//!
//! The math is exactly the composition of two existing ops: [`rmsnorm`](super::rmsnorm) per head
//! (`bf16((w + weight_offset) * bf16(x * rsqrt(mean(x^2) + eps)))`) then
//! [`rotary`](super::rotary) over the whole head (fp32 `[max_position, head_dim]` cos/sin table),
//! so the reference is that composition.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::kv_cache::{cache_blocks, cache_offset, BlockTable, KV_BLOCK_TOKENS};
use super::launch::{
    check_aligned, check_len, check_rows, check_view, grid_dim, launch, to_i32, Arg, DevMut,
    DevRef, OpsError, MAX_GRID_X,
};
use super::rmsnorm::{rmsnorm_reference, RmsNormParams};
use super::rotary::{rotary_neox_reference, RotaryParams};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "qk_norm_rope_cache";
pub const ENTRY: &str = "qk_norm_rope_cache_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

/// Heads per block (one warp each).
const HEADS_PER_BLOCK: usize = 8;

/// Shape and constants of one call: `tokens` rows of `qkv`, each `[q heads | k heads | v heads]`
/// of `head_dim` (64, 128 or 256), `qkv_stride` elements apart, at positions `start_pos ..`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkNormRopeParams {
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub qkv_stride: usize,
    pub start_pos: usize,
    pub eps: f32,
    /// 0 for Qwen3 (`* w`), 1 for zero-centred norms (`* (1 + w)`).
    pub weight_offset: f32,
}

impl QkNormRopeParams {
    fn row_len(&self) -> usize {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// The device inputs: the projection output (a view, so that one sequence's rows of a packed
/// batch can be passed), the two norm weights (`head_dim` each), the cos/sin table
/// (`max_position` rows of `head_dim`) and the sequence's block-table row.
#[derive(Debug, Clone, Copy)]
pub struct QkNormRopeInputs<'a> {
    pub qkv: DevRef<'a, bf16>,
    pub q_norm: &'a CudaSlice<bf16>,
    pub k_norm: &'a CudaSlice<bf16>,
    pub cos_sin: &'a CudaSlice<f32>,
    pub max_position: usize,
    pub blocks: BlockTable<'a>,
}

/// Reference: returns `q_out` (`tokens x q_heads x head_dim`) and writes k and v of every token
/// into `k_cache` / `v_cache` (one layer, `[num_blocks][kv_heads][16][head_dim]`) at the rows the
/// block-table row `blocks` gives for its position.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_cache_reference(
    qkv: &[bf16],
    q_norm: &[bf16],
    k_norm: &[bf16],
    cos_sin: &[f32],
    blocks: &[i32],
    p: &QkNormRopeParams,
    k_cache: &mut [bf16],
    v_cache: &mut [bf16],
) -> Vec<bf16> {
    let d = p.head_dim;
    let heads = |first: usize, count: usize| -> Vec<bf16> {
        (0..p.tokens)
            .flat_map(|t| {
                let row = &qkv[t * p.qkv_stride..];
                row[first * d..(first + count) * d].iter().copied()
            })
            .collect()
    };
    let norm = |x: &[bf16], w: &[bf16], rows: usize| {
        let np = RmsNormParams {
            rows,
            hidden: d,
            eps: p.eps,
            weight_offset: p.weight_offset,
        };
        rmsnorm_reference(x, w, &np)
    };
    let mut q = norm(&heads(0, p.q_heads), q_norm, p.tokens * p.q_heads);
    let mut k = norm(&heads(p.q_heads, p.kv_heads), k_norm, p.tokens * p.kv_heads);
    let v = heads(p.q_heads + p.kv_heads, p.kv_heads);
    let positions: Vec<i32> = (0..p.tokens).map(|t| (p.start_pos + t) as i32).collect();
    let rp = RotaryParams {
        tokens: p.tokens,
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: d,
        rot_dim: d,
    };
    rotary_neox_reference(&mut q, &mut k, &positions, cos_sin, &rp);
    for t in 0..p.tokens {
        let pos = p.start_pos + t;
        let block = blocks[pos / KV_BLOCK_TOKENS] as usize;
        for h in 0..p.kv_heads {
            let at = cache_offset(block, h, pos % KV_BLOCK_TOKENS, p.kv_heads, d);
            let from = (t * p.kv_heads + h) * d;
            k_cache[at..at + d].copy_from_slice(&k[from..from + d]);
            v_cache[at..at + d].copy_from_slice(&v[from..from + d]);
        }
    }
    q
}

/// Runs the step on the GPU: `q_out` gets `tokens x q_heads x head_dim`, the caches get k and v at
/// the sequence's positions. Shapes, the cos/sin table and the block-table row are checked here;
/// a block id outside the cache (read on the device) makes the kernel trap.
pub fn qk_norm_rope_cache(
    kernels: &LoadedKernels,
    inputs: &QkNormRopeInputs<'_>,
    q_out: DevMut<'_, bf16>,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    p: &QkNormRopeParams,
) -> Result<(), OpsError> {
    let op = "qk_norm_rope_cache";
    let bad = |message: String| Err(OpsError::Shape { op, message });
    if p.tokens == 0 || p.q_heads == 0 || p.kv_heads == 0 {
        return bad(format!("{p:?}: empty shape"));
    }
    if ![64, 128, 256].contains(&p.head_dim) {
        return bad(format!("head_dim {} is not 64, 128 or 256", p.head_dim));
    }
    let end = p.start_pos.saturating_add(p.tokens);
    if end > inputs.max_position {
        return bad(format!(
            "positions {}..{end} run past the cos/sin table of {} positions",
            p.start_pos, inputs.max_position
        ));
    }
    check_rows(
        op,
        "qkv",
        inputs.qkv.len(),
        p.tokens,
        p.row_len(),
        p.qkv_stride,
    )?;
    check_len(op, "q_norm", inputs.q_norm, &[p.head_dim])?;
    check_len(op, "k_norm", inputs.k_norm, &[p.head_dim])?;
    check_len(
        op,
        "cos_sin",
        inputs.cos_sin,
        &[inputs.max_position, p.head_dim],
    )?;
    check_view(op, "q_out", q_out.len(), &[p.tokens, p.q_heads, p.head_dim])?;
    check_aligned(op, "qkv", inputs.qkv.addr(), 16)?;
    check_aligned(op, "q_out", q_out.addr(), 16)?;
    let num_blocks = cache_blocks(op, k_cache, v_cache, p.kv_heads, p.head_dim)?;
    let (table_offset, table_len) = inputs.blocks.check(op, end)?;
    let head_groups = (p.q_heads + 2 * p.kv_heads).div_ceil(HEADS_PER_BLOCK);
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(op, "tokens", p.tokens, MAX_GRID_X)?,
            grid_dim(op, "head groups", head_groups, 65535)?,
            1,
        ),
        block_dim: (HEADS_PER_BLOCK as u32 * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(
        kernels,
        op,
        MODULE,
        ENTRY,
        cfg,
        &mut [
            Arg::U64(q_out.addr()),
            Arg::Out(k_cache),
            Arg::Out(v_cache),
            Arg::U64(inputs.qkv.addr()),
            Arg::In(inputs.q_norm),
            Arg::In(inputs.k_norm),
            Arg::InF32(inputs.cos_sin),
            Arg::InI32(inputs.blocks.table),
            Arg::I32(table_offset),
            Arg::I32(table_len),
            Arg::I32(num_blocks),
            Arg::I32(to_i32(op, "max_position", inputs.max_position)?),
            Arg::I32(to_i32(op, "qkv_stride", p.qkv_stride)?),
            Arg::I32(to_i32(op, "q_heads", p.q_heads)?),
            Arg::I32(to_i32(op, "kv_heads", p.kv_heads)?),
            Arg::I32(p.head_dim as i32),
            Arg::I32(to_i32(op, "start_pos", p.start_pos)?),
            Arg::F32(p.eps),
            Arg::F32(p.weight_offset),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rotary::cos_sin_cache;

    #[test]
    fn reference_writes_each_position_to_its_block_row() {
        let p = QkNormRopeParams {
            tokens: 3,
            q_heads: 2,
            kv_heads: 1,
            head_dim: 64,
            qkv_stride: 4 * 64 + 8,
            start_pos: 15,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let qkv: Vec<bf16> = (0..p.tokens * p.qkv_stride)
            .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 16.0))
            .collect();
        let ones = vec![bf16::ONE; 64];
        let cs = cos_sin_cache(32, 64, 1e6);
        let per_block = 64 * KV_BLOCK_TOKENS;
        let (mut kc, mut vc) = (
            vec![bf16::ZERO; 3 * per_block],
            vec![bf16::ZERO; 3 * per_block],
        );
        // Positions 15, 16, 17: row 15 of block 2, rows 0 and 1 of block 0.
        let q =
            qk_norm_rope_cache_reference(&qkv, &ones, &ones, &cs, &[2, 0], &p, &mut kc, &mut vc);
        assert_eq!(q.len(), 3 * 2 * 64);
        let v_of = |t: usize| &qkv[t * p.qkv_stride + 3 * 64..t * p.qkv_stride + 4 * 64];
        assert_eq!(
            &vc[2 * per_block + 15 * 64..2 * per_block + 16 * 64],
            v_of(0)
        );
        assert_eq!(&vc[..64], v_of(1));
        assert_eq!(&vc[64..128], v_of(2));
        assert!(vc[per_block..2 * per_block]
            .iter()
            .all(|x| x.to_f32() == 0.0));
        // k is normalised: unit RMS before rotation, and rotation keeps the norm.
        let k: Vec<f64> = kc[..64].iter().map(|x| f64::from(x.to_f32())).collect();
        let rms = (k.iter().map(|x| x * x).sum::<f64>() / 64.0).sqrt();
        assert!((rms - 1.0).abs() < 0.02, "rms {rms}");
    }
}
