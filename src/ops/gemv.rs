//! Decode GEMV with fused prologue and epilogues (module `gemv`): `y = x W^T` for 1 to 8 tokens
//! on tensor cores, reading each weight byte once. See `kernels/gemv/gemv.cu` for the design.
//!
//! - Input: plain rows `x`, or the residual stream `h` normalised on the fly
//!   (`bf16((w + offset) * bf16(h * rsqrt(ssq / k + eps)))`, `ssq` the producer's sums of squares).
//! - Output: bf16 or f32 rows; `h += y` with new sums of squares (o_proj, down), and optionally
//!   the RMSNorm of the new h as well (a layer's output projection, the add and the norm after it
//!   in one launch); or SiLU-and-mul of the `[gate; up]` rows (gate_up).
//!
//! How a projection is laid out over the GPU ([`gemv_shape`]) depends on its shape and the SM
//! count only, never on the batch: a token's result is the same alone or with seven others.

use cudarc::driver::{DeviceRepr, LaunchConfig};
use half::bf16;

use super::launch::{
    check_aligned, check_view, launch_params_pdl, to_i32, DevMut, DevRef, OpsError,
};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "gemv";
pub const ENTRY_PLAIN: &str = "gemv_bf16";
pub const ENTRY_NORM: &str = "gemv_norm_bf16";
/// The wide norm kernel whose prologue requests every row's h at once (see [`norm_all_rows`]).
pub const ENTRY_NORM_ROWS: &str = "gemv_norm_rows_bf16";
pub const ENTRY_NARROW_PLAIN: &str = "gemv_narrow_bf16";
pub const ENTRY_NARROW_NORM: &str = "gemv_narrow_norm_bf16";
/// The narrow kernels that stage each warp's first weights in shared memory before their
/// `griddepcontrol.wait` (see [`GemvOptions::overlap_previous`]).
pub const ENTRY_NARROW_STAGED: &str = "gemv_narrow_staged_bf16";
pub const ENTRY_NARROW_NORM_STAGED: &str = "gemv_narrow_norm_staged_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[
    (MODULE, ENTRY_PLAIN),
    (MODULE, ENTRY_NORM),
    (MODULE, ENTRY_NORM_ROWS),
    (MODULE, ENTRY_NARROW_PLAIN),
    (MODULE, ENTRY_NARROW_NORM),
    (MODULE, ENTRY_NARROW_STAGED),
    (MODULE, ENTRY_NARROW_NORM_STAGED),
];

/// Weight rows per tile (one mma tile) and per epilogue group.
pub const TILE_ROWS: usize = 16;
/// Most tokens one launch carries (the mma N dimension).
pub const MAX_TOKENS: usize = 8;
const THREADS: u32 = 256;
const WARPS: usize = 8;
const BLOCKS_PER_SM: usize = 2;
const X_PAD: usize = 32;
/// Weight chunks of 32 elements each lane stages (kStagePlain, kStageNorm in the kernel).
const STAGE_CHUNKS_PLAIN: usize = 8;
const STAGE_CHUNKS_NORM: usize = 6;

/// Dynamic shared memory the staged entries add after x: `[warp][chunk][lo, hi][lane]` of 16 bytes.
pub fn stage_bytes(norm: bool) -> usize {
    let chunks = if norm {
        STAGE_CHUNKS_NORM
    } else {
        STAGE_CHUNKS_PLAIN
    };
    WARPS * chunks * 2 * 32 * 16
}

/// Mirror of `GemvParams` in kernels/gemv/gemv.cu, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemvParams {
    w: u64,
    x: u64,
    ssq: u64,
    norm_w: u64,
    out: u64,
    residual: u64,
    ssq_out: u64,
    parts: [u64; MORE_PARTS],
    n: i32,
    k: i32,
    m: i32,
    ld_x: i32,
    ld_out: i32,
    ld_res: i32,
    ssq_groups: i32,
    eps: f32,
    norm_offset: f32,
    epilogue: i32,
    pair_offset: i32,
    part_start: [i32; MORE_PARTS],
    part_ld: [i32; MORE_PARTS],
    pad: i32,
    out_norm_w: u64,
    normed: u64,
    arrived: u64,
    out_eps: f32,
    out_norm_offset: f32,
    conv_w: u64,
    conv_state: u64,
    conv_slots: u64,
    conv_has_state: u64,
    conv_channels: i32,
    pad2: i32,
}

