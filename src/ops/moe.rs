//! The MoE block of Qwen3.5 / Qwen3.6-35B-A3B for decode batches of 1..`max_tokens` tokens, on
//! the Triton modules `moe_router`, `moe_route`, `moe_gate_up`, `moe_down` and `moe_combine`
//! (kernels/triton/moe.py), with a CPU reference. A single token skips `moe_route`: the router
//! launch's last program routes it. [`moe_forward_add_norm`] ends with
//! `moe_combine_norm` instead: the decoder layer's residual add and next RMSNorm in the same
//! launch as the combination.
//!
//! `p = softmax(x W_r^T)`, the top `top_k` divided by their sum; each chosen expert computes
//! `down(silu(gate(x)) * up(x))`; the output is `sum_i p_i expert_i(x)` plus
//! `sigmoid(x w_g) * shared_expert(x)`. Rounding to bf16 follows transformers in a bf16 model:
//! logits, routing weights, gate, up, silu(gate), their product, each expert's down output, its
//! product with the weight, the running sum over experts in ascending expert order, the shared
//! expert's outputs, its gate, the gated product and the final sum.
//!
//! Only the chosen experts' weights are read, each once per launch whichever tokens chose it.
//!
//! Weights (row-major, as transformers stores them): `router [experts, hidden]`,
//! `shared_gate [hidden]`, `gate_up [experts, 2 * inter, hidden]` (gate rows first),
//! `down [experts, hidden, inter]`, `shared_gate_up [2 * inter, hidden]` (the shared expert's
//! gate_proj rows then up_proj rows), `shared_down [hidden, inter]`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::launch::{check_len, check_view, dev_mut, DevMut, DevRef, OpsError};
use super::triton::{TritonArg, TritonKernel};
use crate::dispatch::LoadedKernels;

pub const MODULE_ROUTER: &str = "moe_router";
pub const MODULE_ROUTE: &str = "moe_route";
pub const MODULE_GATE_UP: &str = "moe_gate_up";
pub const MODULE_DOWN: &str = "moe_down";
pub const MODULE_COMBINE: &str = "moe_combine";
pub const MODULE_COMBINE_NORM: &str = "moe_combine_norm";
pub const ENTRY_ROUTER: &str = "moe_router_logits";
pub const ENTRY_ROUTE: &str = "moe_route";
pub const ENTRY_GATE_UP: &str = "moe_gate_up";
pub const ENTRY_DOWN: &str = "moe_down";
pub const ENTRY_COMBINE: &str = "moe_combine";
pub const ENTRY_COMBINE_NORM: &str = "moe_combine_norm";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[
    (MODULE_ROUTER, ENTRY_ROUTER),
    (MODULE_ROUTE, ENTRY_ROUTE),
    (MODULE_GATE_UP, ENTRY_GATE_UP),
    (MODULE_DOWN, ENTRY_DOWN),
    (MODULE_COMBINE, ENTRY_COMBINE),
    (MODULE_COMBINE_NORM, ENTRY_COMBINE_NORM),
];

/// Programs per SM of the grid-stride `moe_down`: enough blocks resident to keep each SM's share of
/// the weight stream in flight (with 32-output items on the H200, 16 against 8: 32.8 against 36.7
/// us a call at 8 tokens, the same at 1; `scripts/bench/triton_sweep.py`).
const PROGRAMS_PER_SM: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Intermediate size of each expert and of the shared expert.
    pub inter: usize,
}

impl MoeShape {
    /// Qwen3.5 / Qwen3.6-35B-A3B: hidden 2048, 256 experts, top 8, intermediate 512.
    pub const QWEN3_5_A3B: MoeShape = MoeShape {
        hidden: 2048,
        experts: 256,
        top_k: 8,
        inter: 512,
    };
}

