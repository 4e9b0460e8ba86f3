//! Prompt tokens on the GPU: tensor-core GEMMs over the prompt chunks of every sequence of a step,
//! packed into passes of up to [`GpuOptions::prefill_tokens`](super::GpuOptions) rows
//! ([`packing`](super::packing)), causal attention per sequence over its paged cache, and the
//! norms and activation between them:
//!
//! ```text
//! h = embed[tokens];  x = rmsnorm(h) * w_in[0]
//! per layer:  qkv = x Wqkv^T -> per sequence: q/k norm, RoPE, k and v into its cache;
//!                                             a = attention(q, its cache)
//!             o = a Wo^T;  x = rmsnorm(h += o) * w_post;  act = silu(x Wg^T) * (x Wu^T)
//!             d = act Wd^T;  x = rmsnorm(h += d) * w_in[next] (or w_final)
//! per sequence that samples: logits of its last token = x[last] E^T, then the sample
//! ```
//!
//! Each token's result depends only on its own row and its sequence's cache (GEMM rows are
//! independent of how many rows a launch has; attention walks keys in tiles fixed by absolute
//! position), so a prompt gives the same bits however it is chunked and whatever it is packed with.

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

use super::packing::{pack, Piece};
use super::{dev_err, ops_err, GpuRunner};
use crate::model::Qwen3Config;
use crate::runner::{RunnerError, SampleRequest};

/// The default of [`GpuOptions::prefill_tokens`](super::GpuOptions): rows of one packed prefill
/// pass. 4096 rows keep the H200's 132 SMs busy in every Qwen3-4B GEMM (the narrowest, o_proj and
/// down, are 320 tiles) and cost 48,640 bf16 activations (95 KiB) a row for Qwen3-4B (380 MiB).
pub const PREFILL_TOKENS: usize = 4096;