/// Parts after the first that a [`GemvOutput::Bf16Parts`] launch can write (`kMoreParts`).
const MORE_PARTS: usize = 3;

/// The most parts a [`GemvOutput::Bf16Parts`] launch writes.
pub const MAX_PARTS: usize = MORE_PARTS + 1;

const _: () = assert!(std::mem::size_of::<GemvParams>() == 224);

// SAFETY: plain `repr(C)` data of integers and floats, laid out as the kernel's struct.
unsafe impl DeviceRepr for GemvParams {}

/// How a launch covers its tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvShape {
    /// Blocks take tiles in turn, two at a time with four warps splitting the K of each (a last
    /// odd one with eight), when there are few tiles; else each warp takes whole tiles.
    pub narrow: bool,
    pub blocks: usize,
}

/// The layout for `n` rows on a GPU with `sm_count` SMs: warps take whole tiles when there are
/// enough tiles for eight warps on every SM; otherwise blocks take tiles in turn and split K.
///
/// Finer distributions lost: a tile shared by two blocks pays a serial tail (fence, counter,
/// re-read), and spreading a block's tiles over all eight warps cost gate_up more than qkv gained.
/// Weights asked into L2 ahead of the loads, by bulk or per-line prefetch, made every launch slower.
pub fn gemv_shape(n: usize, sm_count: usize) -> GemvShape {
    let tiles = n.div_ceil(TILE_ROWS).max(1);
    let sm = sm_count.max(1);
    if tiles >= WARPS * sm {
        // Two blocks on every SM, the tiles dealt to them in turn (see the kernel): each SM then
        // streams an even share. (Packing them into tiles / 8 blocks left some SMs with twice the
        // tiles of others.)
        let per_warp = tiles.div_ceil(WARPS * BLOCKS_PER_SM * sm).max(1);
        GemvShape {
            narrow: false,
            blocks: (BLOCKS_PER_SM * sm).min(tiles.div_ceil(per_warp)),
        }
    } else {
        // At most two blocks an SM, each looping over its tiles, so the norm prologue is paid once
        // a block and no partial second wave runs (a block per tile ran 1.45 waves for qkv).
        GemvShape {
            narrow: true,
            blocks: tiles.min(BLOCKS_PER_SM * sm),
        }
    }
}

/// From this many rows the wide norm launches (gate_up, lm_head) take `gemv_norm_rows_bf16`,
/// whose prologue requests every row's h at once (one L2 round trip instead of a pass per four
/// chunks), at the cost of registers (112; 100 in the passes kernel), which outweigh the saved
/// round trips below four rows. Measured with the 128 registers of the first build, not since.
pub const NORM_ALL_ROWS_MIN: usize = 4;

/// Whether a wide norm launch of `m` rows takes the all-rows prologue. Both prologues build the
/// same normalised x, element for element, so a token's result does not depend on which ran (nor,
/// so, on the batch).
pub fn norm_all_rows(m: usize) -> bool {
    m >= NORM_ALL_ROWS_MIN
}

/// How a GEMV launch relates to the kernel before it (`GemvOptions::default()`: as any launch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GemvOptions {
    /// Let the launch overlap the end of the kernel before it: a narrow layout then takes the
    /// staged entry, whose warps copy their first weights into shared memory while the previous
    /// kernel still runs, and launches with programmatic dependent launch. Only where
    /// [`LoadedKernels::overlap_launch`] allows it (an sm_90+ image on Hopper or later with a
    /// 12.3+ driver, and `AOT_KERNELS_PDL` not `off`) and where two staged blocks fit an SM's shared memory
    /// ([`LoadedKernels::blocks_fit_smem`]: on a 100 KiB SM never, on the H200 up to k = 3614 at
    /// eight rows with the norm input); otherwise, and for wide layouts, the launch is as
    /// without it. Same bits either way.
    ///
    /// Contract: no kernel enqueued earlier on the stream that may still be running writes `w`
    /// (weights are written before decode starts; with programmatic launch that includes kernels
    /// two or more launches back, since every GEMV lets the next start early). x, h and the sums
    /// of squares are read only after the wait, so they may come from the kernel just before.
    ///
    /// Worth it where the kernel before leaves SMs free or ends unevenly (qkv after down, o_proj
    /// after attention). Staging without the overlap, and in gate_up and down, lost.
    pub overlap_previous: bool,
}

