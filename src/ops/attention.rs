//! Decode attention over the paged KV cache (module `attention`): one query token per sequence,
//! GQA, split-KV with an in-kernel merge, and the step before it fused in: the new token's raw
//! `[q | k | v]` projection goes in, its q/k heads are normed (q_norm, k_norm) and rotated (NeoX
//! RoPE) in the kernel, and its key and value are written into the paged cache. See
//! `kernels/attention/decode.cu`.

use cudarc::driver::{DeviceRepr, LaunchConfig};
use half::bf16;

use super::launch::{
    check_aligned, check_view, launch_params_pdl, to_i32, DevMut, DevRef, OpsError,
};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "attention";
/// Every entry of the module, in the order [`decode_entry`] indexes: per head dimension, the one
/// for any group, then those for groups 2, 4 and 8; at 64 and 128 these four pipelined, then the
/// same four not (`_np`); at 256 only the four (never pipelined).
pub const ENTRIES: [&str; 20] = [
    "attn_decode_d64",
    "attn_decode_d64_g2",
    "attn_decode_d64_g4",
    "attn_decode_d64_g8",
    "attn_decode_d64_np",
    "attn_decode_d64_g2_np",
    "attn_decode_d64_g4_np",
    "attn_decode_d64_g8_np",
    "attn_decode_d128",
    "attn_decode_d128_g2",
    "attn_decode_d128_g4",
    "attn_decode_d128_g8",
    "attn_decode_d128_np",
    "attn_decode_d128_g2_np",
    "attn_decode_d128_g4_np",
    "attn_decode_d128_g8_np",
    "attn_decode_d256",
    "attn_decode_d256_g2",
    "attn_decode_d256_g4",
    "attn_decode_d256_g8",
];

/// The cluster entries ([`decode_entry_cluster`]), per head dimension 64, 128, 256: the one for any
/// group, then groups 2, 4 and 8; pipelined at 64 and 128 (256 is never pipelined).
pub const CLUSTER_ENTRIES: [&str; 12] = [
    "attn_decode_d64_cl",
    "attn_decode_d64_g2_cl",
    "attn_decode_d64_g4_cl",
    "attn_decode_d64_g8_cl",
    "attn_decode_d128_cl",
    "attn_decode_d128_g2_cl",
    "attn_decode_d128_g4_cl",
    "attn_decode_d128_g8_cl",
    "attn_decode_d256_cl",
    "attn_decode_d256_g2_cl",
    "attn_decode_d256_g4_cl",
    "attn_decode_d256_g8_cl",
];
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]): every
/// entry of [`ENTRIES`] and [`CLUSTER_ENTRIES`].
pub const LAUNCHED: &[(&str, &str)] = &LAUNCHED_ALL;
const LAUNCHED_ALL: [(&str, &str); ENTRIES.len() + CLUSTER_ENTRIES.len()] = {
    let mut all = [(MODULE, ""); ENTRIES.len() + CLUSTER_ENTRIES.len()];
    let mut i = 0;
    while i < ENTRIES.len() {
        all[i].1 = ENTRIES[i];
        i += 1;
    }
    while i < all.len() {
        all[i].1 = CLUSTER_ENTRIES[i - ENTRIES.len()];
        i += 1;
    }
    all
};
/// Splits of one sequence a cluster launch holds: its grid depth and cluster depth (the portable
/// cluster size). Sequences of more splits need the workspace merge.
pub const CLUSTER_SPLITS: usize = 8;

/// Tokens per KV-cache block.
pub const BLOCK_TOKENS: usize = 16;
/// Most context splits of one sequence (the kernel's merge workspace holds this many).
pub const MAX_SPLITS: usize = 32;
/// Most query heads per KV head.
pub const MAX_GROUP: usize = 8;
const TOKENS_PER_SPLIT_MIN: usize = 128;
const THREADS: u32 = 128;
const WARPS: usize = 4;

