//! Decode GEMV with fused prologue and epilogues (module `gemv`): `y = x W^T` for 1 to 8 tokens
//! on tensor cores, reading each weight byte once. See `kernels/gemv/gemv.cu` for the design.
//!
//! - Input: plain rows `x`, or the residual stream `h` normalised on the fly
//!   (`bf16((w + offset) * bf16(h * rsqrt(ssq / k + eps)))`, `ssq` the producer's sums of squares).
//! - Output: bf16 or f32 rows; `h += y` with new sums of squares (o_proj, down); SiLU-and-mul of
//!   the `[gate; up]` rows (gate_up); or q/k RMSNorm + NeoX RoPE with k and v written into the
//!   paged KV cache (qkv).
//!
//! How a projection is split over the GPU ([`gemv_split`]) depends on its shape and the SM count
//! only, never on the batch: a token's result is the same alone or with seven others.

use cudarc::driver::{DeviceRepr, LaunchConfig};
use half::bf16;

use super::launch::{check_view, launch_params, to_i32, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "gemv";
pub const ENTRY_PLAIN: &str = "gemv_bf16";
pub const ENTRY_NORM: &str = "gemv_norm_bf16";

/// Weight rows per work unit (one mma tile).
pub const TILE_ROWS: usize = 16;
/// Most tokens one launch carries (the mma N dimension).
pub const MAX_TOKENS: usize = 8;
/// Largest epilogue group (a head of 256).
pub const MAX_GROUP_ROWS: usize = 256;
const THREADS: u32 = 256;
const WARPS: usize = 8;
const BLOCKS_PER_SM: usize = 2;
const X_PAD: usize = 32;

/// Mirror of `GemvParams` in kernels/gemv/gemv.cu, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemvParams {
    w: u64,
    x: u64,
    ssq: u64,
    norm_w: u64,
    ws: u64,
    counters: u64,
    out: u64,
    residual: u64,
    ssq_out: u64,
    q_norm_w: u64,
    k_norm_w: u64,
    cos_sin: u64,
    k_cache: u64,
    v_cache: u64,
    block_table: u64,
    slot_of_row: u64,
    positions: u64,
    n: i32,
    k: i32,
    m: i32,
    ld_x: i32,
    ld_out: i32,
    ld_res: i32,
    ssq_groups: i32,
    eps: f32,
    norm_offset: f32,
    splits: i32,
    k_per_split: i32,
    group_rows: i32,
    epilogue: i32,
    pair_offset: i32,
    q_heads: i32,
    kv_heads: i32,
    head_dim: i32,
    max_pos: i32,
    ld_bt: i32,
    pad: i32,
}

// SAFETY: plain `repr(C)` data of integers and floats, laid out as the kernel's struct.
unsafe impl DeviceRepr for GemvParams {}

/// How a projection's K dimension is split across work units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvSplit {
    pub splits: usize,
    /// A multiple of 32.
    pub k_per_split: usize,
}

/// The split for an `n x k` projection on a GPU with `sm_count` SMs: enough work units
/// (16-row tiles x splits) for eight warps on every SM, each unit at least 256 elements of K.
pub fn gemv_split(n: usize, k: usize, sm_count: usize) -> GemvSplit {
    let tiles = n.div_ceil(TILE_ROWS).max(1);
    let chunks = k.div_ceil(32).max(1);
    let target_units = WARPS * sm_count.max(1);
    let max_splits = (chunks / 8).max(1);
    let splits = target_units.div_ceil(tiles).clamp(1, max_splits);
    let k_per_split = chunks.div_ceil(splits) * 32;
    GemvSplit {
        splits: k.div_ceil(k_per_split).max(1),
        k_per_split,
    }
}

