//! Prompt tokens on the GPU: tensor-core GEMMs over a chunk of up to `PREFILL_TOKENS` tokens of
//! one request, causal attention over its paged cache, and the norms and activation between them:
//!
//! ```text
//! h = embed[tokens];  x = rmsnorm(h) * w_in[0]
//! per layer:  qkv = x Wqkv^T -> q/k norm, RoPE, k and v into the cache;  a = attention(q, cache)
//!             o = a Wo^T;  x = rmsnorm(h += o) * w_post;  act = silu(x Wg^T) * (x Wu^T)
//!             d = act Wd^T;  x = rmsnorm(h += d) * w_in[next] (or w_final)
//! logits of the last token = x[last] E^T, then the sample
//! ```
//!
//! Each token's result depends only on its own row and the cache (GEMM rows are independent of
//! how many rows a launch has; attention walks keys in tiles fixed by absolute position), so a
//! prompt gives the same bits however it is chunked.

use aot_kernels::device::CudaSlice;
use aot_kernels::ops::activation::silu_and_mul;
use aot_kernels::ops::attention_prefill::{attention_prefill, AttentionPrefillParams};
use aot_kernels::ops::embedding::embedding;
use aot_kernels::ops::gemm::{gemm_bf16, GemmShape};
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput};
use aot_kernels::ops::kv_cache::BlockTable;
use aot_kernels::ops::qk_norm_rope::{qk_norm_rope_cache, QkNormRopeInputs, QkNormRopeParams};
use aot_kernels::ops::rmsnorm::{fused_add_rmsnorm, rmsnorm, RmsNormParams};
use aot_kernels::ops::{dev, dev_mut, OpsError};
use half::bf16;

use super::{dev_err, ops_err, GpuRunner};
use crate::config::Qwen3Config;
use crate::runner::{RunnerError, SampleRequest};

/// Most prompt tokens one prefill launch sequence carries (longer chunks are cut).
pub const PREFILL_TOKENS: usize = 512;

/// Activations of a prefill chunk.
pub(super) struct PrefillBuffers {
    tokens: CudaSlice<i32>,
    h: CudaSlice<bf16>,
    x: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
}

impl PrefillBuffers {
    pub(super) fn new(
        k: &aot_kernels::dispatch::LoadedKernels,
        c: &Qwen3Config,
    ) -> Result<Self, RunnerError> {
        let s = k.stream();
        let t = PREFILL_TOKENS;
        let z = |n: usize| s.alloc_zeros::<bf16>(n).map_err(dev_err("prefill buffers"));
        Ok(PrefillBuffers {
            tokens: s
                .alloc_zeros::<i32>(t)
                .map_err(dev_err("prefill buffers"))?,
            h: z(t * c.hidden_size)?,
            x: z(t * c.hidden_size)?,
            qkv: z(t * c.qkv_dim())?,
            q: z(t * c.q_dim())?,
            attn: z(t * c.q_dim())?,
            gate_up: z(t * 2 * c.intermediate_size)?,
            act: z(t * c.intermediate_size)?,
        })
    }
}

impl GpuRunner {
    /// Appends `tokens` at `start_pos` to `slot`'s cache; with `sample`, returns the token drawn
    /// after the last one (and its logits when `want_logits`).
    pub(super) fn prefill(
        &mut self,
        slot: usize,
        tokens: &[u32],
        start_pos: usize,
        sample: Option<SampleRequest>,
        want_logits: bool,
    ) -> Result<(Option<u32>, Vec<f32>), RunnerError> {
        let mut at = 0;
        while at < tokens.len() {
            let n = (tokens.len() - at).min(PREFILL_TOKENS);
            self.prefill_launches(slot, &tokens[at..at + n], start_pos + at)
                .map_err(ops_err)?;
            at += n;
        }
        let Some(sample) = sample else {
            return Ok((None, Vec::new()));
        };
        let last = (tokens.len() - 1) % PREFILL_TOKENS;
        self.sample_prefill_row(last, sample, want_logits)
    }