impl GemvOptions {
    /// Options with [`Self::overlap_previous`] set to `overlap`.
    pub fn overlap_previous(overlap: bool) -> Self {
        GemvOptions {
            overlap_previous: overlap,
        }
    }
}

/// The entry and dynamic shared memory of a launch: `norm` for the RMSNorm input, `shape` from
/// [`gemv_shape`], `staged` when the launch overlaps the previous kernel (narrow layouts only).
pub fn gemv_entry(
    norm: bool,
    m: usize,
    k: usize,
    shape: GemvShape,
    staged: bool,
) -> (&'static str, usize) {
    let x_bytes = if norm { m * (k + X_PAD) * 2 } else { 0 };
    let entry = match (norm, shape.narrow, staged && shape.narrow) {
        (false, true, true) => ENTRY_NARROW_STAGED,
        (true, true, true) => ENTRY_NARROW_NORM_STAGED,
        (false, true, false) => ENTRY_NARROW_PLAIN,
        (true, true, false) => ENTRY_NARROW_NORM,
        (false, false, _) => ENTRY_PLAIN,
        (true, false, _) if norm_all_rows(m) => ENTRY_NORM_ROWS,
        (true, false, _) => ENTRY_NORM,
    };
    let stage = if staged && shape.narrow {
        stage_bytes(norm)
    } else {
        0
    };
    (entry, x_bytes + stage)
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
    /// [`GemvOutput::Residual`], then `normed = bf16((w + offset) * bf16(h * rsqrt(ssq / n +
    /// eps)))` for every token over the n values of its new h: the add and the RMSNorm after a
    /// layer's output projection, in its launch. The last block to finish writes `normed` (from
    /// the blocks' sums of squares, added in a fixed order) and sets `arrived` back to zero, so it
    /// must hold zero before the launch, and launches sharing it must not run concurrently. n a
    /// multiple of 8; h and normed 16-byte aligned with row strides a multiple of 8; the input
    /// [`GemvInput::Plain`] (the kernels with the norm prologue do not carry this epilogue).
    ResidualNorm {
        h: DevMut<'a, bf16>,
        ld_h: usize,
        ssq_out: DevMut<'a, f32>,
        norm: OutputNorm<'a>,
        normed: DevMut<'a, bf16>,
        ld_normed: usize,
        arrived: DevMut<'a, i32>,
    },
    /// W holds `[gate; up]` (`2 * intermediate` rows): `act = silu(gate) * up`, `out[m][intermediate]`.
    SiluMul {
        out: DevMut<'a, bf16>,
        ld_out: usize,
        intermediate: usize,
    },
    /// W holds several projections of the same input one after another (a DeltaNet layer's
    /// `in_proj_qkv`, `z`, `b` and `a`): y's rows go to one output per projection, in order, each
    /// `out[m][width]` with its own rows contiguous; one launch instead of one per projection.
    /// 1 to [`MAX_PARTS`] parts whose widths add up to n, each but the last a multiple of 16 rows
    /// (a tile never straddles two parts). Each output gets the bits a Bf16 launch of the whole W
    /// would write into its columns.
    Bf16Parts {
        parts: Vec<GemvPart<'a>>,
    },
    /// [`GemvOutput::Bf16Parts`] in a DeltaNet layer's decode pass (one token per sequence, each
    /// row its own sequence): the first part's channels, the conv's `[q | k | v]`, go through the
    /// causal depthwise conv over each token's conv state and the SiLU before they are stored, and
    /// the states shift by the token. The bits are those of the Triton module `gdn_conv1d` on the
    /// stored part (the same instructions), so the delta rule can follow at once
    /// (`gated_delta_net::gdn_decode_convolved`): one launch fewer a layer.
    Bf16PartsConv {
        parts: Vec<GemvPart<'a>>,
        conv: PartsConv<'a>,
    },
}

