//! The MoE block of Qwen3.5/3.6-35B-A3B (`aot_kernels::ops::moe::moe_forward`) for decode batches
//! of 1..=16 tokens: router, top-k routing, the chosen experts and the gated shared expert, and the
//! size of its workspace (the routing and the experts' intermediates).
//!
//! The Triton modules are compiled for the model's shape only, and assume every pointer 16-byte
//! aligned: both are checked here, before the backend.

use std::ffi::c_void;

use aot_kernels::ops::moe::{
    moe_forward, MoeLayer, MoeScratch, MoeShape, MODULE_COMBINE, MODULE_DOWN, MODULE_GATE_UP,
    MODULE_ROUTE, MODULE_ROUTER,
};
use aot_kernels::ops::OpsError;
use half::bf16;

use super::{aligned_parts, compiled_for, constexpr, ALIGN_VEC};
use crate::args::{device_buffer, need, written_apart, AotDevicePtr, DeviceArg, Need};
use crate::backend::{backend_ref, span, AotBackend};
use crate::borrow::{slice, Borrowed, CallerSlices, Lent};
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

const MODULES: [&str; 5] = [
    MODULE_ROUTER,
    MODULE_ROUTE,
    MODULE_GATE_UP,
    MODULE_DOWN,
    MODULE_COMBINE,
];

/// How a call names the shape: the size query by its parameters, the launch by its struct's fields.
type ShapeNames = [&'static str; 5];
const SIZE_NAMES: ShapeNames = ["tokens", "hidden", "experts", "top_k", "inter"];
const ARGS_NAMES: ShapeNames = [
    "args->n_tokens",
    "args->hidden",
    "args->experts",
    "args->top_k",
    "args->inter",
];

/// The block's shape, as the kernels were compiled for it, and the tokens of a launch.
fn checked_shape(
    [tokens_name, h, e, k, i]: ShapeNames,
    tokens: usize,
    shape: MoeShape,
) -> Result<MoeShape, CapiError> {
    let max = constexpr(MODULE_ROUTE, "MAX_TOKENS")?;
    if !(1..=max).contains(&tokens) {
        return Err(CapiError::invalid(format!(
            "`{tokens_name}` {tokens}: the kernels take 1..={max} tokens a launch; split larger batches"
        )));
    }
    compiled_for(h, shape.hidden, MODULE_ROUTER, "H")?;
    compiled_for(e, shape.experts, MODULE_ROUTER, "E")?;
    compiled_for(k, shape.top_k, MODULE_ROUTE, "TOPK")?;
    compiled_for(i, shape.inter, MODULE_GATE_UP, "I")?;
    Ok(shape)
}

/// Where the scratch arrays lie in the workspace, as (byte offset, elements), each 16-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    logits: (usize, usize),
    topk_ids: (usize, usize),
    topk_weights: (usize, usize),
    experts: (usize, usize),
    n_experts: (usize, usize),
    chosen: (usize, usize),
    arrived: (usize, usize),
    h: (usize, usize),
    y: (usize, usize),
    bytes: usize,
}

/// `MoeScratch::new`'s arrays for `tokens` tokens, laid out in one workspace.
fn layout(shape: &MoeShape, tokens: usize) -> Layout {
    let pairs = tokens * shape.top_k;
    let rows = pairs + tokens;
    let elements = [
        tokens * (shape.experts + 1),
        pairs,
        pairs,
        pairs.max(1),
        1,
        shape.experts,
        1,
        rows * shape.inter,
        rows * shape.hidden,
    ];
    // bf16, i32, bf16, i32, i32, i32, i32, bf16, bf16.
    let sizes: [usize; 9] = [2, 4, 2, 4, 4, 4, 4, 2, 2];
    let (at, bytes) = aligned_parts::<9>(std::array::from_fn(|j| elements[j] * sizes[j]));
    Layout {
        logits: (at[0], elements[0]),
        topk_ids: (at[1], elements[1]),
        topk_weights: (at[2], elements[2]),
        experts: (at[3], elements[3]),
        n_experts: (at[4], elements[4]),
        chosen: (at[5], elements[5]),
        arrived: (at[6], elements[6]),
        h: (at[7], elements[7]),
        y: (at[8], elements[8]),
        bytes,
    }
}