/// Blocks of eight warps for `units` work units: every warp gets the same number of units (the
/// last ones fewer), at most two blocks per SM.
pub fn gemv_grid(units: usize, sm_count: usize) -> usize {
    let warps = WARPS * BLOCKS_PER_SM * sm_count.max(1);
    let per_warp = units.div_ceil(warps).max(1);
    units.div_ceil(WARPS * per_warp).max(1)
}

/// Work units of a launch (tiles of [`TILE_ROWS`] rows times splits).
pub fn gemv_units(n: usize, split: GemvSplit) -> usize {
    n.div_ceil(TILE_ROWS) * split.splits
}

/// Workspace floats and counters one GEMV needs (for sizing [`GemvScratch`]).
pub fn gemv_scratch_needs(
    n: usize,
    k: usize,
    group_rows: usize,
    sm_count: usize,
) -> (usize, usize) {
    let s = gemv_split(n, k, sm_count);
    // Room for the virtual rows of a SiLU-and-mul launch (n rounded up to whole tiles, plus one).
    let rows = n.next_multiple_of(TILE_ROWS) + TILE_ROWS;
    (
        s.splits * MAX_TOKENS * rows,
        rows.div_ceil(group_rows.max(1)),
    )
}

/// Split-K partials and the per-group arrival counters (zero between launches; the kernel
/// leaves them zero). One scratch serves every GEMV of a stream, one after another.
pub struct GemvScratch<'a> {
    pub ws: DevMut<'a, f32>,
    pub counters: DevMut<'a, u32>,
}

/// Where x comes from.
pub enum GemvInput<'a> {
    /// Rows `x[m][ld_x]`.
    Plain { x: DevRef<'a, bf16>, ld_x: usize },
    /// RMSNorm of the residual stream: rows `h[m][ld_h]`, sums of squares `ssq[groups][8]`.
    Norm {
        h: DevRef<'a, bf16>,
        ld_h: usize,
        ssq: DevRef<'a, f32>,
        ssq_groups: usize,
        weight: DevRef<'a, bf16>,
        eps: f32,
        weight_offset: f32,
    },
}

/// The q/k norm, RoPE and KV-cache write of the qkv projection.
pub struct QkvRope<'a> {
    pub q_out: DevMut<'a, bf16>,
    pub ld_q: usize,
    pub q_norm: DevRef<'a, bf16>,
    pub k_norm: DevRef<'a, bf16>,
    pub eps: f32,
    pub weight_offset: f32,
    /// `[max_pos][head_dim]` fp32: cos half, sin half (`rotary::cos_sin_cache`).
    pub cos_sin: DevRef<'a, f32>,
    pub max_pos: usize,
    /// `[blocks][kv_heads][16][head_dim]`.
    pub k_cache: DevMut<'a, bf16>,
    pub v_cache: DevMut<'a, bf16>,
    /// `[slots][ld_bt]` block ids.
    pub block_table: DevRef<'a, i32>,
    pub ld_bt: usize,
    pub slot_of_row: DevRef<'a, i32>,
    pub positions: DevRef<'a, i32>,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// What happens to y.
pub enum GemvOutput<'a> {
    Bf16 {
        out: DevMut<'a, bf16>,
        ld_out: usize,
    },
    F32 {
        out: DevMut<'a, f32>,
        ld_out: usize,
    },
    /// `h = bf16(h + bf16(y))`, and the new sums of squares per 16-row group (`ssq_out[n/16][8]`).
    Residual {
        h: DevMut<'a, bf16>,
        ld_h: usize,
        ssq_out: DevMut<'a, f32>,
    },
    /// W holds `[gate; up]` (`2 * intermediate` rows): `act = silu(gate) * up`, `out[m][intermediate]`.
    SiluMul {
        out: DevMut<'a, bf16>,
        ld_out: usize,
        intermediate: usize,
    },
    QkvRope(QkvRope<'a>),
}

/// Virtual rows of a SiLU-and-mul GEMV: groups of 8 gate and 8 up rows.
pub fn silu_virtual_rows(intermediate: usize) -> usize {
    intermediate.div_ceil(TILE_ROWS / 2) * TILE_ROWS
}

