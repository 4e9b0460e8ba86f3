//! The Qwen3.5/3.6 MoE weights on the GPU, in the layout the kernels read.
//!
//! A gated attention layer's `q_proj` (`[heads][query (d) | gate (d)]` rows), `k_proj` and
//! `v_proj` become one projection whose output row is `[queries | keys | values | gates]`: the
//! first three parts as the fused decode attention kernel reads a dense model's `[q | k | v]`,
//! the gates after them for the output gate. RoPE on the leading `rotary_dim` dims of a head
//! (partial RoPE) runs on the kernels' full-head rotation, which pairs dim `j` with `j + d/2`,
//! through a permutation of the query and key dims ([`rope_permutation`]): the rotated pairs
//! `(i, i + r/2)` move to `(i, i + d/2)`, the dims RoPE leaves alone fill the rest, and the RoPE
//! table ([`partial_rope_table`]) gives those cos 1 and sin 0, which leaves them exact. Queries and
//! keys are permuted alike (the norm weights with them), so every score `q . k` is the model's;
//! values keep their order, so the attention output is in the model's dims.

use aot_kernels::device::CudaSlice;
use aot_kernels::dispatch::LoadedKernels;
use half::bf16;

use super::dev_err;
use super::weights::fill;
use crate::model::qwen3_5_moe::{tensor_table, HybridLayer, Qwen35MoeConfig};
use crate::model::Role;
use crate::runner::RunnerError;
use crate::weights::Weights;

/// `perm[n]`: the model's dim that the kernels' dim `n` of a head holds, for RoPE on the leading
/// `rot` of `d` dims. The identity when `rot == d`.
pub fn rope_permutation(d: usize, rot: usize) -> Vec<usize> {
    assert!(rot <= d && rot.is_multiple_of(2) && d.is_multiple_of(2));
    let (half, rhalf) = (d / 2, rot / 2);
    let mut perm = vec![0; d];
    let mut pass = rot..d;
    for (n, p) in perm.iter_mut().enumerate() {
        *p = if n < rhalf {
            n
        } else if (half..half + rhalf).contains(&n) {
            n - half + rhalf
        } else {
            pass.next().expect("d - rot dims pass through")
        };
    }
    perm
}

/// The RoPE table `[max_position][d]` (cos half, then sin half) that rotates the pairs
/// `(i, i + d/2)` of a permuted head like the model's pairs `(i, i + rot/2)`, `i < rot/2`, with
/// the model's frequencies (those of a `rot`-dim rotary table), and leaves the others alone.
pub fn partial_rope_table(max_position: usize, d: usize, rot: usize, theta: f64) -> Vec<f32> {
    let rotary = aot_kernels::ops::rotary::cos_sin_cache(max_position, rot, theta);
    let (half, rhalf) = (d / 2, rot / 2);
    let mut table = Vec::with_capacity(max_position * d);
    for row in rotary.chunks_exact(rot.max(1)).take(max_position) {
        let (cos, sin) = row.split_at(rhalf);
        table.extend(cos);
        table.extend(std::iter::repeat_n(1.0f32, half - rhalf));
        table.extend(sin);
        table.extend(std::iter::repeat_n(0.0f32, half - rhalf));
    }
    table
}

/// Where a tensor of an attention layer lands in its fused buffer: runs of `(first row, rows)`
/// in the buffer, in the order of the reordered source rows [`attention_rows`] returns.
fn attention_rows(
    c: &Qwen35MoeConfig,
    role: Role,
    values: &[bf16],
    perm: &[usize],
) -> Vec<(usize, Vec<bf16>)> {
    let (d, nh, kv, h) = (
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.hidden_size,
    );
    let row = |r: usize| &values[r * h..(r + 1) * h];
    match role {
        Role::QProj => {
            let mut queries = Vec::with_capacity(nh * d * h);
            let mut gates = Vec::with_capacity(nh * d * h);
            for head in 0..nh {
                for &j in perm {
                    queries.extend_from_slice(row(head * 2 * d + j));
                }
                for e in 0..d {
                    gates.extend_from_slice(row(head * 2 * d + d + e));
                }
            }
            vec![(0, queries), ((nh + 2 * kv) * d, gates)]
        }
        Role::KProj => {
            let mut keys = Vec::with_capacity(kv * d * h);
            for g in 0..kv {
                for &j in perm {
                    keys.extend_from_slice(row(g * d + j));
                }
            }
            vec![(nh * d, keys)]
        }
        Role::VProj => vec![((nh + kv) * d, values.to_vec())],
        Role::QNorm | Role::KNorm => vec![(0, perm.iter().map(|&j| values[j]).collect())],
        _ => unreachable!("attention_rows is called for q, k, v and their norms"),
    }
}