/// The checked workspace cut into the scratch arrays.
struct Parts {
    logits: DeviceArg<bf16>,
    topk_ids: DeviceArg<i32>,
    topk_weights: DeviceArg<bf16>,
    experts: DeviceArg<i32>,
    n_experts: DeviceArg<i32>,
    chosen: DeviceArg<i32>,
    arrived: DeviceArg<i32>,
    h: DeviceArg<bf16>,
    y: DeviceArg<bf16>,
}

impl Layout {
    fn cut(&self, workspace: &DeviceArg<u8>) -> Parts {
        let inside = "the layout lies inside a workspace of the size it needs";
        Parts {
            logits: workspace.part(self.logits.0, self.logits.1).expect(inside),
            topk_ids: workspace
                .part(self.topk_ids.0, self.topk_ids.1)
                .expect(inside),
            topk_weights: workspace
                .part(self.topk_weights.0, self.topk_weights.1)
                .expect(inside),
            experts: workspace
                .part(self.experts.0, self.experts.1)
                .expect(inside),
            n_experts: workspace
                .part(self.n_experts.0, self.n_experts.1)
                .expect(inside),
            chosen: workspace.part(self.chosen.0, self.chosen.1).expect(inside),
            arrived: workspace
                .part(self.arrived.0, self.arrived.1)
                .expect(inside),
            h: workspace.part(self.h.0, self.h.1).expect(inside),
            y: workspace.part(self.y.0, self.y.1).expect(inside),
        }
    }
}

/// The arguments of `aot_moe_forward_bf16`: device buffers, each with its declared length in
/// elements (the workspace in bytes), 16-byte aligned (the kernels are compiled assuming it), and
/// the shapes. The weights are row-major as transformers stores them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AotMoe {
    /// `bf16[n_tokens][hidden]`: the block's input (after the post-attention norm).
    pub x: AotDevicePtr,
    pub x_len: usize,
    /// `bf16[experts][hidden]`: the router (`gate.weight`).
    pub router: AotDevicePtr,
    pub router_len: usize,
    /// `bf16[hidden]`: the shared expert's gate (`shared_expert_gate.weight`).
    pub shared_gate: AotDevicePtr,
    pub shared_gate_len: usize,
    /// `bf16[experts][2 inter][hidden]`: each expert's gate_proj rows, then its up_proj rows.
    pub gate_up: AotDevicePtr,
    pub gate_up_len: usize,
    /// `bf16[experts][hidden][inter]`: each expert's down_proj.
    pub down: AotDevicePtr,
    pub down_len: usize,
    /// `bf16[2 inter][hidden]`: the shared expert's gate_proj rows, then its up_proj rows.
    pub shared_gate_up: AotDevicePtr,
    pub shared_gate_up_len: usize,
    /// `bf16[hidden][inter]`: the shared expert's down_proj.
    pub shared_down: AotDevicePtr,
    pub shared_down_len: usize,
    /// `bf16[n_tokens][hidden]`: the block's output.
    pub out: AotDevicePtr,
    pub out_len: usize,
    /// 16-byte aligned, `workspace_bytes` long: see `aot_moe_forward_workspace_bytes`.
    pub workspace: AotDevicePtr,
    pub workspace_bytes: usize,
    /// Tokens: 1..=16.
    pub n_tokens: usize,
    /// The block's shape: 2048, 256, 8 and 512 (Qwen3.5/3.6-35B-A3B), the only one the kernels
    /// are built for.
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Intermediate size of each expert and of the shared expert.
    pub inter: usize,
}

/// `*bytes` = the size of the workspace that `aot_moe_forward_bf16` needs for `tokens` tokens
/// (1..=16) of this shape: the router logits, the routing, and each (token, expert) pair's
/// intermediates. Allocate it 16-byte aligned (`cuMemAlloc` is); it holds nothing between launches
/// (no zeroing needed), so one sized for 16 tokens serves every launch on its stream.
///
/// # Safety
/// `bytes` is null (an error) or points to one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn aot_moe_forward_workspace_bytes(
    tokens: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    inter: usize,
    bytes: *mut usize,
) -> AotStatus {
    boundary("aot_moe_forward_workspace_bytes", || {
        let shape = checked_shape(
            SIZE_NAMES,
            tokens,
            MoeShape {
                hidden,
                experts,
                top_k,
                inter,
            },
        )?;
        // SAFETY: null or one writable size_t, the caller's contract.
        let out = unsafe { bytes.as_mut() }.ok_or_else(|| CapiError::null("bytes"))?;
        *out = layout(&shape, tokens).bytes;
        Ok(())
    })
}

