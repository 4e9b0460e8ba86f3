//! Gated DeltaNet token by token (`aot_kernels::ops::gated_delta_net::gdn_recurrent`): the linear
//! attention layers of Qwen3.5/3.6-35B-A3B for a batch of sequences, one new token each in a
//! decode step or several, with the conv and fp32 delta-rule states in the caller's slots, and the
//! size of its workspace (the conv output).
//!
//! The Triton modules are compiled for the model's heads only, and assume every pointer 16-byte
//! aligned: both are checked here, before the backend.

use std::ffi::c_void;

use aot_kernels::ops::gated_delta_net::{
    gdn_recurrent, GdnInputs, GdnLayer, GdnScratch, GdnSequences, GdnShape, GdnState, MODULE_CONV,
    MODULE_RECURRENT,
};
use half::bf16;

use super::{compiled_for, finite, ALIGN_VEC};
use crate::args::{device_buffer, need, positive, written_apart, AotDevicePtr, DeviceArg, Need};
use crate::backend::{backend_ref, span, AotBackend};
use crate::borrow::{slice, Borrowed, CallerSlices, Lent};
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

/// How a call names the shape: the size query by its parameters, the launch by its struct's fields.
type ShapeNames = [&'static str; 6];
const SIZE_NAMES: ShapeNames = [
    "tokens",
    "key_heads",
    "value_heads",
    "key_dim",
    "value_dim",
    "conv_width",
];
const ARGS_NAMES: ShapeNames = [
    "args->n_tokens",
    "args->key_heads",
    "args->value_heads",
    "args->key_dim",
    "args->value_dim",
    "args->conv_width",
];

/// The layer's shape, as the kernels were compiled for it, and the tokens of a launch.
fn checked_shape(
    [tokens_name, hk, hv, dk, dv, width]: ShapeNames,
    tokens: usize,
    shape: GdnShape,
) -> Result<GdnShape, CapiError> {
    if !(1..=i32::MAX as usize).contains(&tokens) {
        return Err(CapiError::invalid(format!(
            "`{tokens_name}` {tokens} must be 1..2^31 (token offsets are int32)"
        )));
    }
    compiled_for(hk, shape.key_heads, MODULE_RECURRENT, "HK")?;
    compiled_for(hv, shape.value_heads, MODULE_RECURRENT, "HV")?;
    compiled_for(dk, shape.key_dim, MODULE_RECURRENT, "DK")?;
    compiled_for(dv, shape.value_dim, MODULE_RECURRENT, "DV")?;
    compiled_for(width, shape.conv_width, MODULE_CONV, "WIDTH")?;
    Ok(shape)
}

/// Bytes of the workspace: the conv output, `[tokens][conv_dim]` bf16.
fn workspace_bytes(shape: &GdnShape, tokens: usize) -> usize {
    2 * tokens * shape.conv_dim()
}

/// The arguments of `aot_gdn_recurrent_bf16`: device buffers, each with its declared length in
/// elements (the workspace in bytes), 16-byte aligned (the kernels are compiled assuming it), and
/// the shapes. Tokens are the batch's, sequence after sequence; `conv_dim` is
/// `2 key_heads key_dim + value_heads value_dim` (channels `[q | k | v]`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AotGdn {
    /// `bf16[n_tokens][conv_dim]`: the `in_proj_qkv` output of every token.
    pub qkv: AotDevicePtr,
    pub qkv_len: usize,
    /// `bf16[n_tokens][value_heads]`: the `in_proj_a` output (the decay's input).
    pub a: AotDevicePtr,
    pub a_len: usize,
    /// `bf16[n_tokens][value_heads]`: the `in_proj_b` output (beta's input).
    pub b: AotDevicePtr,
    pub b_len: usize,
    /// `bf16[n_tokens][value_heads * value_dim]`: the `in_proj_z` output (the output gate).
    pub z: AotDevicePtr,
    pub z_len: usize,
    /// `bf16[conv_dim][conv_width]`: `conv1d.weight`.
    pub conv_weight: AotDevicePtr,
    pub conv_weight_len: usize,
    /// `float[value_heads]`: `A_log`, as fp32.
    pub a_log: AotDevicePtr,
    pub a_log_len: usize,
    /// `float[value_heads]`: `dt_bias`, as fp32.
    pub dt_bias: AotDevicePtr,
    pub dt_bias_len: usize,
    /// `bf16[value_dim]`: the gated RMSNorm's weight (`norm.weight`).
    pub norm_weight: AotDevicePtr,
    pub norm_weight_len: usize,
    /// `bf16[state_slots][conv_width - 1][conv_dim]`: each slot's last conv inputs, oldest first;
    /// a sequence's slot is read (unless `has_state` is 0) and shifted by its tokens.
    pub conv_state: AotDevicePtr,
    pub conv_state_len: usize,
    /// `float[state_slots][value_heads][key_dim][value_dim]`: each slot's delta-rule state; a
    /// sequence's slot is read (unless `has_state` is 0) and left after its last token.
    pub recurrent_state: AotDevicePtr,
    pub recurrent_state_len: usize,
    /// Slots of both state pools: at least 1.
    pub state_slots: usize,
    /// `int32[n_seqs + 1]`: token offsets, `0 = cu_seqlens[0] < cu_seqlens[1] < .. <
    /// cu_seqlens[n_seqs] = n_tokens` (each sequence at least one token).
    pub cu_seqlens: AotDevicePtr,
    pub cu_seqlens_len: usize,
    /// `int32[n_seqs]`: each sequence's state slot, `0..state_slots`, distinct in one launch.
    pub slot_of_seq: AotDevicePtr,
    pub slot_of_seq_len: usize,
    /// `int32[n_seqs]`: 0 for a new request (its slot's old content is ignored and overwritten),
    /// 1 to continue from its slot's states.
    pub has_state: AotDevicePtr,
    pub has_state_len: usize,
    /// `bf16[n_tokens][value_heads * value_dim]`: `w * rmsnorm(o) * silu(z)` per value head, the
    /// input of `out_proj`.
    pub out: AotDevicePtr,
    pub out_len: usize,
    /// 16-byte aligned, `workspace_bytes` long: see `aot_gdn_recurrent_workspace_bytes`.
    pub workspace: AotDevicePtr,
    pub workspace_bytes: usize,
    /// Sequences: 1..=n_tokens.
    pub n_seqs: usize,
    /// Tokens of all sequences together: 1..2^31.
    pub n_tokens: usize,
    /// The layer's shape: 16, 32, 128, 128 and 4 (Qwen3.5/3.6-35B-A3B), the only one the kernels
    /// are built for.
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_width: usize,
    /// The gated RMSNorm's epsilon: finite, > 0.
    pub eps: f32,
}