    fn prefill_launches(
        &mut self,
        slot: usize,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<(), OpsError> {
        let c = &self.cfg;
        let k = &self.k;
        let p = &mut self.pf;
        let t = tokens.len();
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let eps = c.rms_norm_eps as f32;
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        k.stream()
            .memcpy_htod(&ids, &mut p.tokens.slice_mut(0..t))
            .map_err(|source| OpsError::Driver {
                op: "prefill tokens",
                source,
            })?;
        embedding(
            k,
            dev_mut(k, &mut p.h),
            h,
            None,
            dev(k, &self.w.embed),
            c.vocab_size,
            h,
            dev(k, &p.tokens),
            t,
        )?;
        let norm = |rows| RmsNormParams {
            rows,
            hidden: h,
            eps,
            weight_offset: 0.0,
        };
        rmsnorm(k, &mut p.x, &p.h, &self.w.layers[0].input_norm, &norm(t))?;
        let blocks = BlockTable {
            table: &self.block_table,
            offset: slot * self.ld_bt,
            len: self.ld_bt,
        };
        let layers = self.w.layers.len();
        for (l, lw) in self.w.layers.iter().enumerate() {
            gemm_bf16(
                k,
                &mut p.qkv,
                &p.x,
                &lw.qkv,
                &GemmShape::dense(t, c.qkv_dim(), h),
            )?;
            qk_norm_rope_cache(
                k,
                &QkNormRopeInputs {
                    qkv: &p.qkv,
                    q_norm: &lw.q_norm,
                    k_norm: &lw.k_norm,
                    cos_sin: &self.rope,
                    max_position: self.max_pos,
                    blocks,
                },
                &mut p.q,
                &mut self.k_cache[l],
                &mut self.v_cache[l],
                &QkNormRopeParams {
                    tokens: t,
                    q_heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    head_dim: c.head_dim,
                    qkv_stride: c.qkv_dim(),
                    start_pos,
                    eps,
                    weight_offset: 0.0,
                },
            )?;
            attention_prefill(
                k,
                &mut p.attn,
                &p.q,
                &self.k_cache[l],
                &self.v_cache[l],
                &blocks,
                &AttentionPrefillParams {
                    tokens: t,
                    q_heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    head_dim: c.head_dim,
                    start_pos,
                    softmax_scale: 1.0 / (c.head_dim as f32).sqrt(),
                },
            )?;
            // x <- o = attn Wo^T, then x <- rmsnorm(h += o) * w_post.
            gemm_bf16(
                k,
                &mut p.x,
                &p.attn,
                &lw.o,
                &GemmShape::dense(t, h, c.q_dim()),
            )?;
            fused_add_rmsnorm(k, &mut p.x, &mut p.h, &lw.post_norm, &norm(t))?;
            gemm_bf16(
                k,
                &mut p.gate_up,
                &p.x,
                &lw.gate_up,
                &GemmShape::dense(t, 2 * i, h),
            )?;
            silu_and_mul(k, &mut p.act, &p.gate_up, t, i)?;
            gemm_bf16(k, &mut p.x, &p.act, &lw.down, &GemmShape::dense(t, h, i))?;
            let next = if l + 1 < layers {
                &self.w.layers[l + 1].input_norm
            } else {
                &self.w.final_norm
            };
            fused_add_rmsnorm(k, &mut p.x, &mut p.h, next, &norm(t))?;
        }
        Ok(())
    }

    /// lm_head on row `row` of the last chunk's final-normed hidden states, then the sample.
    fn sample_prefill_row(
        &mut self,
        row: usize,
        sample: SampleRequest,
        want_logits: bool,
    ) -> Result<(Option<u32>, Vec<f32>), RunnerError> {
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let s = self.k.stream().clone();
        let b = &mut self.b;
        b.upload_sampling(&s, &[sample])?;
        let k = &self.k;
        let x = dev(k, &self.pf.x).skip(row * h).map_err(ops_err)?;
        gemv(
            k,
            dev(k, self.w.lm_head()),
            v,
            h,
            1,
            &GemvInput::Plain { x, ld_x: h },
            GemvOutput::F32 {
                out: dev_mut(k, &mut b.logits),
                ld_out: v,
            },
        )
        .map_err(ops_err)?;
        b.sample(k, 1, v).map_err(ops_err)?;
        let token = s
            .clone_dtoh(&b.sampled.slice(0..1))
            .map_err(dev_err("reading the sampled token"))?[0] as u32;
        let logits = if want_logits {
            s.clone_dtoh(&b.logits.slice(0..v))
                .map_err(dev_err("reading logits"))?
        } else {
            Vec::new()
        };
        Ok((Some(token), logits))
    }
}