impl CallerSlices for MoeScratch {
    fn leak_slices(self) {
        let _caller_owns_them = (
            self.logits.leak(),
            self.topk_ids.leak(),
            self.topk_weights.leak(),
            self.experts.leak(),
            self.n_experts.leak(),
            self.chosen.leak(),
            self.arrived.leak(),
            self.h.leak(),
            self.y.leak(),
        );
    }
}

/// The MoE block for `n_tokens` rows of `x` into `out`: `p = softmax(x router^T)`, the `top_k`
/// largest divided by their sum; `out = sum over the chosen experts of p_e down_e(silu(gate_e x) *
/// up_e x)`, in ascending expert order, `+ sigmoid(x . shared_gate) * shared_expert(x)`, rounded
/// to bf16 where transformers rounds in a bf16 model. Only the chosen experts' weights are read.
///
/// # Safety
/// `args` is null (an error) or points to one `AotMoe`; its buffers and `backend`, `stream` as for
/// `aot_rmsnorm_bf16`.
#[no_mangle]
pub unsafe extern "C" fn aot_moe_forward_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    args: *const AotMoe,
) -> AotStatus {
    boundary("aot_moe_forward_bf16", || {
        // SAFETY: null or one readable struct, the caller's contract.
        let a = *unsafe { args.as_ref() }.ok_or_else(|| CapiError::null("args"))?;
        let n = a.n_tokens;
        let shape = checked_shape(
            ARGS_NAMES,
            n,
            MoeShape {
                hidden: a.hidden,
                experts: a.experts,
                top_k: a.top_k,
                inter: a.inter,
            },
        )?;
        let (h, e, i) = (shape.hidden, shape.experts, shape.inter);
        let buffer = |name, ptr, len, dims: &[(&str, usize)]| {
            device_buffer::<bf16>(name, ptr, len, &need(dims)?, ALIGN_VEC)
        };
        let x = buffer("args->x", a.x, a.x_len, &[("n_tokens", n), ("hidden", h)])?;
        let router = buffer(
            "args->router",
            a.router,
            a.router_len,
            &[("experts", e), ("hidden", h)],
        )?;
        let shared_gate = buffer(
            "args->shared_gate",
            a.shared_gate,
            a.shared_gate_len,
            &[("hidden", h)],
        )?;
        let gate_up = buffer(
            "args->gate_up",
            a.gate_up,
            a.gate_up_len,
            &[("experts", e), ("2 inter", 2 * i), ("hidden", h)],
        )?;
        let down = buffer(
            "args->down",
            a.down,
            a.down_len,
            &[("experts", e), ("hidden", h), ("inter", i)],
        )?;
        let shared_gate_up = buffer(
            "args->shared_gate_up",
            a.shared_gate_up,
            a.shared_gate_up_len,
            &[("2 inter", 2 * i), ("hidden", h)],
        )?;
        let shared_down = buffer(
            "args->shared_down",
            a.shared_down,
            a.shared_down_len,
            &[("hidden", h), ("inter", i)],
        )?;
        let out = buffer(
            "args->out",
            a.out,
            a.out_len,
            &[("n_tokens", n), ("hidden", h)],
        )?;
        let at = layout(&shape, n);
        let workspace = device_buffer::<u8>(
            "args->workspace",
            a.workspace,
            a.workspace_bytes,
            &Need {
                elements: at.bytes,
                text: format!("aot_moe_forward_workspace_bytes of n_tokens {n}"),
            },
            ALIGN_VEC,
        )?;
        written_apart(
            &[span(&out), span(&workspace)],
            &[
                span(&x),
                span(&router),
                span(&shared_gate),
                span(&gate_up),
                span(&down),
                span(&shared_gate_up),
                span(&shared_down),
            ],
        )?;
        let parts = at.cut(&workspace);

        let b = backend_ref(backend)?;
        b.require_modules("aot_moe_forward_bf16", &MODULES)?;
        let spans = [
            span(&x),
            span(&router),
            span(&shared_gate),
            span(&gate_up),
            span(&down),
            span(&shared_gate_up),
            span(&shared_down),
            span(&out),
            span(&workspace),
        ];
        b.launch(stream, &spans, |k| {
            let s = k.stream();
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (x, router, shared_gate, gate_up) = unsafe {
                (
                    Borrowed::new(s, x),
                    Borrowed::new(s, router),
                    Borrowed::new(s, shared_gate),
                    Borrowed::new(s, gate_up),
                )
            };
            // SAFETY: as above.
            let (down, shared_gate_up, shared_down, mut out) = unsafe {
                (
                    Borrowed::new(s, down),
                    Borrowed::new(s, shared_gate_up),
                    Borrowed::new(s, shared_down),
                    Borrowed::new(s, out),
                )
            };
            // SAFETY: parts of the checked workspace, held in `Lent` (never freed).
            let mut scratch = Lent::new(unsafe {
                MoeScratch {
                    max_tokens: n,
                    logits: slice(s, parts.logits),
                    topk_ids: slice(s, parts.topk_ids),
                    topk_weights: slice(s, parts.topk_weights),
                    experts: slice(s, parts.experts),
                    n_experts: slice(s, parts.n_experts),
                    chosen: slice(s, parts.chosen),
                    arrived: slice(s, parts.arrived),
                    h: slice(s, parts.h),
                    y: slice(s, parts.y),
                }
            });
            let layer = MoeLayer {
                router: &router,
                shared_gate: &shared_gate,
                gate_up: &gate_up,
                down: &down,
                shared_gate_up: &shared_gate_up,
                shared_down: &shared_down,
            };
            // The routing launch counts its programs in `arrived` and marks experts in `chosen`,
            // and needs both zero; the workspace holds nothing between calls, so zero them here.
            let zero = |source| OpsError::Driver {
                op: "moe_forward",
                source,
            };
            s.memset_zeros(&mut scratch.chosen).map_err(zero)?;
            s.memset_zeros(&mut scratch.arrived).map_err(zero)?;
            moe_forward(k, &shape, &layer, &x, n, &mut scratch, &mut out)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_holds_the_backends_scratch_each_array_16_byte_aligned() {
        let shape = MoeShape::QWEN3_5_A3B;
        for tokens in [1, 3, 16] {
            let at = layout(&shape, tokens);
            let (pairs, rows) = (tokens * shape.top_k, tokens * (shape.top_k + 1));
            assert_eq!(at.logits, (0, tokens * (shape.experts + 1)));
            assert_eq!(at.topk_ids.1, pairs);
            assert_eq!(at.topk_weights.1, pairs);
            assert_eq!(at.experts.1, pairs);
            assert_eq!(at.n_experts.1, 1);
            assert_eq!(at.chosen.1, shape.experts);
            assert_eq!(at.arrived.1, 1);
            assert_eq!(at.h.1, rows * shape.inter);
            assert_eq!(
                at.y,
                (at.bytes - 2 * rows * shape.hidden, rows * shape.hidden)
            );
            let parts = [
                (at.logits, 2),
                (at.topk_ids, 4),
                (at.topk_weights, 2),
                (at.experts, 4),
                (at.n_experts, 4),
                (at.chosen, 4),
                (at.arrived, 4),
                (at.h, 2),
                (at.y, 2),
            ];
            for pair in parts.windows(2) {
                let ((first, size), (then, _)) = (pair[0], pair[1]);
                assert_eq!(then.0 % 16, 0, "{tokens} tokens: {then:?}");
                assert!(
                    first.0 + size * first.1 <= then.0,
                    "{tokens} tokens: overlap"
                );
            }
        }
    }

    #[test]
    fn a_shape_the_kernels_lack_is_named_by_its_field() {
        let a3b = MoeShape::QWEN3_5_A3B;
        let err = |tokens, shape| {
            checked_shape(ARGS_NAMES, tokens, shape)
                .unwrap_err()
                .message
        };
        assert_eq!(
            err(1, MoeShape { experts: 16, ..a3b }),
            "`args->experts` 16: the `moe_router` kernels are built for 256 only (the Qwen3.5/3.6-35B-A3B shape)"
        );
        assert!(err(1, MoeShape { top_k: 4, ..a3b })
            .starts_with("`args->top_k` 4: the `moe_route` kernels are built for 8"));
        assert_eq!(
            err(17, a3b),
            "`args->n_tokens` 17: the kernels take 1..=16 tokens a launch; split larger batches"
        );
        assert!(err(0, a3b).starts_with("`args->n_tokens` 0:"));
    }
}