/// Mirror of `AttnDecodeParams` in kernels/attention/decode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnDecodeParams {
    qkv: u64,
    q_norm: u64,
    k_norm: u64,
    cos_sin: u64,
    k_cache: u64,
    v_cache: u64,
    block_table: u64,
    slot_of_row: u64,
    positions: u64,
    out: u64,
    ws_ml: u64,
    ws_o: u64,
    counters: u64,
    m: i32,
    q_heads: i32,
    kv_heads: i32,
    ld_bt: i32,
    ld_qkv: i32,
    max_pos: i32,
    scale: f32,
    eps: f32,
    norm_offset: f32,
    /// 1: the block table and the warps' first cache blocks are read before the kernel's wait,
    /// the query after (a programmatic launch with [`AttnDecode::overlap_previous`]).
    cache_before_wait: i32,
}

// SAFETY: plain `repr(C)` data, laid out as the kernel's struct.
unsafe impl DeviceRepr for AttnDecodeParams {}

/// The entry for head dimension `head_dim` and `group` query heads per KV head: the one built for
/// that group (2, 4 or 8) when there is one, else the one for any group; pipelined or not (see
/// [`attn_pipelined`]; head dimension 256 is never pipelined and ignores the flag); `None` for a
/// head dimension the module is not built for (64, 128, 256) or a group outside 1..=MAX_GROUP.
pub fn decode_entry(head_dim: usize, group: usize, pipelined: bool) -> Option<&'static str> {
    // ENTRIES holds, per head dimension, [any group, g2, g4, g8], at 64 and 128 twice.
    let base = match (head_dim, pipelined) {
        (64, true) => 0,
        (64, false) => 4,
        (128, true) => 8,
        (128, false) => 12,
        (256, _) => 16,
        _ => return None,
    };
    Some(ENTRIES[base + group_slot(group)?])
}

/// Where `group` sits among an entry set's four (any group, then 2, 4, 8); `None` outside
/// 1..=MAX_GROUP.
fn group_slot(group: usize) -> Option<usize> {
    match group {
        2 => Some(1),
        4 => Some(2),
        8 => Some(3),
        g if (1..=MAX_GROUP).contains(&g) => Some(0),
        _ => None,
    }
}

/// The cluster entry for `head_dim`, `group` and the pipelined flag, where one is built: at 64 and
/// 128 only the pipelined kinds (the ones small launches take, see [`attn_cluster`]), at 256 its
/// one kind.
pub fn decode_entry_cluster(
    head_dim: usize,
    group: usize,
    pipelined: bool,
) -> Option<&'static str> {
    let base = match (head_dim, pipelined) {
        (64, true) => 0,
        (128, true) => 4,
        (256, _) => 8,
        _ => return None,
    };
    Some(CLUSTER_ENTRIES[base + group_slot(group)?])
}

/// Dynamic shared memory of a decode attention block at head dimension `d` (the query heads, the
/// probabilities and the merge's partials).
fn decode_smem_bytes(d: usize) -> usize {
    4 * (MAX_GROUP * (d + 8) + WARPS * BLOCK_TOKENS * MAX_GROUP + WARPS * MAX_GROUP * d)
}

/// Whether the cluster entry for `head_dim`, `group` and `pipelined` exists and its clusters of
/// [`CLUSTER_SPLITS`] blocks fit this GPU ([`LoadedKernels::cluster_fits`]: sm_90+ code on a
/// capability 9.0+ GPU, and the driver places such a cluster). A caller that wants the cluster
/// merge asks this and [`attn_cluster`].
pub fn cluster_fits(
    kernels: &LoadedKernels,
    head_dim: usize,
    group: usize,
    pipelined: bool,
) -> bool {
    decode_entry_cluster(head_dim, group, pipelined)
        .is_some_and(|entry| entry_cluster_fits(kernels, entry, head_dim))
}

/// Whether clusters of [`CLUSTER_SPLITS`] blocks of the cluster entry `entry` (head dimension `d`)
/// fit this GPU.
fn entry_cluster_fits(kernels: &LoadedKernels, entry: &str, d: usize) -> bool {
    kernels.cluster_fits(
        MODULE,
        entry,
        THREADS,
        decode_smem_bytes(d),
        CLUSTER_SPLITS as u32,
    )
}