/// One MoE block's weights on the device.
pub struct MoeLayer<'a> {
    pub router: &'a CudaSlice<bf16>,
    pub shared_gate: &'a CudaSlice<bf16>,
    pub gate_up: &'a CudaSlice<bf16>,
    pub down: &'a CudaSlice<bf16>,
    pub shared_gate_up: &'a CudaSlice<bf16>,
    pub shared_down: &'a CudaSlice<bf16>,
}

/// Buffers between the launches; after [`moe_forward`] they hold the routing it used.
pub struct MoeScratch {
    pub max_tokens: usize,
    /// `[tokens, experts + 1]`: the router logits and, last, the shared gate's logit.
    pub logits: CudaSlice<bf16>,
    /// `[tokens, top_k]`, in descending probability.
    pub topk_ids: CudaSlice<i32>,
    pub topk_weights: CudaSlice<bf16>,
    /// The distinct chosen experts, ascending, and how many (`n_experts[0]`).
    pub experts: CudaSlice<i32>,
    pub n_experts: CudaSlice<i32>,
    /// `[experts]` and `[1]`: the routing launch's marks of the chosen experts and its count of
    /// routed tokens, through which the last token's program finds the distinct experts. A single
    /// token is routed in the router launch, whose programs count themselves in `arrived` instead.
    /// Zero between launches (each launch leaves them so); they must hold zeros before the first.
    pub chosen: CudaSlice<i32>,
    pub arrived: CudaSlice<i32>,
    /// `[tokens * top_k + tokens, inter]`: each (token, expert) pair's `silu(gate) * up`, then the shared expert's.
    pub h: CudaSlice<bf16>,
    /// `[tokens * top_k + tokens, hidden]`: each pair's down output times its routing weight, then
    /// the shared expert's times its gate (rows as in `h`), summed in expert order into the output.
    pub y: CudaSlice<bf16>,
}

impl MoeScratch {
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: &MoeShape,
        max_tokens: usize,
    ) -> Result<Self, OpsError> {
        let driver = |source| OpsError::Driver {
            op: "moe scratch",
            source,
        };
        let pairs = max_tokens * shape.top_k;
        Ok(MoeScratch {
            max_tokens,
            logits: stream
                .alloc_zeros(max_tokens * (shape.experts + 1))
                .map_err(driver)?,
            topk_ids: stream.alloc_zeros(pairs).map_err(driver)?,
            topk_weights: stream.alloc_zeros(pairs).map_err(driver)?,
            experts: stream.alloc_zeros(pairs.max(1)).map_err(driver)?,
            n_experts: stream.alloc_zeros(1).map_err(driver)?,
            chosen: stream.alloc_zeros(shape.experts).map_err(driver)?,
            arrived: stream.alloc_zeros(1).map_err(driver)?,
            h: stream
                .alloc_zeros((pairs + max_tokens) * shape.inter)
                .map_err(driver)?,
            y: stream
                .alloc_zeros((pairs + max_tokens) * shape.hidden)
                .map_err(driver)?,
        })
    }
}

fn shape_err(message: String) -> OpsError {
    OpsError::Shape {
        op: "moe_forward",
        message,
    }
}

fn grid(what: &str, n: usize) -> Result<u32, OpsError> {
    u32::try_from(n)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| shape_err(format!("{what} = {n} is not a launchable grid size")))
}

/// The residual add and RMSNorm that follow the MoE block in a decoder layer, for
/// [`moe_forward_add_norm`].
pub struct MoeAddNorm<'a> {
    /// `[n_tokens, hidden]`, the residual stream: `r = bf16(residual + moe)` is written back.
    pub residual: DevMut<'a, bf16>,
    /// `[hidden]`, the next norm's weight.
    pub weight: DevRef<'a, bf16>,
    pub eps: f32,
    /// 1 for the zero-centred norms of Qwen3.5/3.6 (`* (1 + w)`), 0 for `* w`.
    pub weight_offset: f32,
    /// `[n_tokens, hidden]`: `bf16((w + weight_offset) * bf16(r * rsqrt(mean(r^2) + eps)))`.
    pub normed: DevMut<'a, bf16>,
}