/// Sums-of-squares groups a residual GEMV of `n` rows writes (its consumer's `ssq_groups`).
pub fn residual_groups(n: usize) -> usize {
    n.div_ceil(TILE_ROWS)
}

/// Runs `y = x W^T` for `m` tokens through `input` and `output`. `w` is `[n][k]` row-major
/// (`n = 2 * intermediate` for SiluMul, `(q_heads + 2 kv_heads) * head_dim` for QkvRope).
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    kernels: &LoadedKernels,
    w: DevRef<'_, bf16>,
    n: usize,
    k: usize,
    m: usize,
    input: &GemvInput<'_>,
    output: GemvOutput<'_>,
    scratch: &mut GemvScratch<'_>,
) -> Result<(), OpsError> {
    let op = "gemv";
    let shape_err = |message: String| OpsError::Shape { op, message };
    if n == 0 || k == 0 || m == 0 || m > MAX_TOKENS || !k.is_multiple_of(8) {
        return Err(shape_err(format!(
            "n {n} x k {k} for {m} tokens: need n, k > 0, k a multiple of 8 and 1..={MAX_TOKENS} tokens"
        )));
    }
    check_view(op, "w", w.len(), &[n, k])?;
    let split = gemv_split(n, k, kernels.sm_count());
    let mut p = GemvParams {
        w: w.addr(),
        n: to_i32(op, "n", n)?,
        k: to_i32(op, "k", k)?,
        m: m as i32,
        splits: split.splits as i32,
        k_per_split: split.k_per_split as i32,
        group_rows: TILE_ROWS as i32,
        ..GemvParams::default()
    };

    let (entry, smem) = match input {
        GemvInput::Plain { x, ld_x } => {
            if !ld_x.is_multiple_of(8) || *ld_x < k {
                return Err(shape_err(format!(
                    "ld_x {ld_x} must be >= k {k} and a multiple of 8"
                )));
            }
            check_view(op, "x", x.len(), &[(m - 1) * ld_x + k])?;
            p.x = x.addr();
            p.ld_x = to_i32(op, "ld_x", *ld_x)?;
            (ENTRY_PLAIN, 0)
        }
        GemvInput::Norm {
            h,
            ld_h,
            ssq,
            ssq_groups,
            weight,
            eps,
            weight_offset,
        } => {
            if !ld_h.is_multiple_of(8) || *ld_h < k || *ssq_groups == 0 {
                return Err(shape_err(format!(
                    "ld_h {ld_h} must be >= k {k} and a multiple of 8; ssq_groups {ssq_groups} > 0"
                )));
            }
            check_view(op, "h", h.len(), &[(m - 1) * ld_h + k])?;
            check_view(op, "ssq", ssq.len(), &[*ssq_groups, MAX_TOKENS])?;
            check_view(op, "norm weight", weight.len(), &[k])?;
            p.x = h.addr();
            p.ld_x = to_i32(op, "ld_h", *ld_h)?;
            p.ssq = ssq.addr();
            p.ssq_groups = to_i32(op, "ssq_groups", *ssq_groups)?;
            p.norm_w = weight.addr();
            p.eps = *eps;
            p.norm_offset = *weight_offset;
            (ENTRY_NORM, m * (k + X_PAD) * 2)
        }
    };

    let check_out = |what: &str, len: usize, ld: usize, width: usize| -> Result<(), OpsError> {
        if ld < width {
            return Err(shape_err(format!(
                "{what}: row stride {ld} is below the row width {width}"
            )));
        }
        check_view(op, what, len, &[(m - 1) * ld + width])
    };
    match output {
        GemvOutput::Bf16 { out, ld_out } => {
            check_out("out", out.len(), ld_out, n)?;
            p.out = out.addr();
            p.ld_out = to_i32(op, "ld_out", ld_out)?;
            p.epilogue = 0;
        }
        GemvOutput::F32 { out, ld_out } => {
            check_out("out", out.len(), ld_out, n)?;
            p.out = out.addr();
            p.ld_out = to_i32(op, "ld_out", ld_out)?;
            p.epilogue = 1;
        }
        GemvOutput::Residual { h, ld_h, ssq_out } => {
            check_out("h", h.len(), ld_h, n)?;
            check_view(
                op,
                "ssq_out",
                ssq_out.len(),
                &[residual_groups(n), MAX_TOKENS],
            )?;
            p.residual = h.addr();
            p.ld_res = to_i32(op, "ld_h", ld_h)?;
            p.ssq_out = ssq_out.addr();
            p.epilogue = 2;
        }
        GemvOutput::SiluMul {
            out,
            ld_out,
            intermediate,
        } => {
            if n != 2 * intermediate {
                return Err(shape_err(format!(
                    "SiLU-and-mul needs n = 2 x intermediate (the [gate; up] rows); got n {n}, intermediate {intermediate}"
                )));
            }
            check_out("out", out.len(), ld_out, intermediate)?;
            p.out = out.addr();
            p.ld_out = to_i32(op, "ld_out", ld_out)?;
            p.epilogue = 3;
            p.pair_offset = to_i32(op, "intermediate", intermediate)?;
            // Virtual rows: each 16-row group holds 8 gate and 8 up rows.
            p.n = to_i32(op, "n", silu_virtual_rows(intermediate))?;
        }
        GemvOutput::QkvRope(q) => {
            let d = q.head_dim;
            if ![64, 128, 256].contains(&d)
                || q.kv_heads == 0
                || !q.q_heads.is_multiple_of(q.kv_heads)
                || n != (q.q_heads + 2 * q.kv_heads) * d
            {
                return Err(shape_err(format!(
                    "qkv: n {n} must be (q_heads {} + 2 x kv_heads {}) x head_dim {d}, head_dim one of 64/128/256",
                    q.q_heads, q.kv_heads
                )));
            }
            if m > 8 {
                return Err(shape_err("qkv epilogue handles at most 8 tokens".into()));
            }
            check_out("q_out", q.q_out.len(), q.ld_q, q.q_heads * d)?;
            check_view(op, "q_norm", q.q_norm.len(), &[d])?;
            check_view(op, "k_norm", q.k_norm.len(), &[d])?;
            check_view(op, "cos_sin", q.cos_sin.len(), &[q.max_pos, d])?;
            check_view(op, "slot_of_row", q.slot_of_row.len(), &[m])?;
            check_view(op, "positions", q.positions.len(), &[m])?;
            if q.ld_bt == 0 || q.block_table.len() < q.ld_bt {
                return Err(shape_err(
                    "block_table must hold at least one row of ld_bt entries".into(),
                ));
            }
            let block_elems = q.kv_heads * 16 * d;
            if q.k_cache.len() < block_elems || q.v_cache.len() < block_elems {
                return Err(shape_err("the KV cache holds less than one block".into()));
            }
            p.out = q.q_out.addr();
            p.ld_out = to_i32(op, "ld_q", q.ld_q)?;
            p.q_norm_w = q.q_norm.addr();
            p.k_norm_w = q.k_norm.addr();
            p.eps = q.eps;
            p.norm_offset = q.weight_offset;
            p.cos_sin = q.cos_sin.addr();
            p.max_pos = to_i32(op, "max_pos", q.max_pos)?;
            p.k_cache = q.k_cache.addr();
            p.v_cache = q.v_cache.addr();
            p.block_table = q.block_table.addr();
            p.ld_bt = to_i32(op, "ld_bt", q.ld_bt)?;
            p.slot_of_row = q.slot_of_row.addr();
            p.positions = q.positions.addr();
            p.q_heads = q.q_heads as i32;
            p.kv_heads = q.kv_heads as i32;
            p.head_dim = d as i32;
            p.group_rows = d as i32;
            p.epilogue = 4;
            // The kernel checks positions and block ids against these bounds; a block id past the
            // cache cannot be checked there, so the cache must hold every id the table can name.
        }
    }
    // Only the residual and store epilogues may run per tile; the others need whole groups.
    let vn = p.n as usize; // virtual rows (SiLU-and-mul pads its last gate/up group)
    let (ws_need, counters_need) = (split.splits * m * vn, vn.div_ceil(p.group_rows as usize));
    check_view(op, "workspace", scratch.ws.len(), &[ws_need])?;
    check_view(op, "counters", scratch.counters.len(), &[counters_need])?;
    p.ws = scratch.ws.addr();
    p.counters = scratch.counters.addr();

    let units = gemv_units(vn, split);
    let grid = gemv_grid(units, kernels.sm_count());
    let cfg = LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch_params(kernels, op, MODULE, entry, cfg, &p)
}

