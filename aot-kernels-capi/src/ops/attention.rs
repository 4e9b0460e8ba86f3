//! Decode attention over the paged KV cache (`aot_kernels::ops::attention`), with the new token's
//! q/k RMSNorm, NeoX RoPE and cache write fused in, and the size of its merge workspace.
//!
//! Launched in the one form that fits every shape and GPU: a grid as deep as the most splits a
//! sequence may take ([`MAX_SPLITS`], so no position is too long for it), the splits merged
//! through the workspace (no clusters), the unpipelined entries, and no request to overlap the
//! kernel before it. Every form gives the same bits (the backend's GPU tests check it).

use std::ffi::c_void;

use aot_kernels::ops::attention::{
    attention_decode, attn_scratch_needs, AttnDecode, AttnScratch, BLOCK_TOKENS, MAX_GROUP,
    MAX_SPLITS,
};
use aot_kernels::ops::{dev, dev_mut};
use half::bf16;

use super::{finite, norm_eps, ALIGN_BF16, ALIGN_F32, ALIGN_U64, ALIGN_VEC};
use crate::args::{
    device_buffer, need, positive, strided_need, written_apart, AotDevicePtr, DeviceArg, Need,
};
use crate::backend::{backend_ref, span, AotBackend};
use crate::borrow::Borrowed;
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

/// Head dimensions the kernel is built for.
const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Rows of one launch: one grid row each.
const MAX_ROWS: usize = 65535;

/// How a call names the row count and the heads: the size query by its parameters, the launch by
/// the fields of its struct.
type HeadNames = [&'static str; 4];
const SIZE_NAMES: HeadNames = ["rows", "q_heads", "kv_heads", "head_dim"];
const ARGS_NAMES: HeadNames = [
    "args->m",
    "args->q_heads",
    "args->kv_heads",
    "args->head_dim",
];

/// The rows and heads of a launch, checked as the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Heads {
    rows: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Heads {
    fn check(
        [rows_name, q_name, kv_name, d_name]: HeadNames,
        rows: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<Heads, CapiError> {
        if !(1..=MAX_ROWS).contains(&rows) {
            return Err(CapiError::invalid(format!(
                "`{rows_name}` {rows} must be 1..={MAX_ROWS} (one grid row each)"
            )));
        }
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(CapiError::invalid(format!(
                "`{d_name}` {head_dim}: the kernel is built for 64, 128 and 256"
            )));
        }
        positive(kv_name, kv_heads)?;
        let group = q_heads / kv_heads;
        if !q_heads.is_multiple_of(kv_heads) || !(1..=MAX_GROUP).contains(&group) {
            return Err(CapiError::invalid(format!(
                "`{q_name}` {q_heads} over `{kv_name}` {kv_heads}: each KV head serves 1..={MAX_GROUP} query heads, so q_heads must be kv_heads times 1 to {MAX_GROUP}"
            )));
        }
        // The kernel indexes rows and heads with int; bounding the output bounds every index and
        // every workspace size below.
        let out = rows
            .checked_mul(q_heads)
            .and_then(|n| n.checked_mul(head_dim));
        if out.is_none_or(|n| n > i32::MAX as usize) {
            return Err(CapiError::invalid(format!(
                "`{rows_name}` {rows} x `{q_name}` {q_heads} x `{d_name}` {head_dim} must be below 2^31 (the kernel's int indices)"
            )));
        }
        Ok(Heads {
            rows,
            q_heads,
            kv_heads,
            head_dim,
        })
    }

    /// The merge's arrays: (`ws_ml` floats, `ws_o` floats, counters).
    fn scratch(&self) -> (usize, usize, usize) {
        attn_scratch_needs(self.rows, self.q_heads, self.kv_heads, self.head_dim)
    }

    /// Bytes of the workspace: the three arrays, 4 bytes an element.
    fn workspace_bytes(&self) -> usize {
        let (ml, o, counters) = self.scratch();
        4 * (ml + o + counters)
    }
}

/// Where the merge's arrays lie in a workspace of `bytes` bytes (at least
/// [`Heads::workspace_bytes`]), as (byte offset, elements): `ws_ml` at the start (the workspace is
/// 8-byte aligned, and the merge reads each (max, sum) pair as one 8-byte load), `ws_o` after it,
/// the counters in the last whole `u32`s. A launch's partials then never reach the counters of
/// another launch of the same heads on the same workspace declared at the same size, whatever the
/// rows of each (each fits it): the counters, which the merge leaves zero, stay zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    ws_ml: (usize, usize),
    ws_o: (usize, usize),
    counters: (usize, usize),
}