/// What the block's last launch does with its output.
enum Output<'a, 'b> {
    /// Writes it (`moe_combine`).
    Plain(&'b mut CudaSlice<bf16>),
    /// Adds it to the residual stream and norms the sum (`moe_combine_norm`).
    AddNorm(MoeAddNorm<'a>),
}

/// The MoE block for `n_tokens` rows of `x` (`[n_tokens, hidden]`) into `out` (`[n_tokens, hidden]`).
pub fn moe_forward(
    kernels: &LoadedKernels,
    shape: &MoeShape,
    layer: &MoeLayer<'_>,
    x: &CudaSlice<bf16>,
    n_tokens: usize,
    scratch: &mut MoeScratch,
    out: &mut CudaSlice<bf16>,
) -> Result<(), OpsError> {
    forward(
        kernels,
        shape,
        layer,
        x,
        n_tokens,
        scratch,
        Output::Plain(out),
        None,
    )
}

/// The MoE block of `x` followed by the decoder layer's residual add and next RMSNorm, the three
/// in the block's last launch (one launch fewer than [`moe_forward`] and a separate
/// `fused_add_rmsnorm`). The residual gets the same bits as that pair; the normed rows can differ
/// from `fused_add_rmsnorm`'s by an ulp where its sum of squares (another order) rounds apart.
/// `n_experts` takes the count of distinct experts (an `i32` of the caller's: an engine that logs
/// each layer's count gives each layer its own slot and needs no copy after the call); `None`
/// leaves it in `scratch.n_experts`, as [`moe_forward`] does.
#[allow(clippy::too_many_arguments)]
pub fn moe_forward_add_norm(
    kernels: &LoadedKernels,
    shape: &MoeShape,
    layer: &MoeLayer<'_>,
    x: &CudaSlice<bf16>,
    n_tokens: usize,
    scratch: &mut MoeScratch,
    add_norm: MoeAddNorm<'_>,
    n_experts: Option<DevMut<'_, i32>>,
) -> Result<(), OpsError> {
    forward(
        kernels,
        shape,
        layer,
        x,
        n_tokens,
        scratch,
        Output::AddNorm(add_norm),
        n_experts,
    )
}

#[allow(clippy::too_many_arguments)]
fn forward(
    kernels: &LoadedKernels,
    shape: &MoeShape,
    layer: &MoeLayer<'_>,
    x: &CudaSlice<bf16>,
    n_tokens: usize,
    scratch: &mut MoeScratch,
    output: Output<'_, '_>,
    n_experts: Option<DevMut<'_, i32>>,
) -> Result<(), OpsError> {
    const OP: &str = "moe_forward";
    let router = TritonKernel::load(kernels, OP, MODULE_ROUTER)?;
    let route = TritonKernel::load(kernels, OP, MODULE_ROUTE)?;
    let gate_up = TritonKernel::load(kernels, OP, MODULE_GATE_UP)?;
    let down = TritonKernel::load(kernels, OP, MODULE_DOWN)?;
    let combine = match &output {
        Output::Plain(_) => TritonKernel::load(kernels, OP, MODULE_COMBINE)?,
        Output::AddNorm(_) => TritonKernel::load(kernels, OP, MODULE_COMBINE_NORM)?,
    };
    for kernel in [&router, &route, &gate_up, &down, &combine] {
        for (name, value) in [
            ("H", shape.hidden),
            ("E", shape.experts),
            ("TOPK", shape.top_k),
            ("I", shape.inter),
        ] {
            if kernel.record.constexpr(name).is_some() {
                kernel.expect(OP, name, value)?;
            }
        }
    }
    let max_tokens = route.constexpr(OP, "MAX_TOKENS")?;
    for kernel in [&router, &gate_up, &down, &combine] {
        if kernel.record.constexpr("MAX_TOKENS").is_some() {
            kernel.expect(OP, "MAX_TOKENS", max_tokens)?;
        }
    }
    if n_tokens == 0 || n_tokens > max_tokens {
        return Err(shape_err(format!(
            "{n_tokens} tokens: the kernels take 1..={max_tokens} per call (split larger batches)"
        )));
    }
    if n_tokens > scratch.max_tokens {
        return Err(shape_err(format!(
            "the scratch holds {} tokens, the call has {n_tokens}",
            scratch.max_tokens
        )));
    }
    let (h, e, kk, i) = (shape.hidden, shape.experts, shape.top_k, shape.inter);
    check_len(OP, "x", x, &[n_tokens, h])?;
    match &output {
        Output::Plain(out) => check_len(OP, "out", out, &[n_tokens, h])?,
        Output::AddNorm(a) => {
            check_view(OP, "residual", a.residual.len(), &[n_tokens, h])?;
            check_view(OP, "normed", a.normed.len(), &[n_tokens, h])?;
            check_view(OP, "norm weight", a.weight.len(), &[h])?;
        }
    }
    check_len(OP, "router", layer.router, &[e, h])?;
    check_len(OP, "shared_gate", layer.shared_gate, &[h])?;
    check_len(OP, "gate_up", layer.gate_up, &[e, 2 * i, h])?;
    check_len(OP, "down", layer.down, &[e, h, i])?;
    check_len(OP, "shared_gate_up", layer.shared_gate_up, &[2 * i, h])?;
    check_len(OP, "shared_down", layer.shared_down, &[h, i])?;
    check_len(OP, "scratch.logits", &scratch.logits, &[n_tokens, e + 1])?;
    check_len(OP, "scratch.topk_ids", &scratch.topk_ids, &[n_tokens, kk])?;
    check_len(
        OP,
        "scratch.topk_weights",
        &scratch.topk_weights,
        &[n_tokens, kk],
    )?;
    check_len(OP, "scratch.experts", &scratch.experts, &[n_tokens, kk])?;
    check_len(OP, "scratch.chosen", &scratch.chosen, &[e])?;
    check_len(OP, "scratch.arrived", &scratch.arrived, &[1])?;
    let mut n_experts = match n_experts {
        Some(v) => v,
        None => dev_mut(kernels, &mut scratch.n_experts),
    };
    if n_experts.is_empty() {
        return Err(shape_err(
            "n_experts is empty: it needs room for one i32".into(),
        ));
    }
    check_len(OP, "scratch.h", &scratch.h, &[n_tokens * (kk + 1), i])?;
    check_len(OP, "scratch.y", &scratch.y, &[n_tokens * (kk + 1), h])?;
    let tokens = n_tokens as i32;

    // A single token is routed by the router's last program (moe_route's code, so the same ids and
    // weights): one launch fewer a layer (docs/engine.md). The kernel's fold routes token 0 only;
    // more tokens take moe_route, a program each side by side.
    let route_in_router = n_tokens == 1;
    router.launch(
        OP,
        (
            grid(
                "router programs",
                (e + 1).div_ceil(router.constexpr(OP, "BLOCK_E")?),
            )?,
            1,
            1,
        ),
        &mut [
            TritonArg::Bf16(x),
            TritonArg::Bf16(layer.router),
            TritonArg::Bf16(layer.shared_gate),
            TritonArg::Bf16Mut(&mut scratch.logits),
            TritonArg::I32Mut(&mut scratch.topk_ids),
            TritonArg::Bf16Mut(&mut scratch.topk_weights),
            TritonArg::I32Mut(&mut scratch.experts),
            TritonArg::I32ViewMut(n_experts.reborrow()),
            // Zero before (each launch that counts in it leaves it so); the fold leaves it zero.
            TritonArg::I32Mut(&mut scratch.arrived),
            TritonArg::ScalarI32(tokens),
            TritonArg::ScalarI32(i32::from(route_in_router)),
        ],
    )?;
    if !route_in_router {
        // One program a token; the last to finish lists the distinct experts.
        route.launch(
            OP,
            (grid("route programs", n_tokens)?, 1, 1),
            &mut [
                TritonArg::Bf16(&scratch.logits),
                TritonArg::I32Mut(&mut scratch.topk_ids),
                TritonArg::Bf16Mut(&mut scratch.topk_weights),
                TritonArg::I32Mut(&mut scratch.experts),
                TritonArg::I32ViewMut(n_experts.reborrow()),
                TritonArg::I32Mut(&mut scratch.chosen),
                TritonArg::I32Mut(&mut scratch.arrived),
                TritonArg::ScalarI32(tokens),
            ],
        )?;
    }
    // One slot per possible distinct expert, then the shared expert's.
    let slots = n_tokens * kk + 1;
    gate_up.launch(
        OP,
        (
            grid("expert slots", slots)?,
            grid(
                "gate/up blocks",
                i.div_ceil(gate_up.constexpr(OP, "BLOCK_N")?),
            )?,
            1,
        ),
        &mut [
            TritonArg::Bf16(x),
            TritonArg::Bf16(layer.gate_up),
            TritonArg::Bf16(layer.shared_gate_up),
            TritonArg::I32(&scratch.topk_ids),
            TritonArg::I32(&scratch.experts),
            TritonArg::I32View(n_experts.as_ref()),
            TritonArg::Bf16Mut(&mut scratch.h),
            TritonArg::ScalarI32(tokens),
        ],
    )?;
    // Work items are (expert slot, output block): at most every slot's, taken grid-stride by a few
    // programs per SM (the kernel reads how many experts were chosen).
    let items = slots * h.div_ceil(down.constexpr(OP, "BLOCK_N")?);
    let programs = PROGRAMS_PER_SM * kernels.sm_count();
    down.launch(
        OP,
        (grid("down programs", items.min(programs))?, 1, 1),
        &mut [
            TritonArg::Bf16(&scratch.h),
            TritonArg::Bf16(layer.down),
            TritonArg::Bf16(layer.shared_down),
            TritonArg::I32(&scratch.topk_ids),
            TritonArg::Bf16(&scratch.topk_weights),
            TritonArg::I32(&scratch.experts),
            TritonArg::I32View(n_experts.as_ref()),
            TritonArg::Bf16(&scratch.logits),
            TritonArg::Bf16Mut(&mut scratch.y),
            TritonArg::ScalarI32(tokens),
        ],
    )?;
    match output {
        Output::Plain(out) => combine.launch(
            OP,
            (
                grid(
                    "combine blocks",
                    h.div_ceil(combine.constexpr(OP, "BLOCK_C")?),
                )?,
                1,
                1,
            ),
            &mut [
                TritonArg::Bf16(&scratch.y),
                TritonArg::I32(&scratch.topk_ids),
                TritonArg::Bf16Mut(out),
                TritonArg::ScalarI32(tokens),
            ],
        ),
        // One program a token: the norm needs its whole row.
        Output::AddNorm(a) => combine.launch(
            OP,
            (grid("combine rows", n_tokens)?, 1, 1),
            &mut [
                TritonArg::Bf16(&scratch.y),
                TritonArg::I32(&scratch.topk_ids),
                TritonArg::Bf16ViewMut(a.residual),
                TritonArg::Bf16View(a.weight),
                TritonArg::Bf16ViewMut(a.normed),
                TritonArg::ScalarI32(tokens),
                TritonArg::ScalarF32(a.eps),
                TritonArg::ScalarF32(a.weight_offset),
            ],
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// CPU reference (float64 dot products, bf16 rounding where transformers rounds).

/// The block's weights on the host, in the device layouts.
#[derive(Debug, Clone)]
pub struct MoeWeightsHost {
    pub router: Vec<bf16>,
    pub shared_gate: Vec<bf16>,
    pub gate_up: Vec<bf16>,
    pub down: Vec<bf16>,
    pub shared_gate_up: Vec<bf16>,
    pub shared_down: Vec<bf16>,
}

/// What the reference computed: the routing and the output.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeReference {
    /// `[tokens, experts + 1]` bf16 logits (the last column is the shared gate's).
    pub logits: Vec<bf16>,
    /// `[tokens, top_k]`, descending probability, ties to the lower index.
    pub topk_ids: Vec<i32>,
    pub topk_weights: Vec<bf16>,
    pub out: Vec<bf16>,
    /// Per output element, the largest magnitude its chain of bf16 roundings passed through (each
    /// weighted expert output, each partial sum, the shared expert's term, the result). A rounding
    /// that lands the other way at one step (another fp32 summation order) moves the result by an
    /// ulp of that step's value, which under cancellation is many ulps of the result: compare at
    /// this scale (`[tokens, hidden]`).
    pub out_chain: Vec<f32>,
}

fn round(x: f64) -> f64 {
    f64::from(bf16::from_f64(x).to_f32())
}

fn dot(w: &[bf16], x: &[bf16]) -> f64 {
    w.iter()
        .zip(x)
        .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
        .sum()
}

/// `bf16(down(bf16(bf16(silu(bf16(gate x))) * bf16(up x))))` of one expert for one token.
fn expert(x: &[bf16], gate_up: &[bf16], down: &[bf16], h: usize, i: usize) -> Vec<f64> {
    let act: Vec<bf16> = (0..i)
        .map(|n| {
            let g = round(dot(&gate_up[n * h..(n + 1) * h], x));
            let u = round(dot(&gate_up[(i + n) * h..(i + n + 1) * h], x));
            bf16::from_f64(round(g / (1.0 + (-g).exp())) * u)
        })
        .collect();
    (0..h)
        .map(|n| round(dot(&down[n * i..(n + 1) * i], &act)))
        .collect()
}

/// The routing of one token from its bf16 router logits (the experts' only, not the shared
/// gate's): `p = softmax(logits)`, the `top_k` largest (ties to the lower index) and their
/// weights `bf16(p / sum of the chosen p)`.
pub fn route(logits: &[bf16], top_k: usize) -> (Vec<usize>, Vec<bf16>) {
    let l: Vec<f64> = logits.iter().map(|v| f64::from(v.to_f32())).collect();
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = l.iter().map(|v| (v - max).exp()).collect();
    let mut order: Vec<usize> = (0..l.len()).collect();
    // Descending probability, ties to the lower index (a stable sort keeps index order).
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    order.truncate(top_k);
    let sum: f64 = order.iter().map(|&j| p[j]).sum();
    let weights = order.iter().map(|&j| bf16::from_f64(p[j] / sum)).collect();
    (order, weights)
}

/// The router logits of `x` `[tokens, hidden]`: `[tokens, experts + 1]` bf16, the shared gate's
/// last, each `bf16(w . x)` of a float64 dot product.
pub fn moe_router_logits_reference(shape: &MoeShape, w: &MoeWeightsHost, x: &[bf16]) -> Vec<bf16> {
    let (h, e) = (shape.hidden, shape.experts);
    x.chunks_exact(h)
        .flat_map(|xt| {
            (0..e)
                .map(|j| bf16::from_f64(dot(&w.router[j * h..(j + 1) * h], xt)))
                .chain(std::iter::once(bf16::from_f64(dot(&w.shared_gate, xt))))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reference of [`moe_forward`] for `x` `[tokens, hidden]`.
pub fn moe_reference(shape: &MoeShape, w: &MoeWeightsHost, x: &[bf16]) -> MoeReference {
    let logits = moe_router_logits_reference(shape, w, x);
    moe_reference_from_logits(shape, w, x, &logits)
}

/// [`moe_reference`] from the router logits `[tokens, experts + 1]` given (the shared gate's
/// last): the routing and the output that follow from them. A GPU check feeds it the kernel's own
/// logits, so that a logit one bf16 ulp off (another summation order, within the logits' own
/// check) is not counted again in the weights and the output it moves by several ulps.
pub fn moe_reference_from_logits(
    shape: &MoeShape,
    w: &MoeWeightsHost,
    x: &[bf16],
    logits: &[bf16],
) -> MoeReference {
    let (h, e, kk, i) = (shape.hidden, shape.experts, shape.top_k, shape.inter);
    let tokens = x.len() / h;
    let mut topk_ids = Vec::with_capacity(tokens * kk);
    let mut topk_weights = Vec::with_capacity(tokens * kk);
    let mut out = Vec::with_capacity(tokens * h);
    let mut out_chain = Vec::with_capacity(tokens * h);
    for t in 0..tokens {
        let xt = &x[t * h..(t + 1) * h];
        let row = &logits[t * (e + 1)..(t + 1) * (e + 1)];
        let (chosen, weights) = route(&row[..e], kk);
        // Sum over experts in ascending expert order, in bf16, as transformers' index_add_ loop.
        let mut by_expert: Vec<(usize, bf16)> = chosen
            .iter()
            .copied()
            .zip(weights.iter().copied())
            .collect();
        by_expert.sort_by_key(|&(j, _)| j);
        let mut acc = vec![0.0f64; h];
        let mut chain = vec![0.0f64; h];
        for (j, weight) in by_expert {
            let y = expert(
                xt,
                &w.gate_up[j * 2 * i * h..(j + 1) * 2 * i * h],
                &w.down[j * h * i..(j + 1) * h * i],
                h,
                i,
            );
            for ((a, c), v) in acc.iter_mut().zip(&mut chain).zip(y) {
                let term = round(v * f64::from(weight.to_f32()));
                *a = round(*a + term);
                *c = c.max(term.abs()).max(a.abs());
            }
        }
        let shared = expert(xt, &w.shared_gate_up, &w.shared_down, h, i);
        let g = f64::from(row[e].to_f32());
        let gate = round(1.0 / (1.0 + (-g).exp()));
        for ((a, c), s) in acc.iter().zip(&chain).zip(shared) {
            let term = round(s * gate);
            let o = bf16::from_f64(a + term);
            out.push(o);
            out_chain.push(c.max(term.abs()).max(f64::from(o.to_f32().abs())) as f32);
        }
        topk_ids.extend(chosen.iter().map(|&j| j as i32));
        topk_weights.extend(weights);
    }
    MoeReference {
        logits: logits.to_vec(),
        topk_ids,
        topk_weights,
        out,
        out_chain,
    }
}

/// The smallest gap, over tokens, between the `top_k`-th and the next bf16 router logit, in
/// units of the bf16 spacing at that size. Tests redraw inputs whose gap is too small for the
/// choice of experts to be certain under a different summation order.
pub fn routing_margin_ulps(shape: &MoeShape, logits: &[bf16]) -> u32 {
    let e = shape.experts;
    logits
        .chunks(e + 1)
        .map(|row| {
            let mut l: Vec<bf16> = row[..e].to_vec();
            l.sort_by(|a, b| b.to_f32().total_cmp(&a.to_f32()));
            super::compare::ulp_distance(l[shape.top_k - 1], l[shape.top_k])
        })
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const SMALL: MoeShape = MoeShape {
        hidden: 32,
        experts: 16,
        top_k: 4,
        inter: 8,
    };

    fn bf(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
            .collect()
    }

    fn weights(rng: &mut impl Rng, s: &MoeShape) -> MoeWeightsHost {
        let (h, e, i) = (s.hidden, s.experts, s.inter);
        MoeWeightsHost {
            router: bf(rng, e * h, 0.5),
            shared_gate: bf(rng, h, 0.5),
            gate_up: bf(rng, e * 2 * i * h, 0.3),
            down: bf(rng, e * h * i, 0.3),
            shared_gate_up: bf(rng, 2 * i * h, 0.3),
            shared_down: bf(rng, h * i, 0.3),
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn routing_picks_the_largest_logits_and_weights_sum_to_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let s = SMALL;
        let w = weights(&mut rng, &s);
        let x = bf(&mut rng, 3 * s.hidden, 2.0);
        let r = moe_reference(&s, &w, &x);
        for t in 0..3 {
            let row = &r.logits[t * (s.experts + 1)..(t + 1) * (s.experts + 1)];
            let ids = &r.topk_ids[t * s.top_k..(t + 1) * s.top_k];
            let min_chosen = ids
                .iter()
                .map(|&j| row[j as usize].to_f32())
                .fold(f32::INFINITY, f32::min);
            for j in 0..s.experts {
                if !ids.contains(&(j as i32)) {
                    assert!(
                        row[j].to_f32() <= min_chosen,
                        "token {t}: expert {j} beats a chosen one"
                    );
                }
            }
            let sum: f32 = r.topk_weights[t * s.top_k..(t + 1) * s.top_k]
                .iter()
                .map(|v| v.to_f32())
                .sum();
            assert!((sum - 1.0).abs() < 0.02, "token {t}: weights sum to {sum}");
        }
        // The rounding chain's scale covers the result, and is reached by some step.
        assert_eq!(r.out_chain.len(), r.out.len());
        for (c, o) in r.out_chain.iter().zip(&r.out) {
            assert!(
                *c >= o.to_f32().abs() && c.is_finite(),
                "chain {c} below |out| {o}"
            );
        }
        assert!(
            r.out_chain
                .iter()
                .zip(&r.out)
                .any(|(c, o)| *c > o.to_f32().abs()),
            "no partial sum above its result in {} outputs",
            r.out.len()
        );
    }

    #[test]
    fn unchosen_experts_weights_are_never_used() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let s = SMALL;
        let w = weights(&mut rng, &s);
        let x = bf(&mut rng, 2 * s.hidden, 2.0);
        let clean = moe_reference(&s, &w, &x);
        let mut poisoned = w.clone();
        let (h, i) = (s.hidden, s.inter);
        for j in 0..s.experts {
            if !clean.topk_ids.contains(&(j as i32)) {
                poisoned.gate_up[j * 2 * i * h..(j + 1) * 2 * i * h].fill(bf16::NAN);
                poisoned.down[j * h * i..(j + 1) * h * i].fill(bf16::NAN);
            }
        }
        assert_eq!(moe_reference(&s, &poisoned, &x), clean);
        assert!(
            clean.out.iter().all(|v| v.is_finite()) && clean.out.iter().any(|v| v.to_f32() != 0.0)
        );
    }

    #[test]
    fn shared_expert_is_gated_by_the_sigmoid_of_its_logit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let s = SMALL;
        let w = weights(&mut rng, &s);
        let x = bf(&mut rng, s.hidden, 2.0);
        // A shared gate weight along x makes the logit x.x * c: c = -100 closes the gate
        // (sigmoid underflows to 0 in bf16), c = +100 opens it fully (sigmoid = 1).
        let xx = dot(&x, &x);
        let along = |c: f64| -> Vec<bf16> {
            x.iter()
                .map(|v| bf16::from_f64(f64::from(v.to_f32()) * c / xx))
                .collect()
        };
        let mut no_shared = w.clone();
        no_shared.shared_down.fill(bf16::ZERO);
        let base = moe_reference(&s, &no_shared, &x).out;
        let closed = moe_reference(
            &s,
            &MoeWeightsHost {
                shared_gate: along(-100.0),
                ..w.clone()
            },
            &x,
        );
        assert_eq!(closed.out, base, "a closed gate removes the shared expert");
        let open = moe_reference(
            &s,
            &MoeWeightsHost {
                shared_gate: along(100.0),
                ..w.clone()
            },
            &x,
        );
        let shared = expert(&x, &w.shared_gate_up, &w.shared_down, s.hidden, s.inter);
        let want: Vec<bf16> = base
            .iter()
            .zip(&shared)
            .map(|(b, sh)| bf16::from_f64(f64::from(b.to_f32()) + sh))
            .collect();
        assert_eq!(
            open.out, want,
            "an open gate adds the shared expert's output"
        );
        assert_ne!(open.out, base);
    }
}