/// `y[t][r] = sum_k x[t][k] w[r][k]` in float64 (the kernel's fp32 sum approximates it).
pub fn gemv_reference(w: &[bf16], n: usize, k: usize, x: &[bf16], m: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; m * n];
    for t in 0..m {
        let xr: Vec<f64> = x[t * k..(t + 1) * k]
            .iter()
            .map(|v| f64::from(v.to_f32()))
            .collect();
        for r in 0..n {
            let wr = &w[r * k..(r + 1) * k];
            y[t * n + r] = wr
                .iter()
                .zip(&xr)
                .map(|(a, b)| f64::from(a.to_f32()) * b)
                .sum();
        }
    }
    y
}

/// Reference of the norm prologue: `bf16((w + offset) * bf16(h * rsqrt(ssq / k + eps)))` per row,
/// with `ssq` the row's sum of squares as the producer gave it.
pub fn norm_input_reference(
    h: &[bf16],
    k: usize,
    ssq: &[f32],
    weight: &[bf16],
    eps: f32,
    offset: f32,
) -> Vec<bf16> {
    let mut out = Vec::with_capacity(h.len());
    for (row, &s) in h.chunks_exact(k).zip(ssq) {
        let scale = 1.0 / (f64::from(s) / k as f64 + f64::from(eps)).sqrt();
        for (&x, &w) in row.iter().zip(weight) {
            let normed = bf16::from_f64(f64::from(x.to_f32()) * scale);
            out.push(bf16::from_f32((w.to_f32() + offset) * normed.to_f32()));
        }
    }
    out
}