/// The conv of a [`GemvOutput::Bf16PartsConv`] launch.
pub struct PartsConv<'a> {
    /// `conv1d.weight` as `[channels][CONV_WIDTH]` (channels: the first part's width), 8-byte aligned.
    pub weight: DevRef<'a, bf16>,
    /// The state pool `[slots][CONV_WIDTH - 1][channels]`, oldest input first (`gdn_conv1d`'s).
    pub state: DevMut<'a, bf16>,
    /// `[m]`: each token's slot in the pool. Distinct, and below the pool's slot count: they live
    /// on the device, so the launcher cannot check them.
    pub slots: DevRef<'a, i32>,
    /// `[m]`: 0 for a sequence that starts here (its slot's old content is ignored), else 1.
    pub has_state: DevRef<'a, i32>,
}

/// The taps of the conv a [`GemvOutput::Bf16PartsConv`] launch runs (`kConvWidth`).
pub const CONV_WIDTH: usize = 4;

/// The RMSNorm a [`GemvOutput::ResidualNorm`] launch applies to the new h.
pub struct OutputNorm<'a> {
    /// `[n]`.
    pub weight: DevRef<'a, bf16>,
    pub eps: f32,
    /// 0: `w`; 1: `(1 + w)` (the zero-centred norms of Qwen3.5/3.6).
    pub weight_offset: f32,
}

/// One projection's output of a [`GemvOutput::Bf16Parts`] launch.
pub struct GemvPart<'a> {
    pub out: DevMut<'a, bf16>,
    /// Its rows of W (and columns of y).
    pub width: usize,
}

/// Checks the widths of a [`GemvOutput::Bf16Parts`] launch of `n` rows; the message says which
/// rule a width breaks.
pub fn check_parts(n: usize, widths: &[usize]) -> Result<(), String> {
    if widths.is_empty() || widths.len() > MAX_PARTS {
        return Err(format!(
            "{} parts: a launch writes 1 to {MAX_PARTS}",
            widths.len()
        ));
    }
    if let Some(i) = widths.iter().position(|&w| w == 0) {
        return Err(format!("part {i} is empty"));
    }
    let last = widths.len() - 1;
    if let Some(i) = widths[..last]
        .iter()
        .position(|w| !w.is_multiple_of(TILE_ROWS))
    {
        return Err(format!(
            "part {i} is {} rows wide: every part but the last must be a multiple of {TILE_ROWS} rows (a tile's)",
            widths[i]
        ));
    }
    let total: usize = widths.iter().sum();
    if total != n {
        return Err(format!(
            "the parts' widths add up to {total}, not the n {n} of W's rows"
        ));
    }
    Ok(())
}

/// Virtual rows of a SiLU-and-mul GEMV: tiles of 8 gate and 8 up rows.
pub fn silu_virtual_rows(intermediate: usize) -> usize {
    intermediate.div_ceil(TILE_ROWS / 2) * TILE_ROWS
}

/// Sums-of-squares groups a residual GEMV of `n` rows writes (its consumer's `ssq_groups`).
pub fn residual_groups(n: usize) -> usize {
    n.div_ceil(TILE_ROWS)
}

/// Runs `y = x W^T` for `m` tokens through `input` and `output`. `w` is `[n][k]` row-major
/// (`n = 2 * intermediate` for SiluMul).
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    kernels: &LoadedKernels,
    w: DevRef<'_, bf16>,
    n: usize,
    k: usize,
    m: usize,
    input: &GemvInput<'_>,
    output: GemvOutput<'_>,
) -> Result<(), OpsError> {
    gemv_with(kernels, w, n, k, m, input, output, GemvOptions::default())
}

