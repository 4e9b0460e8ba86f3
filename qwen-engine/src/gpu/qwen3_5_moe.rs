//! The hybrid Qwen3.5/3.6 MoE forward pass on the GPU (the equations of `model::qwen3_5_moe`),
//! over the `n` rows of a pass: every sequence's rows in position order. Per layer:
//!
//! ```text
//! linear     gemv | gemm x4 in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (one GEMV in decode,
//!                           which also runs the conv and shifts the conv state)
//!            gdn            conv1d and state shift (prefill), the delta rule on the slot's state,
//!                           gated norm (token by token in decode and prefill passes alike)
//!            gemv/gemm      out_proj (+ add + norm, below)
//! attention  gemv/gemm      [queries | keys | values | gates]
//!            decode:  attention (q/k norm (1 + w), RoPE, k and v into the cache, split-KV)
//!            prefill: per sequence q/k norm, RoPE and cache write, then causal attention
//!            output_gate    o *= sigmoid(gate)
//!            gemv/gemm      o_proj (+ add + norm, below)
//! both       add + norm     h += mixer; x = rmsnorm(h) * (1 + w_post): in a decode pass the
//!                           output projection's GEMV does it (its last block applies the norm),
//!                           in a prefill pass a launch after the GEMM
//!            moe            router, top-k, the chosen experts and the shared expert (16 rows a call),
//!                           its last launch also h += moe; x = rmsnorm(h) * (1 + w_next)
//!                           (or the final norm)
//! ```
//!
//! then, for the rows that sample, lm_head and the sampling. Projections take the GEMV (up to
//! eight rows, a decode pass) or the GEMM (a prefill pass, whatever its rows).

use aot_kernels::device::CudaSlice;
use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::attention::{attention_decode, AttnDecode, AttnScratch, MAX_SPLITS};
use aot_kernels::ops::attention_prefill::{attention_prefill, AttentionPrefillParams};
use aot_kernels::ops::embedding::embedding;
use aot_kernels::ops::gated_delta_net::{
    gdn_decode_convolved, gdn_recurrent, GdnInputs, GdnLayer, GdnSequences, GdnShape, GdnState,
};
use aot_kernels::ops::gemm::{gemm_bf16, gemm_bf16_w_view, GemmShape};
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput, GemvPart, OutputNorm, PartsConv};
use aot_kernels::ops::kv_cache::BlockTable;
use aot_kernels::ops::moe::{moe_forward_add_norm, MoeAddNorm, MoeLayer};
use aot_kernels::ops::output_gate::sigmoid_gate_mul;
use aot_kernels::ops::qk_norm_rope::{qk_norm_rope_cache, QkNormRopeInputs, QkNormRopeParams};
use aot_kernels::ops::rmsnorm::{fused_add_rmsnorm, rmsnorm, RmsNormParams};
use aot_kernels::ops::sampling::{sample_tokens, DeviceSamplingParams, LogitsShape};
use aot_kernels::ops::{dev, dev_mut, OpsError};
use half::bf16;

use super::hybrid::{HybridBuffers, HybridGpuRunner, PassSeq, HYBRID_PASS_ROWS, MOE_ROWS};
use super::hybrid_weights::{in_proj_widths, AttentionWeights, LinearWeights, MixerWeights};
use super::inputs;
use crate::model::Qwen35MoeConfig;

/// `out[rows, n_out] = x[rows, k] W^T`: the GEMV for a decode pass, the GEMM for a prefill pass
/// whatever its row count (as the dense engine), so that a prompt's rows get the same bits however
/// the prompts of a step are packed.
#[allow(clippy::too_many_arguments)]
fn project(
    decode: bool,
    kernels: &LoadedKernels,
    w: &CudaSlice<bf16>,
    n_out: usize,
    k: usize,
    rows: usize,
    x: &CudaSlice<bf16>,
    out: &mut CudaSlice<bf16>,
) -> Result<(), OpsError> {
    if decode {
        gemv(
            kernels,
            dev(kernels, w),
            n_out,
            k,
            rows,
            &GemvInput::Plain {
                x: dev(kernels, x),
                ld_x: k,
            },
            GemvOutput::Bf16 {
                out: dev_mut(kernels, out),
                ld_out: n_out,
            },
        )
    } else {
        gemm_bf16(kernels, out, x, w, &GemmShape::dense(rows, n_out, k))
    }
}