/// Reference of the residual epilogue: returns the new h and its sums of squares per 16-row group
/// (`[groups][8]`, rows past `m` zero).
pub fn residual_reference(y: &[f64], h: &[bf16], n: usize, m: usize) -> (Vec<bf16>, Vec<f32>) {
    let groups = residual_groups(n);
    let mut new_h = h.to_vec();
    let mut ssq = vec![0.0f32; groups * MAX_TOKENS];
    for t in 0..m {
        for r in 0..n {
            let o = bf16::from_f64(y[t * n + r]).to_f32();
            let v = bf16::from_f32(o + h[t * n + r].to_f32());
            new_h[t * n + r] = v;
            ssq[(r / TILE_ROWS) * MAX_TOKENS + t] += v.to_f32() * v.to_f32();
        }
    }
    (new_h, ssq)
}

/// Reference of the SiLU-and-mul epilogue on `y = x [gate; up]^T` (`n = 2 * intermediate`).
pub fn silu_mul_reference(y: &[f64], intermediate: usize, m: usize) -> Vec<bf16> {
    let n = 2 * intermediate;
    let mut out = Vec::with_capacity(m * intermediate);
    for t in 0..m {
        for j in 0..intermediate {
            let g = f64::from(bf16::from_f64(y[t * n + j]).to_f32());
            let u = bf16::from_f64(y[t * n + intermediate + j]).to_f32();
            let act = bf16::from_f64(g / (1.0 + (-g).exp())).to_f32();
            out.push(bf16::from_f32(act * u));
        }
    }
    out
}