/// [`gemv`] with [`GemvOptions`].
#[allow(clippy::too_many_arguments)]
pub fn gemv_with(
    kernels: &LoadedKernels,
    w: DevRef<'_, bf16>,
    n: usize,
    k: usize,
    m: usize,
    input: &GemvInput<'_>,
    output: GemvOutput<'_>,
    options: GemvOptions,
) -> Result<(), OpsError> {
    let op = "gemv";
    let shape_err = |message: String| OpsError::Shape { op, message };
    if n == 0 || k == 0 || m == 0 || m > MAX_TOKENS || !k.is_multiple_of(8) {
        return Err(shape_err(format!(
            "n {n} x k {k} for {m} tokens: need n, k > 0, k a multiple of 8 and 1..={MAX_TOKENS} tokens"
        )));
    }
    check_view(op, "w", w.len(), &[n, k])?;
    // Weights and inputs move in 16-byte copies (`cp.async`, `uint4`).
    check_aligned(op, "w", w.addr(), 16)?;
    let mut p = GemvParams {
        w: w.addr(),
        n: to_i32(op, "n", n)?,
        k: to_i32(op, "k", k)?,
        m: m as i32,
        ..GemvParams::default()
    };

    let norm = match input {
        GemvInput::Plain { x, ld_x } => {
            if !ld_x.is_multiple_of(8) || *ld_x < k {
                return Err(shape_err(format!(
                    "ld_x {ld_x} must be >= k {k} and a multiple of 8"
                )));
            }
            check_view(op, "x", x.len(), &[(m - 1) * ld_x + k])?;
            check_aligned(op, "x", x.addr(), 16)?;
            p.x = x.addr();
            p.ld_x = to_i32(op, "ld_x", *ld_x)?;
            false
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
            check_aligned(op, "h", h.addr(), 16)?;
            check_view(op, "ssq", ssq.len(), &[*ssq_groups, MAX_TOKENS])?;
            check_view(op, "norm weight", weight.len(), &[k])?;
            p.x = h.addr();
            p.ld_x = to_i32(op, "ld_h", *ld_h)?;
            p.ssq = ssq.addr();
            p.ssq_groups = to_i32(op, "ssq_groups", *ssq_groups)?;
            p.norm_w = weight.addr();
            p.eps = *eps;
            p.norm_offset = *weight_offset;
            true
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
            set_residual(&mut p, &h, ld_h, &ssq_out, n)?;
            p.epilogue = 2;
        }
        GemvOutput::ResidualNorm {
            h,
            ld_h,
            ssq_out,
            norm: out_norm,
            normed,
            ld_normed,
            arrived,
        } => {
            if norm {
                return Err(shape_err(
                    "the residual-norm output takes a plain input: a norm input reads h before other blocks add into it; pass the normalised rows as GemvInput::Plain".into(),
                ));
            }
            // The last block normalises in 16-byte chunks of 8 values.
            if !n.is_multiple_of(8) || !ld_h.is_multiple_of(8) || !ld_normed.is_multiple_of(8) {
                return Err(shape_err(format!(
                    "the norm after the residual add reads 8 values at a time: n {n}, ld_h {ld_h} and ld_normed {ld_normed} must be multiples of 8"
                )));
            }
            check_out("h", h.len(), ld_h, n)?;
            check_out("normed", normed.len(), ld_normed, n)?;
            check_aligned(op, "h", h.addr(), 16)?;
            check_aligned(op, "normed", normed.addr(), 16)?;
            check_view(op, "norm weight", out_norm.weight.len(), &[n])?;
            check_aligned(op, "norm weight", out_norm.weight.addr(), 16)?;
            check_view(op, "arrived", arrived.len(), &[1])?;
            set_residual(&mut p, &h, ld_h, &ssq_out, n)?;
            p.out_norm_w = out_norm.weight.addr();
            p.out_eps = out_norm.eps;
            p.out_norm_offset = out_norm.weight_offset;
            p.normed = normed.addr();
            p.ld_out = to_i32(op, "ld_normed", ld_normed)?;
            p.arrived = arrived.addr();
            p.epilogue = 5;
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
            // Virtual rows: each 16-row tile holds 8 gate and 8 up rows.
            p.n = to_i32(op, "n", silu_virtual_rows(intermediate))?;
        }
        GemvOutput::Bf16Parts { parts } => {
            set_parts(&mut p, n, m, &parts)?;
            p.epilogue = 4;
        }
        GemvOutput::Bf16PartsConv { parts, conv } => {
            set_parts(&mut p, n, m, &parts)?;
            let channels = parts[0].width;
            check_view(
                op,
                "conv weight",
                conv.weight.len(),
                &[channels, CONV_WIDTH],
            )?;
            check_aligned(op, "conv weight", conv.weight.addr(), 8)?;
            let slot_len = (CONV_WIDTH - 1) * channels;
            if conv.state.len() < slot_len || !conv.state.len().is_multiple_of(slot_len) {
                return Err(shape_err(format!(
                    "conv state: {} values is not a pool of [slots][{}][{channels}] (the first part's channels)",
                    conv.state.len(),
                    CONV_WIDTH - 1
                )));
            }
            check_view(op, "conv slots", conv.slots.len(), &[m])?;
            check_view(op, "conv has_state", conv.has_state.len(), &[m])?;
            p.conv_w = conv.weight.addr();
            p.conv_state = conv.state.addr();
            p.conv_slots = conv.slots.addr();
            p.conv_has_state = conv.has_state.addr();
            p.conv_channels = to_i32(op, "conv channels", channels)?;
            p.epilogue = 6;
        }
    }
    let launch = gemv_launch(kernels, p.n as usize, k, m, norm, options);
    let cfg = LaunchConfig {
        grid_dim: (to_i32(op, "blocks", launch.shape.blocks)? as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: launch.smem as u32,
    };
    launch_params_pdl(
        kernels,
        op,
        MODULE,
        launch.entry,
        cfg,
        &p,
        launch.programmatic,
        None,
    )
}

/// The parts' outputs of a [`GemvOutput::Bf16Parts`] (or `Bf16PartsConv`) launch of `m` tokens.
fn set_parts(
    p: &mut GemvParams,
    n: usize,
    m: usize,
    parts: &[GemvPart<'_>],
) -> Result<(), OpsError> {
    let op = "gemv";
    let widths: Vec<usize> = parts.iter().map(|part| part.width).collect();
    check_parts(n, &widths).map_err(|message| OpsError::Shape { op, message })?;
    let mut start = 0;
    for (i, part) in parts.iter().enumerate() {
        check_view(op, &format!("part {i}"), part.out.len(), &[m, part.width])?;
        if i == 0 {
            p.out = part.out.addr();
            p.ld_out = to_i32(op, "part 0 width", part.width)?;
        } else {
            p.parts[i - 1] = part.out.addr();
            p.part_start[i - 1] = to_i32(op, "part start", start)?;
            p.part_ld[i - 1] = to_i32(op, "part width", part.width)?;
        }
        start += part.width;
    }
    Ok(())
}

/// The residual epilogue's fields: h (its rows checked by the caller) and the sums of squares.
fn set_residual(
    p: &mut GemvParams,
    h: &DevMut<'_, bf16>,
    ld_h: usize,
    ssq_out: &DevMut<'_, f32>,
    n: usize,
) -> Result<(), OpsError> {
    let op = "gemv";
    check_view(
        op,
        "ssq_out",
        ssq_out.len(),
        &[residual_groups(n), MAX_TOKENS],
    )?;
    p.residual = h.addr();
    p.ld_res = to_i32(op, "ld_h", ld_h)?;
    p.ssq_out = ssq_out.addr();
    Ok(())
}

/// How [`gemv_with`] launches `n` rows (virtual rows for SiLU-and-mul) of `k` for `m` tokens on
/// these kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvLaunch {
    pub shape: GemvShape,
    pub entry: &'static str,
    /// Dynamic shared memory: x (norm input), then the stage (staged entries).
    pub smem: usize,
    /// A staged entry (see [`GemvOptions::overlap_previous`]).
    pub staged: bool,
    /// Launched with programmatic dependent launch: staged, or every launch under `AOT_KERNELS_PDL=all`.
    pub programmatic: bool,
}

/// The launch [`gemv_with`] makes: staged only where the options ask, the layout is narrow, the
/// image and mode allow it ([`LoadedKernels::overlap_launch`]) and two staged blocks still fit an
/// SM (the layout assumes two); else the plain entry, which computes the same bits.
pub fn gemv_launch(
    kernels: &LoadedKernels,
    n: usize,
    k: usize,
    m: usize,
    norm: bool,
    options: GemvOptions,
) -> GemvLaunch {
    let shape = gemv_shape(n, kernels.sm_count());
    let (entry, smem) = gemv_entry(norm, m, k, shape, true);
    let staged = options.overlap_previous
        && shape.narrow
        && kernels.overlap_launch(MODULE)
        && kernels.blocks_fit_smem(MODULE, entry, smem, BLOCKS_PER_SM);
    let (entry, smem) = if staged {
        (entry, smem)
    } else {
        gemv_entry(norm, m, k, shape, false)
    };
    GemvLaunch {
        shape,
        entry,
        smem,
        staged,
        programmatic: staged || kernels.programmatic_launch(MODULE),
    }
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
    let scales: Vec<f64> = ssq
        .iter()
        .map(|&s| 1.0 / (f64::from(s) / k as f64 + f64::from(eps)).sqrt())
        .collect();
    norm_input_with_scales(h, k, &scales, weight, offset)
}

/// The norm prologue with each row's scale given: `bf16((w + offset) * bf16(h * scale))`.
pub fn norm_input_with_scales(
    h: &[bf16],
    k: usize,
    scales: &[f64],
    weight: &[bf16],
    offset: f32,
) -> Vec<bf16> {
    let mut out = Vec::with_capacity(h.len());
    for (row, &scale) in h.chunks_exact(k).zip(scales) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_norm_launches_take_the_all_rows_prologue_from_four_rows() {
        assert!(!norm_all_rows(1));
        assert!(!norm_all_rows(NORM_ALL_ROWS_MIN - 1));
        assert!(norm_all_rows(NORM_ALL_ROWS_MIN));
        assert!(norm_all_rows(MAX_TOKENS));
    }

    #[test]
    fn shapes_fill_the_gpu() {
        // Qwen3-4B projections on an H200 (132 SMs): gate_up and lm_head are wide, the rest narrow.
        for (n, narrow) in [
            (6144, true),
            (2560, true),
            (19456, false),
            (151_936, false),
            (40, true),
        ] {
            let s = gemv_shape(n, 132);
            assert_eq!(s.narrow, narrow, "{n}");
            let tiles = n.div_ceil(TILE_ROWS);
            if narrow {
                // A block per tile, at most two an SM; the blocks loop over the rest.
                assert_eq!(s.blocks, tiles.min(2 * 132), "{n}");
            } else {
                // Two blocks an SM (fewer only if there are fewer tiles), and every tile covered.
                assert_eq!(s.blocks, (2 * 132).min(tiles), "{n}");
                let per_warp = tiles.div_ceil(s.blocks * 8);
                assert!(s.blocks * 8 * per_warp >= tiles, "{n}: {s:?}");
                // The kernel deals tile t to block t % blocks: with two blocks an SM (block b on SM
                // b % 132), no SM gets more than one tile over the even share.
                let mut per_sm = [0usize; 132];
                for t in 0..tiles {
                    per_sm[(t % s.blocks) % 132] += 1;
                }
                let most = per_sm.iter().max().unwrap();
                assert!(
                    *most <= tiles.div_ceil(132) + 1,
                    "{n}: {most} tiles on one SM"
                );
            }
        }
        assert_eq!(silu_virtual_rows(9728), 19456);
        assert_eq!(silu_virtual_rows(184), 368);
        assert_eq!(silu_virtual_rows(20), 48);
    }

    #[test]
    fn only_narrow_launches_that_overlap_take_the_staged_entries() {
        let narrow = gemv_shape(2560, 132);
        let wide = gemv_shape(19456, 132);
        assert!(narrow.narrow && !wide.narrow);
        // qkv (norm) and o_proj (plain) at one and eight rows; x first, then the stage.
        for m in [1, 8] {
            let x = m * (2560 + X_PAD) * 2;
            assert_eq!(
                gemv_entry(true, m, 2560, narrow, false),
                (ENTRY_NARROW_NORM, x)
            );
            assert_eq!(
                gemv_entry(true, m, 2560, narrow, true),
                (ENTRY_NARROW_NORM_STAGED, x + 8 * 6 * 2 * 32 * 16)
            );
            assert_eq!(
                gemv_entry(false, m, 4096, narrow, false),
                (ENTRY_NARROW_PLAIN, 0)
            );
            assert_eq!(
                gemv_entry(false, m, 4096, narrow, true),
                (ENTRY_NARROW_STAGED, 8 * 8 * 2 * 32 * 16)
            );
            // A wide launch never stages, asked or not.
            let rows = if norm_all_rows(m) {
                ENTRY_NORM_ROWS
            } else {
                ENTRY_NORM
            };
            assert_eq!(gemv_entry(true, m, 2560, wide, true), (rows, x));
            assert_eq!(gemv_entry(false, m, 2560, wide, true), (ENTRY_PLAIN, 0));
        }
        // With the kernel's 8,224 bytes of static shared memory: two staged norm blocks fit an
        // H200 SM at eight rows of Qwen3-4B (k 2560), not of a k of 4096 (the launch then takes
        // the plain entry); on a 100 KiB SM (sm_120) not even the plain o_proj's stage.
        let h200 = crate::dispatch::SmemLimits {
            per_sm: 233_472,
            per_block: 232_448,
            reserved_per_block: 1024,
        };
        let sm120 = crate::dispatch::SmemLimits {
            per_sm: 102_400,
            per_block: 101_376,
            reserved_per_block: 1024,
        };
        let (_, smem) = gemv_entry(true, MAX_TOKENS, 2560, narrow, true);
        assert!(h200.fits(8224, smem, BLOCKS_PER_SM), "{smem}");
        let (_, smem) = gemv_entry(true, MAX_TOKENS, 4096, narrow, true);
        assert!(!h200.fits(8224, smem, BLOCKS_PER_SM), "{smem}");
        let (_, smem) = gemv_entry(false, MAX_TOKENS, 4096, narrow, true);
        assert!(h200.fits(8224, smem, BLOCKS_PER_SM) && !sm120.fits(8224, smem, BLOCKS_PER_SM));
    }

    #[test]
    fn stage_sizes_mirror_the_kernel() {
        // The host sizes the stage from these; the kernel fills kStagePlain / kStageNorm chunks.
        let src = include_str!("../../kernels/gemv/gemv.cu");
        for (name, chunks) in [
            ("kStagePlain", STAGE_CHUNKS_PLAIN),
            ("kStageNorm", STAGE_CHUNKS_NORM),
        ] {
            let decl = format!("constexpr int {name} = {chunks};");
            assert!(src.contains(&decl), "gemv.cu lacks `{decl}`");
        }
        assert!(
            src.contains("constexpr int kWarps = kThreads / 32;")
                && src.contains("constexpr int kThreads = 256;")
        );
        assert_eq!(WARPS, 8);
    }

    #[test]
    fn parts_must_cover_w_on_tile_boundaries() {
        // A Qwen3.6-35B-A3B DeltaNet layer: qkv 8192, z 4096, b 32, a 32.
        assert_eq!(check_parts(12352, &[8192, 4096, 32, 32]), Ok(()));
        assert_eq!(check_parts(40, &[40]), Ok(()));
        assert_eq!(check_parts(33, &[16, 17]), Ok(()));
        let err = |n, w: &[usize]| check_parts(n, w).unwrap_err();
        assert!(err(0, &[]).contains("1 to 4"));
        assert!(err(80, &[16; 5]).contains("1 to 4"));
        assert!(err(48, &[16, 0, 32]).contains("part 1 is empty"));
        assert!(err(40, &[24, 16]).contains("part 0 is 24 rows wide"));
        assert!(err(64, &[16, 32]).contains("add up to 48, not the n 64"));
        // The Rust mirror of the kernel's part count.
        let src = include_str!("../../kernels/gemv/gemv.cu");
        assert!(src.contains(&format!("constexpr int kMoreParts = {MORE_PARTS};")));
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