/// Activations of a prefill pass.
pub(super) struct PrefillBuffers {
    /// Rows a pass may carry.
    rows: usize,
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
        kernels: &aot_kernels::dispatch::LoadedKernels,
        c: &Qwen3Config,
        rows: usize,
    ) -> Result<Self, RunnerError> {
        let s = kernels.stream();
        let t = rows.max(1);
        let z = |n: usize| s.alloc_zeros::<bf16>(n).map_err(dev_err("prefill buffers"));
        Ok(PrefillBuffers {
            rows: t,
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

/// One sequence's prompt chunk in a step.
#[derive(Debug, Clone, Copy)]
pub(super) struct PromptChunk<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start_pos: usize,
    /// Draw a token after the chunk's last token (the prompt's last chunk).
    pub sample: Option<SampleRequest>,
}

/// What prefill returns per chunk: the sampled token (chunks that sample) and, when asked, its
/// logits.
pub(super) type ChunkOutput = (Option<u32>, Vec<f32>);

impl GpuRunner {
    /// Appends every chunk's tokens to its slot's cache, in packed passes; for each chunk that
    /// samples, returns the token drawn after its last token (and its logits when `want_logits`).
    pub(super) fn prefill(
        &mut self,
        chunks: &[PromptChunk<'_>],
        want_logits: bool,
    ) -> Result<Vec<ChunkOutput>, RunnerError> {
        let lens: Vec<usize> = chunks.iter().map(|c| c.tokens.len()).collect();
        let mut out: Vec<ChunkOutput> = vec![(None, Vec::new()); chunks.len()];
        for pass in pack(&lens, self.pf.rows) {
            self.prefill_launches(chunks, &pass).map_err(ops_err)?;
            // A chunk whose last token is in this pass samples now, before the next pass
            // overwrites the rows.
            for piece in &pass {
                let c = &chunks[piece.seq];
                if let (true, Some(sample)) = (piece.end() == c.tokens.len(), c.sample) {
                    out[piece.seq] =
                        self.sample_prefill_row(piece.row + piece.len - 1, sample, want_logits)?;
                }
            }
        }
        Ok(out)
    }

    /// One packed pass: the pieces' tokens at consecutive rows.
    fn prefill_launches(
        &mut self,
        chunks: &[PromptChunk<'_>],
        pass: &[Piece],
    ) -> Result<(), OpsError> {
        let c = &self.cfg;
        let kernels = &self.kernels;
        let p = &mut self.pf;
        let t: usize = pass.iter().map(|piece| piece.len).sum();
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let (qkv_dim, q_dim) = (c.qkv_dim(), c.q_dim());
        let eps = c.rms_norm_eps as f32;
        let ids: Vec<i32> = pass
            .iter()
            .flat_map(|piece| &chunks[piece.seq].tokens[piece.from..piece.end()])
            .map(|&x| x as i32)
            .collect();
        kernels
            .stream()
            .memcpy_htod(&ids, &mut p.tokens.slice_mut(0..t))
            .map_err(|source| OpsError::Driver {
                op: "prefill tokens",
                source,
            })?;
        embedding(
            kernels,
            dev_mut(kernels, &mut p.h),
            h,
            None,
            dev(kernels, &self.w.embed),
            c.vocab_size,
            h,
            dev(kernels, &p.tokens),
            t,
        )?;
        let norm = |rows| RmsNormParams {
            rows,
            hidden: h,
            eps,
            weight_offset: 0.0,
        };
        rmsnorm(
            kernels,
            &mut p.x,
            &p.h,
            &self.w.layers[0].input_norm,
            &norm(t),
        )?;
        let layers = self.w.layers.len();
        for (l, lw) in self.w.layers.iter().enumerate() {
            gemm_bf16(
                kernels,
                &mut p.qkv,
                &p.x,
                &lw.qkv,
                &GemmShape::dense(t, qkv_dim, h),
            )?;
            for piece in pass {
                let chunk = &chunks[piece.seq];
                let blocks = BlockTable {
                    table: &self.block_table,
                    offset: chunk.slot * self.ld_bt,
                    len: self.ld_bt,
                };
                let start_pos = chunk.start_pos + piece.from;
                qk_norm_rope_cache(
                    kernels,
                    &QkNormRopeInputs {
                        qkv: dev(kernels, &p.qkv).skip(piece.row * qkv_dim)?,
                        q_norm: &lw.q_norm,
                        k_norm: &lw.k_norm,
                        cos_sin: &self.rope,
                        max_position: self.max_pos,
                        blocks,
                    },
                    dev_mut(kernels, &mut p.q).skip(piece.row * q_dim)?,
                    &mut self.k_cache[l],
                    &mut self.v_cache[l],
                    &QkNormRopeParams {
                        tokens: piece.len,
                        q_heads: c.num_attention_heads,
                        kv_heads: c.num_key_value_heads,
                        head_dim: c.head_dim,
                        qkv_stride: qkv_dim,
                        start_pos,
                        eps,
                        weight_offset: 0.0,
                    },
                )?;
                attention_prefill(
                    kernels,
                    dev_mut(kernels, &mut p.attn).skip(piece.row * q_dim)?,
                    dev(kernels, &p.q).skip(piece.row * q_dim)?,
                    &self.k_cache[l],
                    &self.v_cache[l],
                    &blocks,
                    &AttentionPrefillParams {
                        tokens: piece.len,
                        q_heads: c.num_attention_heads,
                        kv_heads: c.num_key_value_heads,
                        head_dim: c.head_dim,
                        start_pos,
                        softmax_scale: 1.0 / (c.head_dim as f32).sqrt(),
                    },
                )?;
            }
            // x <- o = attn Wo^T, then x <- rmsnorm(h += o) * w_post.
            gemm_bf16(
                kernels,
                &mut p.x,
                &p.attn,
                &lw.o,
                &GemmShape::dense(t, h, q_dim),
            )?;
            fused_add_rmsnorm(kernels, &mut p.x, &mut p.h, &lw.post_norm, &norm(t))?;
            gemm_bf16(
                kernels,
                &mut p.gate_up,
                &p.x,
                &lw.gate_up,
                &GemmShape::dense(t, 2 * i, h),
            )?;
            silu_and_mul(kernels, &mut p.act, &p.gate_up, t, i)?;
            gemm_bf16(
                kernels,
                &mut p.x,
                &p.act,
                &lw.down,
                &GemmShape::dense(t, h, i),
            )?;
            let next = if l + 1 < layers {
                &self.w.layers[l + 1].input_norm
            } else {
                &self.w.final_norm
            };
            fused_add_rmsnorm(kernels, &mut p.x, &mut p.h, next, &norm(t))?;
        }
        Ok(())
    }

    /// lm_head on row `row` of the last pass's final-normed hidden states, then the sample.
    fn sample_prefill_row(
        &mut self,
        row: usize,
        sample: SampleRequest,
        want_logits: bool,
    ) -> Result<(Option<u32>, Vec<f32>), RunnerError> {
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let s = self.kernels.stream().clone();
        // The sampling parameters go in row 0 of the pass inputs (its token, position and slot
        // are not read here).
        self.upload_rows(&[super::Row {
            token: 0,
            pos: 0,
            slot: 0,
            sample: Some(sample),
        }])?;
        let b = &mut self.b;
        let kernels = &self.kernels;
        let x = dev(kernels, &self.pf.x).skip(row * h).map_err(ops_err)?;
        gemv(
            kernels,
            dev(kernels, self.w.lm_head()),
            v,
            h,
            1,
            &GemvInput::Plain { x, ld_x: h },
            GemvOutput::F32 {
                out: dev_mut(kernels, &mut b.logits),
                ld_out: v,
            },
        )
        .map_err(ops_err)?;
        b.sample(kernels, 1, v).map_err(ops_err)?;
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