/// Whether a pass should merge its splits in thread-block clusters (the `_cl` entries, through
/// distributed shared memory) rather than through the workspace: the longest sequence has 2 to
/// [`CLUSTER_SPLITS`] splits, and the launch's blocks (`kv_heads` x `rows` x [`CLUSTER_SPLITS`])
/// take at most half the SMs: larger launches lose, because clusters of eight are placed within a
/// GPC and a short sequence's idle blocks hold their places until the merge. The caller also needs
/// [`cluster_fits`]. Both merges give the same bits.
pub fn attn_cluster(kv_heads: usize, rows: usize, max_splits: usize, sm_count: usize) -> bool {
    (2..=CLUSTER_SPLITS).contains(&max_splits) && 2 * kv_heads * rows * CLUSTER_SPLITS <= sm_count
}

/// Whether a launch should take the pipelined entries: each warp streams its next cache block
/// while it scores the current one, holding two blocks in registers, so an SM runs two thread
/// blocks instead of four. That pays while the launch's busy blocks (`kv_heads` x the splits of
/// all its rows, `busy_splits`) fit in one wave of two an SM; past that, occupancy hides the
/// latency better. The threshold was measured at head dimension 128; head dimension 256 has one
/// kind (never pipelined), so the answer there is always `false`. Both kinds give the same bits.
pub fn attn_pipelined(
    head_dim: usize,
    kv_heads: usize,
    busy_splits: usize,
    sm_count: usize,
) -> bool {
    head_dim <= 128 && kv_heads * busy_splits <= 2 * sm_count.max(1)
}

/// How a context of `ctx` tokens is split: `(count, tokens per split)`, a function of the
/// sequence's own length only (the kernel computes the same).
pub fn attn_splits(ctx: usize) -> (usize, usize) {
    let want = (ctx / TOKENS_PER_SPLIT_MIN).clamp(1, MAX_SPLITS);
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

/// Shapes, inputs and cache views of one decode-attention launch.
pub struct AttnDecode<'a> {
    /// `[m][ld_qkv]`: each row's new token, `[q heads | k heads | v heads]` as projected.
    pub qkv: DevRef<'a, bf16>,
    pub ld_qkv: usize,
    pub q_norm: DevRef<'a, bf16>,
    pub k_norm: DevRef<'a, bf16>,
    pub eps: f32,
    /// 0 for `w`, 1 for the zero-centred `(1 + w)` norms.
    pub weight_offset: f32,
    /// `[max_pos][head_dim]` fp32: cos half, sin half (`rotary::cos_sin_cache`).
    pub cos_sin: DevRef<'a, f32>,
    pub max_pos: usize,
    /// The paged cache of this layer; the new token's key and value are written into it.
    pub k_cache: DevMut<'a, bf16>,
    pub v_cache: DevMut<'a, bf16>,
    pub block_table: DevRef<'a, i32>,
    pub ld_bt: usize,
    /// `[m]`: each row's block-table row. Like `positions`, read before the kernel waits for the
    /// one before it under programmatic dependent launch (with or without
    /// [`AttnDecode::overlap_previous`]): both must come from the host or from a kernel followed
    /// by at least one launch that is not programmatic.
    pub slot_of_row: DevRef<'a, i32>,
    /// `[m]`: the new token's position; the row attends to positions `0..=pos`.
    pub positions: DevRef<'a, i32>,
    pub out: DevMut<'a, bf16>,
    pub m: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Grid depth: at least `attn_splits(pos + 1).0` for every row (the kernel traps otherwise);
    /// [`CLUSTER_SPLITS`] with `cluster`.
    pub grid_splits: usize,
    /// Take the pipelined entry ([`attn_pipelined`] says when it pays; the bits are the same).
    pub pipelined: bool,
    /// Merge each sequence's splits in a thread-block cluster ([`attn_cluster`] says when it
    /// pays; the bits are the same): needs [`cluster_fits`], `grid_splits == CLUSTER_SPLITS` and
    /// at most that many splits in every row.
    pub cluster: bool,
    /// Let the launch overlap the end of the kernel before it (programmatic dependent launch,
    /// where [`LoadedKernels::overlap_launch`] allows it: an sm_90+ image on Hopper or later with a
    /// 12.3+ driver, and `AOT_KERNELS_PDL` not `off`). Before its wait each block then reads
    /// `block_table` and, at head dimensions 64 and 128, its warps' first cache blocks (the cache
    /// at positions before the new one), besides `positions` and `slot_of_row`; `qkv` is read
    /// after it. Without this option a launch may still be programmatic (every one under
    /// `AOT_KERNELS_PDL=all`), but then only `positions` and `slot_of_row` are read before the
    /// wait. Same bits either way.
    ///
    /// Contract: no kernel enqueued earlier on the stream that may still be running writes
    /// `block_table` or this layer's cache at the rows' earlier positions. With programmatic
    /// launch that includes kernels two or more launches back (each GEMV and attention launch lets
    /// the next start early): copy those inputs from the host, or write them with a kernel
    /// followed by at least one launch that is not programmatic.
    ///
    /// Worth it because the first cache blocks stream while qkv ends; requested only after the
    /// wait, they gained little.
    pub overlap_previous: bool,
}