impl Layout {
    /// The three arrays in the checked workspace (at least the size the layout was made for).
    fn cut(&self, workspace: &DeviceArg<u8>) -> (DeviceArg<f32>, DeviceArg<f32>, DeviceArg<u32>) {
        let inside = "the layout lies inside a workspace of the size it needs";
        (
            workspace.part(self.ws_ml.0, self.ws_ml.1).expect(inside),
            workspace.part(self.ws_o.0, self.ws_o.1).expect(inside),
            workspace
                .part(self.counters.0, self.counters.1)
                .expect(inside),
        )
    }
}

fn layout(heads: &Heads, bytes: usize) -> Layout {
    let (ml, o, counters) = heads.scratch();
    Layout {
        ws_ml: (0, ml),
        ws_o: (4 * ml, o),
        counters: (bytes / 4 * 4 - 4 * counters, counters),
    }
}

/// The arguments of `aot_attention_decode_bf16`: device buffers, each with its declared length in
/// elements (the workspace in bytes), and the shapes. A row is one sequence of the batch with its
/// one new token.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AotAttentionDecode {
    /// `bf16`: `m` rows `ld_qkv` apart, each the new token's projection `[q heads | k heads | v
    /// heads]` (`(q_heads + 2 kv_heads) x head_dim` values) before the norms and RoPE.
    pub qkv: AotDevicePtr,
    pub qkv_len: usize,
    pub ld_qkv: usize,
    /// `bf16[head_dim]`: the RMSNorm weights of every query head.
    pub q_norm: AotDevicePtr,
    pub q_norm_len: usize,
    /// `bf16[head_dim]`: the RMSNorm weights of every key head.
    pub k_norm: AotDevicePtr,
    pub k_norm_len: usize,
    /// `float[max_pos][head_dim]`: per position `p`, `cos(p f_i)` for the `head_dim / 2`
    /// frequencies `f_i` of the NeoX rotation, then `sin(p f_i)`.
    pub cos_sin: AotDevicePtr,
    pub cos_sin_len: usize,
    pub max_pos: usize,
    /// `bf16[blocks][kv_heads][16][head_dim]`, 16-byte aligned (read in 16-byte vectors): this
    /// layer's paged key cache; the new token's key (normed, rotated) is written at its position.
    pub k_cache: AotDevicePtr,
    pub k_cache_len: usize,
    /// As `k_cache`, for the values.
    pub v_cache: AotDevicePtr,
    pub v_cache_len: usize,
    /// `int32`: rows of `ld_bt` cache block ids, one row a sequence slot; entry `p / 16` of a
    /// slot's row is the block of its position `p`.
    pub block_table: AotDevicePtr,
    pub block_table_len: usize,
    pub ld_bt: usize,
    /// `int32[m]`: each row's slot (its block-table row); the rows of one launch have distinct
    /// slots, and none writes a block another row reads.
    pub slot_of_row: AotDevicePtr,
    pub slot_of_row_len: usize,
    /// `int32[m]`: each row's new position `pos`; the row attends to positions `0..=pos`.
    pub positions: AotDevicePtr,
    pub positions_len: usize,
    /// `bf16[m][q_heads][head_dim]`.
    pub out: AotDevicePtr,
    pub out_len: usize,
    /// 8-byte aligned, `workspace_bytes` long: see `aot_attention_decode_workspace_bytes`.
    pub workspace: AotDevicePtr,
    pub workspace_bytes: usize,
    /// Rows: 1..=65535.
    pub m: usize,
    /// A multiple of `kv_heads`, 1 to 8 times it.
    pub q_heads: usize,
    pub kv_heads: usize,
    /// 64, 128 or 256.
    pub head_dim: usize,
    /// The RMSNorms' epsilon: finite, >= 0.
    pub eps: f32,
    /// 0 for norms that scale by `w` (Qwen3), 1 for the zero-centred ones that scale by `1 + w`
    /// (Qwen3.5/3.6).
    pub weight_offset: f32,
}