/// Shapes of the qkv epilogue reference.
#[derive(Debug, Clone, Copy)]
pub struct QkvShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub weight_offset: f32,
}

/// One head through RMSNorm (with `norm`) and NeoX RoPE (from the fp32 table row `cs`), or, for v
/// heads (`norm` None), only rounded. Returns the bf16 head.
pub fn qkv_head_reference(y: &[f64], norm: Option<&[bf16]>, cs: &[f32], s: &QkvShape) -> Vec<bf16> {
    let d = s.head_dim;
    let half = d / 2;
    let v: Vec<f32> = y.iter().map(|&x| bf16::from_f64(x).to_f32()).collect();
    let Some(w) = norm else {
        return v.iter().map(|&x| bf16::from_f32(x)).collect();
    };
    let ss: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let scale = 1.0 / (ss / d as f64 + f64::from(s.eps)).sqrt();
    let n: Vec<f64> = v
        .iter()
        .zip(w)
        .map(|(&x, &wv)| {
            let normed = bf16::from_f64(f64::from(x) * scale).to_f32();
            f64::from(bf16::from_f32((wv.to_f32() + s.weight_offset) * normed).to_f32())
        })
        .collect();
    let mut out = vec![bf16::ZERO; d];
    for i in 0..half {
        let (c, sn) = (f64::from(cs[i]), f64::from(cs[i + half]));
        out[i] = bf16::from_f64(n[i] * c - n[i + half] * sn);
        out[i + half] = bf16::from_f64(n[i + half] * c + n[i] * sn);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_and_cover_k() {
        // Qwen3-4B projections on an H200 (132 SMs).
        for (n, k, want_splits) in [
            (6144, 2560, 3),
            (2560, 4096, 7),
            (19456, 2560, 1),
            (2560, 9728, 7),
            (151_936, 2560, 1),
        ] {
            let s = gemv_split(n, k, 132);
            assert_eq!(s.splits, want_splits, "{n}x{k}");
            assert_eq!(s.k_per_split % 32, 0);
            assert!(
                s.splits * s.k_per_split >= k && (s.splits - 1) * s.k_per_split < k,
                "{n}x{k}: {s:?}"
            );
            // At least a warp's worth of units per SM, and the grid covers them.
            let units = gemv_units(n, s);
            assert!(units >= 8 * 132, "{n}x{k}: {units} units");
            let grid = gemv_grid(units, 132);
            assert!(grid <= 2 * 132 && grid * 8 * units.div_ceil(grid * 8) >= units);
        }
        // Tiny shapes: one split, at least one unit.
        let s = gemv_split(40, 24, 132);
        assert_eq!((s.splits, gemv_units(40, s)), (1, 3));
    }

    #[test]
    fn reference_epilogues_agree_with_their_definitions() {
        let w: Vec<bf16> = (0..4 * 8)
            .map(|i| bf16::from_f32((i % 5) as f32 - 2.0))
            .collect();
        let x: Vec<bf16> = (0..8).map(|i| bf16::from_f32(i as f32 * 0.5)).collect();
        let y = gemv_reference(&w, 4, 8, &x, 1);
        let want0: f64 = (0..8)
            .map(|i| ((i % 5) as f64 - 2.0) * i as f64 * 0.5)
            .sum();
        assert_eq!(y[0], want0);
        let h = vec![bf16::from_f32(1.0); 4];
        let (nh, ssq) = residual_reference(&y, &h, 4, 1);
        assert_eq!(nh[0], bf16::from_f64(want0 + 1.0));
        let total: f32 = nh.iter().map(|v| v.to_f32().powi(2)).sum();
        assert_eq!(ssq[0], total);
    }
}