/// Runs the fused step. Positions and block ids live on the device: a position past the RoPE
/// table or the block table, or a negative block id, makes the kernel trap.
pub fn attention_decode(
    kernels: &LoadedKernels,
    a: AttnDecode<'_>,
    scratch: &mut AttnScratch<'_>,
) -> Result<(), OpsError> {
    let op = "attention_decode";
    let shape_err = |message: String| OpsError::Shape { op, message };
    let d = a.head_dim;
    if ![64, 128, 256].contains(&d) {
        return Err(shape_err(format!(
            "head_dim {d}: the kernel is built for 64, 128 and 256"
        )));
    }
    if a.m == 0
        || a.kv_heads == 0
        || a.q_heads == 0
        || !a.q_heads.is_multiple_of(a.kv_heads)
        || a.q_heads / a.kv_heads > MAX_GROUP
    {
        return Err(shape_err(format!(
            "{} rows, {} query heads over {} KV heads: need rows > 0 and 1..={MAX_GROUP} query heads per KV head",
            a.m, a.q_heads, a.kv_heads
        )));
    }
    let group = a.q_heads / a.kv_heads;
    let entry = if a.cluster {
        if !kernels.cluster_launch(MODULE) {
            return Err(shape_err(format!(
                "a cluster launch needs sm_90+ code of module `{MODULE}` on a GPU of capability 9.0 \
                 or later (here {}, image {}); launch with `cluster: false`",
                kernels.device().capability,
                kernels
                    .loaded_target(MODULE)
                    .map_or_else(|| "not loaded".to_string(), |t| t.to_string())
            )));
        }
        if a.grid_splits != CLUSTER_SPLITS {
            return Err(shape_err(format!(
                "grid_splits {} must be {CLUSTER_SPLITS} in a cluster launch",
                a.grid_splits
            )));
        }
        let entry = decode_entry_cluster(d, group, a.pipelined).ok_or_else(|| {
            shape_err(format!(
                "no cluster entry for head_dim {d}, group {group}, pipelined {} (64 and 128 have \
                 pipelined ones only); launch with `cluster: false`",
                a.pipelined
            ))
        })?;
        if !entry_cluster_fits(kernels, entry, d) {
            return Err(shape_err(format!(
                "a cluster of {CLUSTER_SPLITS} `{entry}` blocks does not fit this GPU (the driver \
                 places none); launch with `cluster: false`"
            )));
        }
        entry
    } else {
        decode_entry(d, group, a.pipelined).ok_or_else(|| {
            shape_err(format!(
                "no decode attention entry for head_dim {d}, group {group}"
            ))
        })?
    };
    if a.grid_splits == 0 || a.grid_splits > MAX_SPLITS {
        return Err(shape_err(format!(
            "grid_splits {} must be in 1..={MAX_SPLITS}",
            a.grid_splits
        )));
    }
    let qkv_width = (a.q_heads + 2 * a.kv_heads) * d;
    if a.ld_qkv < qkv_width {
        return Err(shape_err(format!(
            "ld_qkv {} is below the [q | k | v] width {qkv_width}",
            a.ld_qkv
        )));
    }
    check_view(op, "qkv", a.qkv.len(), &[(a.m - 1) * a.ld_qkv + qkv_width])?;
    check_view(op, "q_norm", a.q_norm.len(), &[d])?;
    check_view(op, "k_norm", a.k_norm.len(), &[d])?;
    check_view(op, "cos_sin", a.cos_sin.len(), &[a.max_pos, d])?;
    check_view(op, "out", a.out.len(), &[a.m, a.q_heads, d])?;
    check_view(op, "slot_of_row", a.slot_of_row.len(), &[a.m])?;
    check_view(op, "positions", a.positions.len(), &[a.m])?;
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
    // The caches are read 16 bytes at a time.
    check_aligned(op, "k_cache", a.k_cache.addr(), 16)?;
    check_aligned(op, "v_cache", a.v_cache.addr(), 16)?;
    let (ml, o, counters) = attn_scratch_needs(a.m, a.q_heads, a.kv_heads, d);
    check_view(op, "ws_ml", scratch.ws_ml.len(), &[ml])?;
    // The merging block reads each (max, sum) pair as one 8-byte load.
    check_aligned(op, "ws_ml", scratch.ws_ml.addr(), 8)?;
    check_view(op, "ws_o", scratch.ws_o.len(), &[o])?;
    check_view(op, "counters", scratch.counters.len(), &[counters])?;
    // The block table and the first cache blocks are read before the wait where the caller allows
    // it; the launch is programmatic then, or under `AOT_KERNELS_PDL=all`.
    let cache_before_wait = a.overlap_previous && kernels.overlap_launch(MODULE);
    let programmatic = cache_before_wait || kernels.programmatic_launch(MODULE);
    let p = AttnDecodeParams {
        qkv: a.qkv.addr(),
        q_norm: a.q_norm.addr(),
        k_norm: a.k_norm.addr(),
        cos_sin: a.cos_sin.addr(),
        k_cache: a.k_cache.addr(),
        v_cache: a.v_cache.addr(),
        block_table: a.block_table.addr(),
        slot_of_row: a.slot_of_row.addr(),
        positions: a.positions.addr(),
        out: a.out.addr(),
        ws_ml: scratch.ws_ml.addr(),
        ws_o: scratch.ws_o.addr(),
        counters: scratch.counters.addr(),
        m: to_i32(op, "m", a.m)?,
        q_heads: a.q_heads as i32,
        kv_heads: a.kv_heads as i32,
        ld_bt: to_i32(op, "ld_bt", a.ld_bt)?,
        ld_qkv: to_i32(op, "ld_qkv", a.ld_qkv)?,
        max_pos: to_i32(op, "max_pos", a.max_pos)?,
        scale: 1.0 / (d as f32).sqrt(),
        eps: a.eps,
        norm_offset: a.weight_offset,
        cache_before_wait: i32::from(cache_before_wait),
    };
    let cfg = LaunchConfig {
        grid_dim: (
            a.kv_heads as u32,
            to_i32(op, "m", a.m)? as u32,
            a.grid_splits as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: decode_smem_bytes(d) as u32,
    };
    launch_params_pdl(
        kernels,
        op,
        MODULE,
        entry,
        cfg,
        &p,
        programmatic,
        a.cluster.then_some((1, 1, CLUSTER_SPLITS as u32)),
    )
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

/// Shapes of the q/k prologue reference.
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
        assert_eq!(attn_splits(128), (1, 128));
        assert_eq!(attn_splits(129), (1, 144));
        assert_eq!(attn_splits(256), (2, 128));
        // Eight rows of 1089 tokens and 8 KV heads: 512 blocks, one wave of four an SM on 132 SMs.
        assert_eq!(attn_splits(1089), (8, 144));
        assert_eq!(attn_splits(1024), (8, 128));
        assert_eq!(attn_splits(40_960).0, 32);
    }

    #[test]
    fn every_head_dimension_and_group_has_an_entry_and_fixed_groups_get_theirs() {
        let mut used = std::collections::BTreeSet::new();
        for (d, name) in [(64, "d64"), (128, "d128"), (256, "d256")] {
            for pipelined in [true, false] {
                // Head dimension 256 is never pipelined: both flags name the same entries.
                let suffix = if pipelined || d == 256 { "" } else { "_np" };
                for group in 1..=MAX_GROUP {
                    let entry = decode_entry(d, group, pipelined).unwrap();
                    let want = match group {
                        2 | 4 | 8 => format!("attn_decode_{name}_g{group}{suffix}"),
                        _ => format!("attn_decode_{name}{suffix}"),
                    };
                    assert_eq!(entry, want);
                    assert!(ENTRIES.contains(&entry));
                    used.insert(entry);
                }
                assert_eq!(decode_entry(d, 0, pipelined), None);
                assert_eq!(decode_entry(d, MAX_GROUP + 1, pipelined), None);
            }
        }
        assert_eq!(decode_entry(96, 4, true), None);
        assert_eq!(used.len(), ENTRIES.len(), "an entry no shape reaches");
    }

    #[test]
    fn cluster_entries_for_the_small_launch_kinds_only() {
        let mut used = std::collections::BTreeSet::new();
        for (d, name) in [(64, "d64"), (128, "d128"), (256, "d256")] {
            for group in 1..=MAX_GROUP {
                let entry = decode_entry_cluster(d, group, true).unwrap();
                let want = match group {
                    2 | 4 | 8 => format!("attn_decode_{name}_g{group}_cl"),
                    _ => format!("attn_decode_{name}_cl"),
                };
                assert_eq!(entry, want);
                used.insert(entry);
                // Unpipelined: only 256 (one kind) has a cluster entry.
                assert_eq!(decode_entry_cluster(d, group, false).is_some(), d == 256);
            }
            assert_eq!(decode_entry_cluster(d, 0, true), None);
            assert_eq!(decode_entry_cluster(d, MAX_GROUP + 1, true), None);
        }
        assert_eq!(decode_entry_cluster(96, 4, true), None);
        assert_eq!(
            used.len(),
            CLUSTER_ENTRIES.len(),
            "an entry no shape reaches"
        );
    }

    #[test]
    fn clusters_for_small_launches_of_two_to_eight_splits() {
        // H200 (132 SMs), Qwen3-4B (8 KV heads): one row of 1088 tokens (8 splits) merges in
        // clusters (64 blocks), eight rows (512) or two (128 > 66) do not; nor does one split
        // (nothing to merge) or nine (more than a cluster holds).
        assert!(attn_cluster(8, 1, attn_splits(1089).0, 132));
        assert!(attn_cluster(8, 1, attn_splits(300).0, 132));
        assert!(!attn_cluster(8, 1, attn_splits(100).0, 132));
        assert!(!attn_cluster(8, 1, attn_splits(1152).0, 132));
        assert!(!attn_cluster(8, 2, 8, 132));
        assert!(!attn_cluster(8, 8, 8, 132));
        // Qwen3.5-35B-A3B's gated attention (2 KV heads): up to four rows on the H200.
        assert!(attn_cluster(2, 4, 8, 132));
        assert!(!attn_cluster(2, 5, 8, 132));
        // A 20-SM GPU never.
        assert!(!attn_cluster(2, 1, 8, 20));
    }

    #[test]
    fn pipelined_while_the_busy_blocks_fit_one_wave_of_two_an_sm() {
        // H200 (132 SMs), Qwen3-4B (8 KV heads).
        let busy = |rows: usize, ctx: usize| rows * attn_splits(ctx).0;
        assert!(attn_pipelined(128, 8, busy(8, 81), 132), "64 blocks");
        assert!(attn_pipelined(128, 8, busy(1, 1089), 132), "64 blocks");
        assert!(!attn_pipelined(128, 8, busy(8, 1089), 132), "576 blocks");
        assert!(attn_pipelined(128, 8, 33, 132), "264 blocks: one wave");
        assert!(!attn_pipelined(128, 8, 34, 132), "272 blocks");
        assert!(
            attn_pipelined(64, 1, 2, 0),
            "an SM count of 0 counts as one"
        );
        assert!(!attn_pipelined(64, 1, 3, 0));
        assert!(
            !attn_pipelined(256, 8, 1, 132),
            "head dimension 256 has one kind"
        );
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