/// `*bytes` = the size of the workspace that `aot_attention_decode_bf16` needs for `rows` rows of
/// these heads: the split-KV merge's partials (floats) and counters (uint32). Allocate it 8-byte
/// aligned (`cuMemAlloc` is) and zero it once before its first use (`cuMemsetD8`); every launch
/// leaves the counters zero again, so it serves launch after launch as it is. One workspace per
/// stream with launches in flight and per attention shape (`q_heads`, `kv_heads`, `head_dim`);
/// sized for some rows, it serves launches of as many or fewer if every call declares the same
/// `workspace_bytes` (the counters lie in its last bytes, out of the partials' way).
///
/// # Safety
/// `bytes` is null (an error) or points to one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn aot_attention_decode_workspace_bytes(
    rows: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    bytes: *mut usize,
) -> AotStatus {
    boundary("aot_attention_decode_workspace_bytes", || {
        let heads = Heads::check(SIZE_NAMES, rows, q_heads, kv_heads, head_dim)?;
        // SAFETY: null or one writable size_t, the caller's contract.
        let out = unsafe { bytes.as_mut() }.ok_or_else(|| CapiError::null("bytes"))?;
        *out = heads.workspace_bytes();
        Ok(())
    })
}

/// A length the kernel takes as an int.
fn int32(name: &str, value: usize) -> Result<usize, CapiError> {
    if value > i32::MAX as usize {
        return Err(CapiError::invalid(format!(
            "`{name}` {value} must be below 2^31 (the kernel takes it as an int)"
        )));
    }
    Ok(value)
}

