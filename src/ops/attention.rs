//! Decode attention over the paged KV cache (module `attention`): one query token per sequence,
//! GQA, split-KV with an in-kernel merge. See `kernels/attention/decode.cu`.

use cudarc::driver::{DeviceRepr, LaunchConfig};
use half::bf16;

use super::launch::{check_view, launch_params, to_i32, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "attention";
pub const ENTRY_D64: &str = "attn_decode_d64";
pub const ENTRY_D128: &str = "attn_decode_d128";
pub const ENTRY_D256: &str = "attn_decode_d256";

/// Tokens per KV-cache block.
pub const BLOCK_TOKENS: usize = 16;
/// Most context splits of one sequence (the kernel's merge workspace holds this many).
pub const MAX_SPLITS: usize = 32;
/// Most query heads per KV head.
pub const MAX_GROUP: usize = 8;
const TOKENS_PER_SPLIT_MIN: usize = 64;
const THREADS: u32 = 128;
const WARPS: usize = 4;

/// Mirror of `AttnDecodeParams` in kernels/attention/decode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnDecodeParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    block_table: u64,
    slot_of_row: u64,
    ctx_lens: u64,
    out: u64,
    ws_ml: u64,
    ws_o: u64,
    counters: u64,
    m: i32,
    q_heads: i32,
    kv_heads: i32,
    ld_bt: i32,
    scale: f32,
    pad: i32,
}

// SAFETY: plain `repr(C)` data, laid out as the kernel's struct.
unsafe impl DeviceRepr for AttnDecodeParams {}

/// How a context of `ctx` tokens is split: `(count, tokens per split)`, a function of the
/// sequence's own length only (the kernel computes the same).
pub fn attn_splits(ctx: usize) -> (usize, usize) {
    let want = ctx.div_ceil(TOKENS_PER_SPLIT_MIN).clamp(1, MAX_SPLITS);
    let per = ctx.div_ceil(want).div_ceil(BLOCK_TOKENS) * BLOCK_TOKENS;
    (ctx.div_ceil(per).max(1), per.max(BLOCK_TOKENS))
}

/// The merge workspace one launch may use: `ws_ml` and `ws_o` floats, and counters.
pub fn attn_scratch_needs(
    rows: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> (usize, usize, usize) {
    let cells = rows * q_heads * MAX_SPLITS;
    (cells * 2, cells * head_dim, rows * kv_heads)
}

/// Merge workspace of [`attention_decode`]; counters are zero between launches.
pub struct AttnScratch<'a> {
    pub ws_ml: DevMut<'a, f32>,
    pub ws_o: DevMut<'a, f32>,
    pub counters: DevMut<'a, u32>,
}

/// Shapes and cache views of one decode-attention launch.
pub struct AttnDecode<'a> {
    /// `[m][q_heads * head_dim]`.
    pub q: DevRef<'a, bf16>,
    pub k_cache: DevRef<'a, bf16>,
    pub v_cache: DevRef<'a, bf16>,
    pub block_table: DevRef<'a, i32>,
    pub ld_bt: usize,
    pub slot_of_row: DevRef<'a, i32>,
    /// `[m]`: positions `0..ctx` of each row's sequence are in the cache.
    pub ctx_lens: DevRef<'a, i32>,
    pub out: DevMut<'a, bf16>,
    pub m: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Grid depth: at least `attn_splits(ctx).0` for every row (the kernel traps otherwise).
    pub grid_splits: usize,
}