/// `*bytes` = the size of the workspace that `aot_gdn_recurrent_bf16` needs for `tokens` tokens
/// of this shape: the conv output (`tokens x conv_dim` bf16). Allocate it 16-byte aligned
/// (`cuMemAlloc` is); it holds nothing between launches (no zeroing needed), so one sized for some
/// tokens serves every launch of as many or fewer on its stream.
///
/// # Safety
/// `bytes` is null (an error) or points to one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn aot_gdn_recurrent_workspace_bytes(
    tokens: usize,
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
    conv_width: usize,
    bytes: *mut usize,
) -> AotStatus {
    boundary("aot_gdn_recurrent_workspace_bytes", || {
        let shape = checked_shape(
            SIZE_NAMES,
            tokens,
            GdnShape {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
                conv_width,
            },
        )?;
        // SAFETY: null or one writable size_t, the caller's contract.
        let out = unsafe { bytes.as_mut() }.ok_or_else(|| CapiError::null("bytes"))?;
        *out = workspace_bytes(&shape, tokens);
        Ok(())
    })
}

/// The scratch of `gdn_recurrent` in the caller's workspace (`core_out`, which only the chunked
/// prefill uses, empty).
impl CallerSlices for GdnScratch {
    fn leak_slices(self) {
        let _caller_owns_them = (self.conv_out.leak(), self.core_out.leak());
    }
}