impl HybridGpuRunner {
    /// Every layer over the pass's `n` rows; leaves `b.x` holding `rmsnorm(h) * (1 + w_final)`.
    pub(super) fn launch_layers(
        &mut self,
        seqs: &[PassSeq],
        n: usize,
        decode: bool,
    ) -> Result<(), OpsError> {
        let c = &self.cfg;
        let kernels = &self.kernels;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let eps = c.rms_norm_eps as f32;
        let norm = RmsNormParams {
            rows: n,
            hidden: h,
            eps,
            weight_offset: 1.0,
        };
        let t = HYBRID_PASS_ROWS;
        embedding(
            kernels,
            dev_mut(kernels, &mut self.b.h),
            h,
            None,
            dev(kernels, &self.w.embed),
            v,
            h,
            dev(kernels, &self.b.rows_meta.slice(0..t)),
            n,
        )?;
        rmsnorm(
            kernels,
            &mut self.b.x,
            &self.b.h,
            &self.w.layers[0].input_norm,
            &norm,
        )?;
        let layers = self.w.layers.len();
        let HybridGpuRunner {
            kernels,
            cfg,
            gdn,
            moe: moe_shape,
            w,
            k_cache,
            v_cache,
            conv_state,
            rec_state,
            rope,
            max_pos,
            b,
            block_table,
            ld_bt,
            ..
        } = self;
        let fixed = Fixed {
            kernels,
            cfg,
            rope,
            max_pos: *max_pos,
            block_table,
            ld_bt: *ld_bt,
        };
        for l in 0..layers {
            let lw = &w.layers[l];
            let post_norm = PostNorm {
                weight: &lw.post_norm,
                params: &norm,
            };
            match &lw.mixer {
                MixerWeights::Linear(m) => {
                    let mut state = GdnState {
                        slots: conv_state[m.state_layer].len() / gdn.conv_state_len().max(1),
                        conv: &mut conv_state[m.state_layer],
                        recurrent: &mut rec_state[m.state_layer],
                    };
                    linear_mixer(
                        &fixed,
                        gdn,
                        m,
                        &mut state,
                        b,
                        seqs.len(),
                        n,
                        decode,
                        &post_norm,
                    )?
                }
                MixerWeights::Attention(m) => {
                    let l = m.cache_layer;
                    attention_mixer(
                        &fixed,
                        m,
                        &mut k_cache[l],
                        &mut v_cache[l],
                        b,
                        seqs,
                        n,
                        decode,
                        &post_norm,
                    )?
                }
            }
            let moe = MoeLayer {
                router: &lw.moe.router,
                shared_gate: &lw.moe.shared_gate,
                gate_up: &lw.moe.gate_up,
                down: &lw.moe.down,
                shared_gate_up: &lw.moe.shared_gate_up,
                shared_down: &lw.moe.shared_down,
            };
            // The block's last launch also adds its output to the residual stream and applies
            // the next norm (the next layer's input norm, or the final one).
            let next = if l + 1 < layers {
                &w.layers[l + 1].input_norm
            } else {
                &w.final_norm
            };
            if n <= MOE_ROWS {
                // A decode pass logs each layer's count of distinct experts (the bench's bytes).
                let mut count = b.moe_counts.slice_mut(l..l + 1);
                let add_norm = MoeAddNorm {
                    residual: dev_mut(kernels, &mut b.h),
                    weight: dev(kernels, next),
                    eps,
                    weight_offset: 1.0,
                    normed: dev_mut(kernels, &mut b.x),
                };
                moe_forward_add_norm(
                    kernels,
                    moe_shape,
                    &moe,
                    &b.y,
                    n,
                    &mut b.moe_scratch,
                    add_norm,
                    Some(dev_mut(kernels, &mut count)),
                )?;
            } else {
                for first in (0..n).step_by(MOE_ROWS) {
                    let rows = MOE_ROWS.min(n - first);
                    let span = first * h..(first + rows) * h;
                    kernels
                        .stream()
                        .memcpy_dtod(&b.y.slice(span), &mut b.moe_in.slice_mut(0..rows * h))
                        .map_err(|e| OpsError::Driver {
                            op: "moe rows",
                            source: e,
                        })?;
                    let add_norm = MoeAddNorm {
                        residual: dev_mut(kernels, &mut b.h).skip(first * h)?,
                        weight: dev(kernels, next),
                        eps,
                        weight_offset: 1.0,
                        normed: dev_mut(kernels, &mut b.x).skip(first * h)?,
                    };
                    moe_forward_add_norm(
                        kernels,
                        moe_shape,
                        &moe,
                        &b.moe_in,
                        rows,
                        &mut b.moe_scratch,
                        add_norm,
                        None,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// lm_head over the final hidden states of `rows` (at most eight) and the sampling, with the
    /// parameters in `b.inputs`: tokens into `b.sampled`, logits into `b.logits`.
    pub(super) fn launch_logits(&mut self, rows: &[usize]) -> Result<(), OpsError> {
        let kernels = &self.kernels;
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let b = &mut self.b;
        let s = kernels.stream();
        for (i, &r) in rows.iter().enumerate() {
            s.memcpy_dtod(
                &b.x.slice(r * h..(r + 1) * h),
                &mut b.last.slice_mut(i * h..(i + 1) * h),
            )
            .map_err(|e| OpsError::Driver {
                op: "sampling rows",
                source: e,
            })?;
        }
        let m = rows.len();
        gemv(
            kernels,
            dev(kernels, self.w.lm_head()),
            v,
            h,
            m,
            &GemvInput::Plain {
                x: dev(kernels, &b.last),
                ld_x: h,
            },
            GemvOutput::F32 {
                out: dev_mut(kernels, &mut b.logits),
                ld_out: v,
            },
        )?;
        sample_tokens(
            kernels,
            &mut b.sampled,
            &b.logits,
            &LogitsShape {
                rows: m,
                vocab: v,
                row_stride: v,
            },
            &DeviceSamplingParams {
                temperature: dev(kernels, &inputs::temperature(&b.inputs)),
                top_k: dev(kernels, &inputs::top_k(&b.inputs)),
                top_p: dev(kernels, &inputs::top_p(&b.inputs)),
                seed: dev(kernels, &inputs::seed(&b.inputs)),
                counter: dev(kernels, &inputs::counter(&b.inputs)),
            },
        )
    }
}

/// What the mixers read besides their weights and the pass buffers.
struct Fixed<'a> {
    kernels: &'a LoadedKernels,
    cfg: &'a Qwen35MoeConfig,
    rope: &'a CudaSlice<f32>,
    max_pos: usize,
    block_table: &'a CudaSlice<i32>,
    ld_bt: usize,
}

/// A Gated DeltaNet layer: `b.x` in; adds its output to `b.h` and leaves the post-mixer norm of
/// the sum in `b.y`; advances the sequences' state slots.
#[allow(clippy::too_many_arguments)]
fn linear_mixer(
    f: &Fixed<'_>,
    g: &GdnShape,
    m: &LinearWeights,
    state: &mut GdnState<'_>,
    b: &mut HybridBuffers,
    n_seqs: usize,
    n: usize,
    decode: bool,
    post_norm: &PostNorm<'_>,
) -> Result<(), OpsError> {
    let kernels = f.kernels;
    in_proj(kernels, f.cfg, m, state, b, n, decode)?;
    let layer = GdnLayer {
        conv_weight: &m.conv,
        a_log: &m.a_log,
        dt_bias: &m.dt_bias,
        norm_weight: &m.norm,
        eps: f.cfg.rms_norm_eps as f32,
    };
    let sequences = GdnSequences {
        n_seqs,
        n_tokens: n,
        cu_seqlens: &b.cu_seqlens,
        slots: &b.state_slots,
        has_state: &b.has_state,
    };
    let inputs = GdnInputs {
        qkv: &b.gdn_qkv,
        a: &b.gdn_a,
        b: &b.gdn_b,
        z: &b.gdn_z,
    };
    if decode {
        // The in-projection's GEMV ran the conv (gdn_conv1d's bits) and shifted the conv states.
        gdn_decode_convolved(
            kernels,
            g,
            &layer,
            state,
            &sequences,
            &inputs,
            &mut b.gdn_out,
        )?;
    } else {
        // Token by token in prompts too: a prompt's bits then do not depend on how it was chunked
        // (docs/engine.md, "The hybrid family on the GPU").
        gdn_recurrent(
            kernels,
            g,
            &layer,
            state,
            &sequences,
            &inputs,
            &mut b.gdn_scratch,
            &mut b.gdn_out,
        )?;
    }
    out_proj_add_norm(
        f,
        decode,
        &m.out,
        g.value_width(),
        n,
        MixerOutput::Linear,
        post_norm,
        b,
    )
}

/// The post-mixer norm: its weight and the pass's norm shape.
struct PostNorm<'a> {
    weight: &'a CudaSlice<bf16>,
    params: &'a RmsNormParams,
}

/// Which mixer's output a layer projects: `b.gdn_out` or `b.attn`.
#[derive(Clone, Copy)]
enum MixerOutput {
    Linear,
    Attention,
}

/// A mixer's output projection of its output rows (`[n][k]`), added to the residual stream, then
/// the post-mixer norm: `h += out W^T; y = rmsnorm(h) * (1 + w_post)`. A decode pass does all of it
/// in the GEMV, whose last block applies the norm (one launch); a prefill pass runs the GEMM,
/// then `fused_add_rmsnorm`. Both add `bf16(h + bf16(o))`; the norms' sums of squares run in
/// another order (per 16 rows, then in order; one block's strided sum).
#[allow(clippy::too_many_arguments)]
fn out_proj_add_norm(
    f: &Fixed<'_>,
    decode: bool,
    w: &CudaSlice<bf16>,
    k: usize,
    n: usize,
    mixer: MixerOutput,
    post_norm: &PostNorm<'_>,
    b: &mut HybridBuffers,
) -> Result<(), OpsError> {
    let kernels = f.kernels;
    let h = f.cfg.hidden_size;
    let HybridBuffers {
        h: residual,
        y,
        out_ssq,
        out_arrived,
        gdn_out,
        attn,
        ..
    } = b;
    let input = match mixer {
        MixerOutput::Linear => &*gdn_out,
        MixerOutput::Attention => &*attn,
    };
    if !decode {
        gemm_bf16(kernels, y, input, w, &GemmShape::dense(n, h, k))?;
        return fused_add_rmsnorm(kernels, y, residual, post_norm.weight, post_norm.params);
    }
    gemv(
        kernels,
        dev(kernels, w),
        h,
        k,
        n,
        &GemvInput::Plain {
            x: dev(kernels, input),
            ld_x: k,
        },
        GemvOutput::ResidualNorm {
            h: dev_mut(kernels, residual),
            ld_h: h,
            ssq_out: dev_mut(kernels, out_ssq),
            norm: OutputNorm {
                weight: dev(kernels, post_norm.weight),
                eps: post_norm.params.eps,
                weight_offset: post_norm.params.weight_offset,
            },
            normed: dev_mut(kernels, y),
            ld_normed: h,
            arrived: dev_mut(kernels, out_arrived),
        },
    )
}

/// A DeltaNet layer's four input projections of `b.x` (rows [`in_proj_widths`] of one weight)
/// into `b.gdn_qkv`, `gdn_z`, `gdn_b` and `gdn_a`: one GEMV writing each its part in a decode
/// pass, which also runs the conv on the qkv part and shifts the slots' conv states
/// (`GemvOutput::Bf16PartsConv`, one row a sequence); a GEMM each in a prefill pass (each on its
/// rows of the weight, so the bits of a GEMM on that projection alone), the conv after it.
fn in_proj(
    kernels: &LoadedKernels,
    c: &Qwen35MoeConfig,
    m: &LinearWeights,
    state: &mut GdnState<'_>,
    b: &mut HybridBuffers,
    n: usize,
    decode: bool,
) -> Result<(), OpsError> {
    let h = c.hidden_size;
    let widths = in_proj_widths(c);
    let total: usize = widths.iter().sum();
    let outs = [&mut b.gdn_qkv, &mut b.gdn_z, &mut b.gdn_b, &mut b.gdn_a];
    if decode {
        let parts = outs
            .into_iter()
            .zip(widths)
            .map(|(out, width)| GemvPart {
                out: dev_mut(kernels, out),
                width,
            })
            .collect();
        return gemv(
            kernels,
            dev(kernels, &m.in_proj),
            total,
            h,
            n,
            &GemvInput::Plain {
                x: dev(kernels, &b.x),
                ld_x: h,
            },
            GemvOutput::Bf16PartsConv {
                parts,
                conv: PartsConv {
                    weight: dev(kernels, &m.conv),
                    state: dev_mut(kernels, state.conv),
                    slots: dev(kernels, &b.state_slots),
                    has_state: dev(kernels, &b.has_state),
                },
            },
        );
    }
    let mut start = 0;
    for (out, width) in outs.into_iter().zip(widths) {
        let rows = m.in_proj.slice(start * h..(start + width) * h);
        gemm_bf16_w_view(
            kernels,
            out,
            &b.x,
            dev(kernels, &rows),
            &GemmShape::dense(n, width, h),
        )?;
        start += width;
    }
    Ok(())
}

/// A gated attention layer: `b.x` in; adds its output to `b.h` and leaves the post-mixer norm of
/// the sum in `b.y`; writes the rows' keys and values.
#[allow(clippy::too_many_arguments)]
fn attention_mixer(
    f: &Fixed<'_>,
    m: &AttentionWeights,
    k_cache: &mut CudaSlice<bf16>,
    v_cache: &mut CudaSlice<bf16>,
    b: &mut HybridBuffers,
    seqs: &[PassSeq],
    n: usize,
    decode: bool,
    post_norm: &PostNorm<'_>,
) -> Result<(), OpsError> {
    let (c, kernels) = (f.cfg, f.kernels);
    let (h, d, nh, kv) = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
    );
    let eps = c.rms_norm_eps as f32;
    let width = (2 * nh + 2 * kv) * d;
    let q_dim = nh * d;
    let t = HYBRID_PASS_ROWS;
    project(decode, kernels, &m.qkvg, width, h, n, &b.x, &mut b.qkvg)?;
    if decode {
        // The full split depth whatever the contexts (each sequence's split count comes from its
        // own length in the kernel), so a captured pass serves every later step of its row count,
        // and eager and replayed passes launch the same grid.
        attention_decode(
            kernels,
            AttnDecode {
                qkv: dev(kernels, &b.qkvg),
                ld_qkv: width,
                q_norm: dev(kernels, &m.q_norm),
                k_norm: dev(kernels, &m.k_norm),
                eps,
                weight_offset: 1.0,
                cos_sin: dev(kernels, f.rope),
                max_pos: f.max_pos,
                k_cache: dev_mut(kernels, k_cache),
                v_cache: dev_mut(kernels, v_cache),
                block_table: dev(kernels, f.block_table),
                ld_bt: f.ld_bt,
                slot_of_row: dev(kernels, &b.rows_meta.slice(2 * t..3 * t)),
                positions: dev(kernels, &b.rows_meta.slice(t..2 * t)),
                out: dev_mut(kernels, &mut b.attn),
                m: n,
                q_heads: nh,
                kv_heads: kv,
                head_dim: d,
                grid_splits: MAX_SPLITS,
                pipelined: false,
                cluster: false,
                overlap_previous: false,
            },
            &mut AttnScratch {
                ws_ml: dev_mut(kernels, &mut b.attn_ml),
                ws_o: dev_mut(kernels, &mut b.attn_o),
                counters: dev_mut(kernels, &mut b.attn_counters),
            },
        )?;
    } else {
        for sq in seqs {
            let blocks = BlockTable {
                table: f.block_table,
                offset: sq.slot * f.ld_bt,
                len: f.ld_bt,
            };
            qk_norm_rope_cache(
                kernels,
                &QkNormRopeInputs {
                    qkv: dev(kernels, &b.qkvg).skip(sq.row * width)?,
                    q_norm: &m.q_norm,
                    k_norm: &m.k_norm,
                    cos_sin: f.rope,
                    max_position: f.max_pos,
                    blocks,
                },
                dev_mut(kernels, &mut b.q).skip(sq.row * q_dim)?,
                k_cache,
                v_cache,
                &QkNormRopeParams {
                    tokens: sq.len,
                    q_heads: nh,
                    kv_heads: kv,
                    head_dim: d,
                    qkv_stride: width,
                    start_pos: sq.start_pos,
                    eps,
                    weight_offset: 1.0,
                },
            )?;
            attention_prefill(
                kernels,
                dev_mut(kernels, &mut b.attn).skip(sq.row * q_dim)?,
                dev(kernels, &b.q).skip(sq.row * q_dim)?,
                k_cache,
                v_cache,
                &blocks,
                &AttentionPrefillParams {
                    tokens: sq.len,
                    q_heads: nh,
                    kv_heads: kv,
                    head_dim: d,
                    start_pos: sq.start_pos,
                    softmax_scale: 1.0 / (d as f32).sqrt(),
                },
            )?;
        }
    }
    sigmoid_gate_mul(
        kernels,
        dev_mut(kernels, &mut b.attn),
        q_dim,
        dev(kernels, &b.qkvg).skip((nh + 2 * kv) * d)?,
        width,
        n,
        q_dim,
    )?;
    out_proj_add_norm(
        f,
        decode,
        &m.o,
        q_dim,
        n,
        MixerOutput::Attention,
        post_norm,
        b,
    )
}