pub fn attention_decode(
    kernels: &LoadedKernels,
    a: AttnDecode<'_>,
    scratch: &mut AttnScratch<'_>,
) -> Result<(), OpsError> {
    let op = "attention_decode";
    let shape_err = |message: String| OpsError::Shape { op, message };
    let d = a.head_dim;
    let entry = match d {
        64 => ENTRY_D64,
        128 => ENTRY_D128,
        256 => ENTRY_D256,
        _ => {
            return Err(shape_err(format!(
                "head_dim {d}: the kernel is built for 64, 128 and 256"
            )))
        }
    };
    if a.m == 0
        || a.kv_heads == 0
        || !a.q_heads.is_multiple_of(a.kv_heads)
        || a.q_heads / a.kv_heads > MAX_GROUP
    {
        return Err(shape_err(format!(
            "{} rows, {} query heads over {} KV heads: need rows > 0 and 1..={MAX_GROUP} query heads per KV head",
            a.m, a.q_heads, a.kv_heads
        )));
    }
    if a.grid_splits == 0 || a.grid_splits > MAX_SPLITS {
        return Err(shape_err(format!(
            "grid_splits {} must be in 1..={MAX_SPLITS}",
            a.grid_splits
        )));
    }
    check_view(op, "q", a.q.len(), &[a.m, a.q_heads, d])?;
    check_view(op, "out", a.out.len(), &[a.m, a.q_heads, d])?;
    check_view(op, "slot_of_row", a.slot_of_row.len(), &[a.m])?;
    check_view(op, "ctx_lens", a.ctx_lens.len(), &[a.m])?;
    if a.ld_bt == 0 || a.block_table.len() < a.ld_bt {
        return Err(shape_err(
            "block_table must hold at least one row of ld_bt entries".into(),
        ));
    }
    check_view(
        op,
        "k_cache",
        a.k_cache.len(),
        &[a.kv_heads, BLOCK_TOKENS, d],
    )?;
    check_view(
        op,
        "v_cache",
        a.v_cache.len(),
        &[a.kv_heads, BLOCK_TOKENS, d],
    )?;
    let (ml, o, counters) = attn_scratch_needs(a.m, a.q_heads, a.kv_heads, d);
    check_view(op, "ws_ml", scratch.ws_ml.len(), &[ml])?;
    check_view(op, "ws_o", scratch.ws_o.len(), &[o])?;
    check_view(op, "counters", scratch.counters.len(), &[counters])?;
    let p = AttnDecodeParams {
        q: a.q.addr(),
        k_cache: a.k_cache.addr(),
        v_cache: a.v_cache.addr(),
        block_table: a.block_table.addr(),
        slot_of_row: a.slot_of_row.addr(),
        ctx_lens: a.ctx_lens.addr(),
        out: a.out.addr(),
        ws_ml: scratch.ws_ml.addr(),
        ws_o: scratch.ws_o.addr(),
        counters: scratch.counters.addr(),
        m: to_i32(op, "m", a.m)?,
        q_heads: a.q_heads as i32,
        kv_heads: a.kv_heads as i32,
        ld_bt: to_i32(op, "ld_bt", a.ld_bt)?,
        scale: 1.0 / (d as f32).sqrt(),
        pad: 0,
    };
    let floats = MAX_GROUP * (d + 8) + WARPS * BLOCK_TOKENS * MAX_GROUP + WARPS * MAX_GROUP * d;
    let cfg = LaunchConfig {
        grid_dim: (
            a.kv_heads as u32,
            to_i32(op, "m", a.m)? as u32,
            a.grid_splits as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: (floats * 4) as u32,
    };
    launch_params(kernels, op, MODULE, entry, cfg, &p)
}

/// Reference of one row: `q` is `[q_heads][d]`, keys and values `[ctx][kv_heads][d]` in order of
/// position. Float64 softmax; the result rounded to bf16 once.
pub fn attention_decode_reference(
    q: &[bf16],
    keys: &[bf16],
    values: &[bf16],
    ctx: usize,
    q_heads: usize,
    kv_heads: usize,
    d: usize,
) -> Vec<bf16> {
    let group = q_heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(q_heads * d);
    for qh in 0..q_heads {
        let kvh = qh / group;
        let qv = &q[qh * d..(qh + 1) * d];
        let scores: Vec<f64> = (0..ctx)
            .map(|t| {
                let kv = &keys[(t * kv_heads + kvh) * d..(t * kv_heads + kvh + 1) * d];
                qv.iter()
                    .zip(kv)
                    .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for e in 0..d {
            let acc: f64 = (0..ctx)
                .map(|t| weights[t] * f64::from(values[(t * kv_heads + kvh) * d + e].to_f32()))
                .sum();
            out.push(bf16::from_f64(acc / total));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_context_in_whole_blocks() {
        for ctx in [
            1usize, 15, 16, 17, 63, 64, 65, 1000, 1024, 1152, 2049, 4096, 40_960,
        ] {
            let (count, per) = attn_splits(ctx);
            assert!((1..=MAX_SPLITS).contains(&count), "{ctx}");
            assert_eq!(per % BLOCK_TOKENS, 0);
            assert!(
                count * per >= ctx && (count - 1) * per < ctx,
                "{ctx}: {count} x {per}"
            );
        }
        assert_eq!(attn_splits(16), (1, 16));
        assert_eq!(attn_splits(1024), (16, 64));
        assert_eq!(attn_splits(40_960).0, 32);
    }

    #[test]
    fn reference_attends_to_the_matching_key() {
        // One query that equals key 2 scaled up: the softmax puts nearly all weight there.
        let d = 64;
        let mut keys = vec![bf16::ZERO; 4 * d];
        let mut values = vec![bf16::ZERO; 4 * d];
        for t in 0..4 {
            keys[t * d + t] = bf16::from_f32(1.0);
            values[t * d] = bf16::from_f32(t as f32);
        }
        let mut q = vec![bf16::ZERO; d];
        q[2] = bf16::from_f32(200.0);
        let out = attention_decode_reference(&q, &keys, &values, 4, 1, 1, d);
        assert!((out[0].to_f32() - 2.0).abs() < 0.01, "{}", out[0]);
    }
}