/// One Gated DeltaNet layer's kernel work, token by token, for a batch of sequences (a decode
/// step: one token each; a prompt's tokens: several): the causal conv over each sequence's conv
/// state and new tokens, SiLU; q and k L2-normalised, `beta = sigmoid(b)`,
/// `g = -exp(A_log) softplus(a + dt_bias)`; per value head the fp32 state `S = exp(g) S`,
/// `S += k (beta (v - S^T k))^T`, `o = S^T q`; `out = w * rmsnorm(o) * silu(z)`. Both states of
/// each sequence's slot are updated. A sequence's outputs and states are the same bits however its
/// tokens are split into launches. Slots and offsets are read on the device: keep them in range
/// (they are not checked there).
///
/// # Safety
/// `args` is null (an error) or points to one `AotGdn`; its buffers and `backend`, `stream` as for
/// `aot_rmsnorm_bf16`.
#[no_mangle]
pub unsafe extern "C" fn aot_gdn_recurrent_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    args: *const AotGdn,
) -> AotStatus {
    boundary("aot_gdn_recurrent_bf16", || {
        // SAFETY: null or one readable struct, the caller's contract.
        let a = *unsafe { args.as_ref() }.ok_or_else(|| CapiError::null("args"))?;
        let (n, n_seqs) = (a.n_tokens, a.n_seqs);
        let shape = checked_shape(
            ARGS_NAMES,
            n,
            GdnShape {
                key_heads: a.key_heads,
                value_heads: a.value_heads,
                key_dim: a.key_dim,
                value_dim: a.value_dim,
                conv_width: a.conv_width,
            },
        )?;
        if !(1..=n).contains(&n_seqs) {
            return Err(CapiError::invalid(format!(
                "`args->n_seqs` {n_seqs} must be 1..=`args->n_tokens` {n}: every sequence has at least one token"
            )));
        }
        let slots = positive("args->state_slots", a.state_slots)?;
        if finite("args->eps", a.eps)? <= 0.0 {
            return Err(CapiError::invalid(format!(
                "`args->eps` {} must be > 0",
                a.eps
            )));
        }
        let (c, hv, vw) = (shape.conv_dim(), shape.value_heads, shape.value_width());
        let buffer = |name, ptr, len, dims: &[(&str, usize)]| {
            device_buffer::<bf16>(name, ptr, len, &need(dims)?, ALIGN_VEC)
        };
        let qkv = buffer(
            "args->qkv",
            a.qkv,
            a.qkv_len,
            &[("n_tokens", n), ("conv_dim", c)],
        )?;
        let in_a = buffer(
            "args->a",
            a.a,
            a.a_len,
            &[("n_tokens", n), ("value_heads", hv)],
        )?;
        let in_b = buffer(
            "args->b",
            a.b,
            a.b_len,
            &[("n_tokens", n), ("value_heads", hv)],
        )?;
        let z = buffer(
            "args->z",
            a.z,
            a.z_len,
            &[("n_tokens", n), ("value_width", vw)],
        )?;
        let conv_weight = buffer(
            "args->conv_weight",
            a.conv_weight,
            a.conv_weight_len,
            &[("conv_dim", c), ("conv_width", shape.conv_width)],
        )?;
        let heads = need(&[("value_heads", hv)])?;
        let a_log = device_buffer::<f32>("args->a_log", a.a_log, a.a_log_len, &heads, ALIGN_VEC)?;
        let dt_bias =
            device_buffer::<f32>("args->dt_bias", a.dt_bias, a.dt_bias_len, &heads, ALIGN_VEC)?;
        let norm_weight = buffer(
            "args->norm_weight",
            a.norm_weight,
            a.norm_weight_len,
            &[("value_dim", shape.value_dim)],
        )?;
        let conv_state = buffer(
            "args->conv_state",
            a.conv_state,
            a.conv_state_len,
            &[
                ("state_slots", slots),
                ("conv_width - 1", shape.conv_width - 1),
                ("conv_dim", c),
            ],
        )?;
        let recurrent_state = device_buffer::<f32>(
            "args->recurrent_state",
            a.recurrent_state,
            a.recurrent_state_len,
            &need(&[
                ("state_slots", slots),
                ("value_heads", hv),
                ("key_dim", shape.key_dim),
                ("value_dim", shape.value_dim),
            ])?,
            ALIGN_VEC,
        )?;
        let per_seq = need(&[("n_seqs", n_seqs)])?;
        let int32s =
            |name, ptr, len, need: &Need| device_buffer::<i32>(name, ptr, len, need, ALIGN_VEC);
        let cu_seqlens = int32s(
            "args->cu_seqlens",
            a.cu_seqlens,
            a.cu_seqlens_len,
            &need(&[("n_seqs + 1", n_seqs + 1)])?,
        )?;
        let slot_of_seq = int32s(
            "args->slot_of_seq",
            a.slot_of_seq,
            a.slot_of_seq_len,
            &per_seq,
        )?;
        let has_state = int32s("args->has_state", a.has_state, a.has_state_len, &per_seq)?;
        let out = buffer(
            "args->out",
            a.out,
            a.out_len,
            &[("n_tokens", n), ("value_width", vw)],
        )?;
        let workspace = device_buffer::<u8>(
            "args->workspace",
            a.workspace,
            a.workspace_bytes,
            &Need {
                elements: workspace_bytes(&shape, n),
                text: format!("aot_gdn_recurrent_workspace_bytes of n_tokens {n}"),
            },
            ALIGN_VEC,
        )?;
        written_apart(
            &[
                span(&out),
                span(&conv_state),
                span(&recurrent_state),
                span(&workspace),
            ],
            &[
                span(&qkv),
                span(&in_a),
                span(&in_b),
                span(&z),
                span(&conv_weight),
                span(&a_log),
                span(&dt_bias),
                span(&norm_weight),
                span(&cu_seqlens),
                span(&slot_of_seq),
                span(&has_state),
            ],
        )?;
        let conv_out: DeviceArg<bf16> = workspace
            .part(0, n * c)
            .expect("the workspace holds the conv output (checked above)");
        let core_out: DeviceArg<bf16> = workspace.part(0, 0).expect("an empty part");

        let b = backend_ref(backend)?;
        b.require_modules("aot_gdn_recurrent_bf16", &[MODULE_CONV, MODULE_RECURRENT])?;
        let spans = [
            span(&qkv),
            span(&in_a),
            span(&in_b),
            span(&z),
            span(&conv_weight),
            span(&a_log),
            span(&dt_bias),
            span(&norm_weight),
            span(&conv_state),
            span(&recurrent_state),
            span(&cu_seqlens),
            span(&slot_of_seq),
            span(&has_state),
            span(&out),
            span(&workspace),
        ];
        b.launch(stream, &spans, |k| {
            let s = k.stream();
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (qkv, in_a, in_b, z) = unsafe {
                (
                    Borrowed::new(s, qkv),
                    Borrowed::new(s, in_a),
                    Borrowed::new(s, in_b),
                    Borrowed::new(s, z),
                )
            };
            // SAFETY: as above.
            let (conv_weight, a_log, dt_bias, norm_weight) = unsafe {
                (
                    Borrowed::new(s, conv_weight),
                    Borrowed::new(s, a_log),
                    Borrowed::new(s, dt_bias),
                    Borrowed::new(s, norm_weight),
                )
            };
            // SAFETY: as above.
            let (mut conv_state, mut recurrent_state, mut out) = unsafe {
                (
                    Borrowed::new(s, conv_state),
                    Borrowed::new(s, recurrent_state),
                    Borrowed::new(s, out),
                )
            };
            // SAFETY: as above.
            let (cu_seqlens, slot_of_seq, has_state) = unsafe {
                (
                    Borrowed::new(s, cu_seqlens),
                    Borrowed::new(s, slot_of_seq),
                    Borrowed::new(s, has_state),
                )
            };
            // SAFETY: parts of the checked workspace, held in `Lent` (never freed).
            let mut scratch = Lent::new(unsafe {
                GdnScratch {
                    conv_out: slice(s, conv_out),
                    core_out: slice(s, core_out),
                }
            });
            let layer = GdnLayer {
                conv_weight: &conv_weight,
                a_log: &a_log,
                dt_bias: &dt_bias,
                norm_weight: &norm_weight,
                eps: a.eps,
            };
            let mut state = GdnState {
                conv: &mut conv_state,
                recurrent: &mut recurrent_state,
                slots,
            };
            let seqs = GdnSequences {
                n_seqs,
                n_tokens: n,
                cu_seqlens: &cu_seqlens,
                slots: &slot_of_seq,
                has_state: &has_state,
            };
            let inputs = GdnInputs {
                qkv: &qkv,
                a: &in_a,
                b: &in_b,
                z: &z,
            };
            gdn_recurrent(
                k,
                &shape,
                &layer,
                &mut state,
                &seqs,
                &inputs,
                &mut scratch,
                &mut out,
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_the_conv_output_in_bf16() {
        let shape = GdnShape::QWEN3_5_A3B;
        assert_eq!(workspace_bytes(&shape, 3), 2 * 3 * shape.conv_dim());
        assert_eq!(
            checked_shape(SIZE_NAMES, 3, shape).unwrap(),
            GdnShape::QWEN3_5_A3B
        );
    }

    #[test]
    fn a_shape_the_kernels_lack_is_named_by_its_field() {
        let err = |shape| checked_shape(ARGS_NAMES, 1, shape).unwrap_err().message;
        let a3b = GdnShape::QWEN3_5_A3B;
        assert_eq!(
            err(GdnShape {
                value_heads: 8,
                ..a3b
            }),
            "`args->value_heads` 8: the `gdn_recurrent` kernels are built for 32 only (the Qwen3.5/3.6-35B-A3B shape)"
        );
        assert!(err(GdnShape {
            conv_width: 3,
            ..a3b
        })
        .starts_with("`args->conv_width` 3: the `gdn_conv1d` kernels are built for 4"));
        assert_eq!(
            checked_shape(ARGS_NAMES, 0, a3b).unwrap_err().message,
            "`args->n_tokens` 0 must be 1..2^31 (token offsets are int32)"
        );
    }
}