pub struct LinearWeights {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a` one after another (rows
    /// [`in_proj_widths`]): decode reads them in one GEMV, prefill one GEMM each.
    pub in_proj: CudaSlice<bf16>,
    /// `[conv_dim, kernel]`.
    pub conv: CudaSlice<bf16>,
    pub a_log: CudaSlice<f32>,
    pub dt_bias: CudaSlice<f32>,
    pub norm: CudaSlice<bf16>,
    pub out: CudaSlice<bf16>,
    /// This layer's index among the linear layers (its place in the state pools).
    pub state_layer: usize,
}

/// The rows of a DeltaNet layer's `in_proj_qkv`, `z`, `b` and `a`, in their order in
/// [`LinearWeights::in_proj`].
pub fn in_proj_widths(c: &Qwen35MoeConfig) -> [usize; 4] {
    let nv = c.linear_num_value_heads;
    [c.conv_dim(), c.linear_value_dim(), nv, nv]
}

/// Where a DeltaNet input projection starts in [`LinearWeights::in_proj`] (elements).
fn in_proj_offset(c: &Qwen35MoeConfig, role: Role) -> usize {
    let part = match role {
        Role::GdnInProjZ => 1,
        Role::GdnInProjB => 2,
        Role::GdnInProjA => 3,
        _ => 0,
    };
    in_proj_widths(c)[..part].iter().sum::<usize>() * c.hidden_size
}

pub struct AttentionWeights {
    /// `[queries | keys | values | gates]` rows (queries and keys in the permuted dims).
    pub qkvg: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub q_norm: CudaSlice<bf16>,
    pub k_norm: CudaSlice<bf16>,
    /// This layer's index among the attention layers (its place in the KV cache).
    pub cache_layer: usize,
}

// One per layer, built once and never moved: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum MixerWeights {
    Linear(LinearWeights),
    Attention(AttentionWeights),
}

pub struct MoeWeights {
    pub router: CudaSlice<bf16>,
    /// `shared_expert_gate`, `[hidden]`.
    pub shared_gate: CudaSlice<bf16>,
    /// `[experts, 2 * inter, hidden]`, gate rows first.
    pub gate_up: CudaSlice<bf16>,
    /// `[experts, hidden, inter]`.
    pub down: CudaSlice<bf16>,
    /// The shared expert's `[gate; up]`, `[2 * shared_inter, hidden]`.
    pub shared_gate_up: CudaSlice<bf16>,
    pub shared_down: CudaSlice<bf16>,
}

pub struct HybridLayerWeights {
    pub input_norm: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    pub mixer: MixerWeights,
    pub moe: MoeWeights,
}

pub struct HybridWeights {
    pub embed: CudaSlice<bf16>,
    pub lm_head: Option<CudaSlice<bf16>>,
    pub final_norm: CudaSlice<bf16>,
    pub layers: Vec<HybridLayerWeights>,
    pub bytes: usize,
}

impl HybridWeights {
    pub fn lm_head(&self) -> &CudaSlice<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Allocates every buffer and fills it from `weights`; `progress` is told each tensor's bytes.
pub fn upload(
    kernels: &LoadedKernels,
    c: &Qwen35MoeConfig,
    weights: &Weights,
    progress: &mut dyn FnMut(usize),
) -> Result<HybridWeights, RunnerError> {
    let s = kernels.stream();
    let bf = |n: usize, what: &str| -> Result<CudaSlice<bf16>, RunnerError> {
        // SAFETY: every element is written below before any kernel reads it.
        unsafe { s.alloc::<bf16>(n.max(1)) }.map_err(dev_err(what))
    };
    let f32s = |n: usize, what: &str| s.alloc_zeros::<f32>(n.max(1)).map_err(dev_err(what));
    let (h, d) = (c.hidden_size, c.head_dim);
    let (e, inter, shared) = (
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    );
    let (nv, vw) = (c.linear_num_value_heads, c.linear_value_dim());
    let (mut cache_layer, mut state_layer) = (0, 0);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for kind in &c.layer_types {
        let mixer = match kind {
            HybridLayer::LinearAttention => {
                state_layer += 1;
                MixerWeights::Linear(LinearWeights {
                    in_proj: bf(
                        in_proj_widths(c).iter().sum::<usize>() * h,
                        "in_proj_qkv/z/b/a",
                    )?,
                    conv: bf(c.conv_dim() * c.linear_conv_kernel_dim, "conv1d")?,
                    a_log: f32s(nv, "A_log")?,
                    dt_bias: f32s(nv, "dt_bias")?,
                    norm: bf(c.linear_value_head_dim, "linear norm")?,
                    out: bf(h * vw, "out_proj")?,
                    state_layer: state_layer - 1,
                })
            }
            HybridLayer::FullAttention => {
                cache_layer += 1;
                MixerWeights::Attention(AttentionWeights {
                    qkvg: bf(
                        (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * d * h,
                        "q/k/v projection",
                    )?,
                    o: bf(h * c.q_dim(), "o_proj")?,
                    q_norm: bf(d, "q_norm")?,
                    k_norm: bf(d, "k_norm")?,
                    cache_layer: cache_layer - 1,
                })
            }
        };
        layers.push(HybridLayerWeights {
            input_norm: bf(h, "input norm")?,
            post_norm: bf(h, "post-attention norm")?,
            mixer,
            moe: MoeWeights {
                router: bf(e * h, "router")?,
                shared_gate: bf(h, "shared expert gate")?,
                gate_up: bf(e * 2 * inter * h, "experts' gate_up")?,
                down: bf(e * h * inter, "experts' down")?,
                shared_gate_up: bf(2 * shared * h, "shared expert gate_up")?,
                shared_down: bf(h * shared, "shared expert down")?,
            },
        });
    }
    let mut dw = HybridWeights {
        embed: bf(c.vocab_size * h, "embedding")?,
        lm_head: if c.tie_word_embeddings {
            None
        } else {
            Some(bf(c.vocab_size * h, "lm_head")?)
        },
        final_norm: bf(h, "final norm")?,
        layers,
        bytes: 0,
    };
    let perm = rope_permutation(d, c.rotary_dim);
    for (index, spec) in tensor_table(c).into_iter().enumerate() {
        let host = || {
            weights.host_tensor(&spec, index).ok_or_else(|| {
                RunnerError::Device(format!("{}: not in the loaded weights", spec.name))
            })
        };
        match spec.role {
            Role::QProj | Role::KProj | Role::VProj | Role::QNorm | Role::KNorm => {
                let t = host()?;
                let values = t.bf16();
                let dst = buffer(&mut dw, spec.role, spec.layer, &spec.name)?;
                let row_len = if matches!(spec.role, Role::QNorm | Role::KNorm) {
                    1
                } else {
                    h
                };
                for (first_row, run) in attention_rows(c, spec.role, &values, &perm) {
                    let at = first_row * row_len;
                    let mut view = dst.slice_mut(at..at + run.len());
                    s.memcpy_htod(&run, &mut view)
                        .map_err(dev_err(&spec.name))?;
                }
            }
            Role::GdnALog | Role::GdnDtBias => {
                let t = host()?;
                let values: Vec<f32> = t.bf16().iter().map(|v| v.to_f32()).collect();
                let dst = f32_buffer(&mut dw, spec.role, spec.layer, &spec.name)?;
                s.memcpy_htod(&values, dst).map_err(dev_err(&spec.name))?;
            }
            role => {
                let offset = match role {
                    Role::SharedUpProj => shared * h,
                    Role::GdnInProjZ | Role::GdnInProjB | Role::GdnInProjA => {
                        in_proj_offset(c, role)
                    }
                    _ => 0,
                };
                let dst = buffer(&mut dw, role, spec.layer, &spec.name)?;
                fill(kernels, dst, offset, &spec, weights, index)?;
            }
        }
        dw.bytes += spec.elements() * 2;
        progress(spec.elements() * 2);
    }
    s.synchronize().map_err(dev_err("uploading weights"))?;
    Ok(dw)
}

fn missing(name: &str) -> RunnerError {
    RunnerError::Device(format!(
        "{name}: no device buffer for it in this layer's kind"
    ))
}

fn buffer<'w>(
    dw: &'w mut HybridWeights,
    role: Role,
    layer: Option<usize>,
    name: &str,
) -> Result<&'w mut CudaSlice<bf16>, RunnerError> {
    let Some(l) = layer else {
        return match role {
            Role::Embed => Ok(&mut dw.embed),
            Role::FinalNorm => Ok(&mut dw.final_norm),
            Role::LmHead => dw.lm_head.as_mut().ok_or_else(|| missing(name)),
            _ => Err(missing(name)),
        };
    };
    let lw = dw.layers.get_mut(l).ok_or_else(|| missing(name))?;
    Ok(match (role, &mut lw.mixer) {
        (Role::InputNorm, _) => &mut lw.input_norm,
        (Role::PostNorm, _) => &mut lw.post_norm,
        (Role::MoeRouter, _) => &mut lw.moe.router,
        (Role::SharedExpertGate, _) => &mut lw.moe.shared_gate,
        (Role::MoeExpertsGateUp, _) => &mut lw.moe.gate_up,
        (Role::MoeExpertsDown, _) => &mut lw.moe.down,
        (Role::SharedGateProj | Role::SharedUpProj, _) => &mut lw.moe.shared_gate_up,
        (Role::SharedDownProj, _) => &mut lw.moe.shared_down,
        (
            Role::GdnInProjQkv | Role::GdnInProjZ | Role::GdnInProjB | Role::GdnInProjA,
            MixerWeights::Linear(m),
        ) => &mut m.in_proj,
        (Role::GdnConv1d, MixerWeights::Linear(m)) => &mut m.conv,
        (Role::GdnNorm, MixerWeights::Linear(m)) => &mut m.norm,
        (Role::GdnOutProj, MixerWeights::Linear(m)) => &mut m.out,
        (Role::QProj | Role::KProj | Role::VProj, MixerWeights::Attention(m)) => &mut m.qkvg,
        (Role::OProj, MixerWeights::Attention(m)) => &mut m.o,
        (Role::QNorm, MixerWeights::Attention(m)) => &mut m.q_norm,
        (Role::KNorm, MixerWeights::Attention(m)) => &mut m.k_norm,
        _ => return Err(missing(name)),
    })
}

fn f32_buffer<'w>(
    dw: &'w mut HybridWeights,
    role: Role,
    layer: Option<usize>,
    name: &str,
) -> Result<&'w mut CudaSlice<f32>, RunnerError> {
    match (
        role,
        layer
            .and_then(|l| dw.layers.get_mut(l))
            .map(|l| &mut l.mixer),
    ) {
        (Role::GdnALog, Some(MixerWeights::Linear(m))) => Ok(&mut m.a_log),
        (Role::GdnDtBias, Some(MixerWeights::Linear(m))) => Ok(&mut m.dt_bias),
        _ => Err(missing(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four projections lie end to end in the fused weight, in the order of
    /// [`in_proj_widths`], which is what the GEMV's parts epilogue assumes.
    #[test]
    fn the_in_proj_offsets_lay_the_projections_end_to_end() {
        let c = Qwen35MoeConfig::tiny();
        let h = c.hidden_size;
        let (conv, value, nv) = (c.conv_dim(), c.linear_value_dim(), c.linear_num_value_heads);
        assert_eq!(in_proj_widths(&c), [conv, value, nv, nv]);
        assert_eq!(in_proj_offset(&c, Role::GdnInProjQkv), 0);
        assert_eq!(in_proj_offset(&c, Role::GdnInProjZ), conv * h);
        assert_eq!(in_proj_offset(&c, Role::GdnInProjB), (conv + value) * h);
        assert_eq!(
            in_proj_offset(&c, Role::GdnInProjA),
            (conv + value + nv) * h
        );
        let total: usize = in_proj_widths(&c).iter().sum();
        assert_eq!(in_proj_offset(&c, Role::GdnInProjA) + nv * h, total * h);
    }

    #[test]
    fn the_permutation_moves_the_rotated_pairs_to_half_a_head_apart() {
        let perm = rope_permutation(8, 4);
        // Model pairs (0, 2) and (1, 3) rotate; 4..8 pass. Kernel pairs are (n, n + 4).
        assert_eq!(perm, vec![0, 1, 4, 5, 2, 3, 6, 7]);
        let mut sorted = rope_permutation(256, 64);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..256).collect::<Vec<_>>());
        assert_eq!(rope_permutation(128, 128), (0..128).collect::<Vec<_>>());
    }

    #[test]
    fn the_permuted_table_rotates_like_the_partial_rope_and_leaves_the_rest() {
        let (d, rot, theta) = (8, 4, 10_000.0);
        let table = partial_rope_table(3, d, rot, theta);
        let perm = rope_permutation(d, rot);
        let x: Vec<f64> = (0..d).map(|i| 0.25 * i as f64 - 0.6).collect();
        for pos in 0..3 {
            // The model's partial RoPE on x.
            let mut want = x.clone();
            for i in 0..rot / 2 {
                let a = pos as f64 * theta.powf(-(2.0 * i as f64) / rot as f64);
                want[i] = x[i] * a.cos() - x[i + rot / 2] * a.sin();
                want[i + rot / 2] = x[i + rot / 2] * a.cos() + x[i] * a.sin();
            }
            // The kernel's full-head rotation on the permuted x.
            let px: Vec<f64> = perm.iter().map(|&j| x[j]).collect();
            let row = &table[pos * d..(pos + 1) * d];
            let mut got = vec![0.0; d];
            for n in 0..d / 2 {
                let (c, s) = (f64::from(row[n]), f64::from(row[n + d / 2]));
                got[perm[n]] = px[n] * c - px[n + d / 2] * s;
                got[perm[n + d / 2]] = px[n + d / 2] * c + px[n] * s;
            }
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-6, "pos {pos}: {got:?} vs {want:?}");
            }
        }
    }
}