/// One decode step of attention for `args->m` rows, with the step before it fused in: per row, the
/// new token's query and key heads through RMSNorm (`q_norm`, `k_norm`; `eps`, `weight_offset`) and
/// NeoX RoPE at its position (row `pos` of `cos_sin`), its key and value written into the paged
/// cache at `pos`, then `out` = softmax(q k / sqrt(head_dim)) v over positions `0..=pos` (query
/// head `h` reads KV head `h / (q_heads / kv_heads)`). Positions `0..pos` of the cache hold the
/// sequence's earlier keys and values (written by earlier launches).
///
/// Positions, slots and block ids are read on the device: a position outside `0..max_pos` or past
/// its block-table row (`pos / 16 >= ld_bt`), or a negative block id, traps the kernel (the
/// context is then unusable, as after any device fault); a slot past the block table or a block
/// id past the caches is not checked there (an out-of-bounds access). Check them on the host.
/// Under `AOT_KERNELS_PDL=all` the launch may start while the kernel before it ends and read
/// `positions` and `slot_of_row` meanwhile: copy them from the host, not from that kernel.
///
/// The workspace (`aot_attention_decode_workspace_bytes`, zeroed once) serves the launches of one
/// stream in turn; launches that may run at the same time need one each.
///
/// # Safety
/// As for `aot_rmsnorm_bf16`; `args` is null (an error) or points to one `AotAttentionDecode`.
#[no_mangle]
pub unsafe extern "C" fn aot_attention_decode_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    args: *const AotAttentionDecode,
) -> AotStatus {
    boundary("aot_attention_decode_bf16", || {
        // SAFETY: null or one struct, the caller's contract.
        let a = unsafe { args.as_ref() }.ok_or_else(|| CapiError::null("args"))?;
        let heads = Heads::check(ARGS_NAMES, a.m, a.q_heads, a.kv_heads, a.head_dim)?;
        let Heads {
            rows: m,
            q_heads,
            kv_heads,
            head_dim: d,
        } = heads;
        let eps = norm_eps("args->eps", a.eps)?;
        let weight_offset = finite("args->weight_offset", a.weight_offset)?;
        let ld_qkv = int32("args->ld_qkv", a.ld_qkv)?;
        let ld_bt = int32("args->ld_bt", positive("args->ld_bt", a.ld_bt)?)?;
        let max_pos = int32("args->max_pos", positive("args->max_pos", a.max_pos)?)?;

        let qkv = device_buffer::<bf16>(
            "args->qkv",
            a.qkv,
            a.qkv_len,
            &strided_need(
                m,
                (
                    "(q_heads + 2 kv_heads) x head_dim",
                    (q_heads + 2 * kv_heads) * d,
                ),
                ("args->ld_qkv", ld_qkv),
            )?,
            ALIGN_BF16,
        )?;
        let head = need(&[("head_dim", d)])?;
        let q_norm =
            device_buffer::<bf16>("args->q_norm", a.q_norm, a.q_norm_len, &head, ALIGN_BF16)?;
        let k_norm =
            device_buffer::<bf16>("args->k_norm", a.k_norm, a.k_norm_len, &head, ALIGN_BF16)?;
        let cos_sin = device_buffer::<f32>(
            "args->cos_sin",
            a.cos_sin,
            a.cos_sin_len,
            &need(&[("max_pos", max_pos), ("head_dim", d)])?,
            ALIGN_F32,
        )?;
        let block = need(&[
            ("blocks", 1),
            ("kv_heads", kv_heads),
            ("tokens", BLOCK_TOKENS),
            ("head_dim", d),
        ])?;
        let k_cache =
            device_buffer::<bf16>("args->k_cache", a.k_cache, a.k_cache_len, &block, ALIGN_VEC)?;
        let v_cache =
            device_buffer::<bf16>("args->v_cache", a.v_cache, a.v_cache_len, &block, ALIGN_VEC)?;
        let block_table = device_buffer::<i32>(
            "args->block_table",
            a.block_table,
            a.block_table_len,
            &need(&[("ld_bt", ld_bt)])?,
            ALIGN_F32,
        )?;
        let per_row = need(&[("m", m)])?;
        let slot_of_row = device_buffer::<i32>(
            "args->slot_of_row",
            a.slot_of_row,
            a.slot_of_row_len,
            &per_row,
            ALIGN_F32,
        )?;
        let positions = device_buffer::<i32>(
            "args->positions",
            a.positions,
            a.positions_len,
            &per_row,
            ALIGN_F32,
        )?;
        let out = device_buffer::<bf16>(
            "args->out",
            a.out,
            a.out_len,
            &need(&[("m", m), ("q_heads", q_heads), ("head_dim", d)])?,
            ALIGN_BF16,
        )?;
        let workspace = device_buffer::<u8>(
            "args->workspace",
            a.workspace,
            a.workspace_bytes,
            &Need {
                elements: heads.workspace_bytes(),
                text: format!(
                    "aot_attention_decode_workspace_bytes of m {m}, q_heads {q_heads}, kv_heads {kv_heads}, head_dim {d}"
                ),
            },
            ALIGN_U64,
        )?;
        written_apart(
            &[span(&out), span(&k_cache), span(&v_cache), span(&workspace)],
            &[
                span(&qkv),
                span(&q_norm),
                span(&k_norm),
                span(&cos_sin),
                span(&block_table),
                span(&slot_of_row),
                span(&positions),
            ],
        )?;
        let (ws_ml, ws_o, counters) = layout(&heads, workspace.bytes()).cut(&workspace);

        let b = backend_ref(backend)?;
        let spans = [
            span(&qkv),
            span(&q_norm),
            span(&k_norm),
            span(&cos_sin),
            span(&k_cache),
            span(&v_cache),
            span(&block_table),
            span(&slot_of_row),
            span(&positions),
            span(&out),
            span(&workspace),
        ];
        b.launch(stream, &spans, |k| {
            let s = k.stream();
            // SAFETY: checked buffers (the workspace's parts inside it) on the caller's contract
            // (see `Borrowed::new`).
            let (qkv, q_norm, k_norm, cos_sin) = unsafe {
                (
                    Borrowed::new(s, qkv),
                    Borrowed::new(s, q_norm),
                    Borrowed::new(s, k_norm),
                    Borrowed::new(s, cos_sin),
                )
            };
            // SAFETY: as above.
            let (mut k_cache, mut v_cache, table, slots, positions, mut out) = unsafe {
                (
                    Borrowed::new(s, k_cache),
                    Borrowed::new(s, v_cache),
                    Borrowed::new(s, block_table),
                    Borrowed::new(s, slot_of_row),
                    Borrowed::new(s, positions),
                    Borrowed::new(s, out),
                )
            };
            // SAFETY: as above.
            let (mut ws_ml, mut ws_o, mut counters) = unsafe {
                (
                    Borrowed::new(s, ws_ml),
                    Borrowed::new(s, ws_o),
                    Borrowed::new(s, counters),
                )
            };
            let step = AttnDecode {
                qkv: dev(k, &*qkv),
                ld_qkv,
                q_norm: dev(k, &*q_norm),
                k_norm: dev(k, &*k_norm),
                eps,
                weight_offset,
                cos_sin: dev(k, &*cos_sin),
                max_pos,
                k_cache: dev_mut(k, &mut *k_cache),
                v_cache: dev_mut(k, &mut *v_cache),
                block_table: dev(k, &*table),
                ld_bt,
                slot_of_row: dev(k, &*slots),
                positions: dev(k, &*positions),
                out: dev_mut(k, &mut *out),
                m,
                q_heads,
                kv_heads,
                head_dim: d,
                grid_splits: MAX_SPLITS,
                pipelined: false,
                cluster: false,
                overlap_previous: false,
            };
            let mut scratch = AttnScratch {
                ws_ml: dev_mut(k, &mut *ws_ml),
                ws_o: dev_mut(k, &mut *ws_o),
                counters: dev_mut(k, &mut *counters),
            };
            attention_decode(k, step, &mut scratch)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads(rows: usize, q_heads: usize, kv_heads: usize, head_dim: usize) -> Heads {
        Heads::check(SIZE_NAMES, rows, q_heads, kv_heads, head_dim).unwrap()
    }

    #[test]
    fn the_workspace_holds_the_backends_scratch_4_bytes_an_element() {
        let h = heads(8, 32, 8, 128);
        let (ml, o, counters) = attn_scratch_needs(8, 32, 8, 128);
        assert_eq!(h.workspace_bytes(), 4 * (ml + o + counters));
        assert_eq!(
            layout(&h, h.workspace_bytes()),
            Layout {
                ws_ml: (0, ml),
                ws_o: (4 * ml, o),
                counters: (4 * (ml + o), counters),
            },
            "at its exact size the arrays follow each other"
        );
    }

    #[test]
    fn the_pairs_are_8_byte_aligned_and_the_counters_are_the_last_whole_words() {
        let h = heads(3, 6, 2, 64);
        let at = layout(&h, h.workspace_bytes() + 7);
        assert_eq!(at.ws_ml.0 % 8, 0);
        assert_eq!(at.ws_o.0 % 4, 0);
        assert_eq!(at.counters.0 + 4 * at.counters.1, h.workspace_bytes() + 4);
    }

    #[test]
    fn partials_of_any_rows_never_reach_the_counters_of_any_rows() {
        for (q_heads, kv_heads, head_dim) in [(32, 8, 128), (8, 1, 256), (4, 4, 64)] {
            let sized = heads(8, q_heads, kv_heads, head_dim).workspace_bytes() + 12;
            for a in 1..=8 {
                for b in 1..=8 {
                    let (first, then) = (
                        layout(&heads(a, q_heads, kv_heads, head_dim), sized),
                        layout(&heads(b, q_heads, kv_heads, head_dim), sized),
                    );
                    let partials_end = first.ws_o.0 + 4 * first.ws_o.1;
                    assert!(
                        partials_end <= then.counters.0,
                        "{q_heads}/{kv_heads}x{head_dim}: {a} rows then {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn heads_outside_the_kernel_are_named() {
        let err = |rows, q, kv, d| {
            Heads::check(ARGS_NAMES, rows, q, kv, d)
                .unwrap_err()
                .message
        };
        assert_eq!(
            err(0, 8, 2, 128),
            "`args->m` 0 must be 1..=65535 (one grid row each)"
        );
        assert_eq!(
            err(1, 8, 2, 96),
            "`args->head_dim` 96: the kernel is built for 64, 128 and 256"
        );
        assert!(err(1, 6, 4, 128).starts_with("`args->q_heads` 6 over `args->kv_heads` 4"));
        assert!(err(1, 18, 2, 128).starts_with("`args->q_heads` 18 over `args->kv_heads` 2"));
        assert!(err(1, 0, 2, 128).starts_with("`args->q_heads` 0 over"));
        assert_eq!(
            err(1, 8, 0, 128),
            "`args->kv_heads` is 0: it must be at least 1"
        );
        assert!(err(65535, 1 << 20, 1 << 20, 256)
            .ends_with("must be below 2^31 (the kernel's int indices)"));
    }
}
