//! The dense Qwen3 forward pass in fp32, as transformers' `Qwen3ForCausalLM` computes it in
//! float32 (the equations of `model::qwen3`). A step is a flat list of rows, each one token of one
//! sequence at its position; every row's result depends only on its own token, position and
//! cache, never on the other rows, so prefill chunking and batching do not change a single bit.

use super::kv::PagedKvCache;
use super::math::{dot, linear, rms_norm, silu, softmax, Rope};
use super::weights::CpuWeights;
use super::Row;
use crate::model::Qwen3Config;

#[derive(Debug)]
pub struct DenseModel {
    pub config: Qwen3Config,
    pub weights: CpuWeights,
    rope: Rope,
    eps: f32,
    /// `head_dim ** -0.5`, rounded to fp32 as torch does when it scales a float32 tensor.
    attn_scale: f32,
}

impl DenseModel {
    pub fn new(config: Qwen3Config, weights: CpuWeights) -> DenseModel {
        DenseModel {
            rope: Rope::new(config.head_dim, config.rope_theta),
            eps: config.rms_norm_eps as f32,
            attn_scale: (config.head_dim as f64).powf(-0.5) as f32,
            config,
            weights,
        }
    }

    /// Runs every layer over `rows`, writing each row's keys and values into `cache` at its
    /// position, and returns the last hidden states `[rows][hidden]` (before the final norm).
    pub fn forward(&self, cache: &mut PagedKvCache, rows: &[Row<'_>]) -> Vec<f32> {
        let c = &self.config;
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim, inter) = (c.q_dim(), c.kv_dim(), c.intermediate_size);
        let n = rows.len();

        // h = embed[token]
        let mut h = vec![0.0f32; n * hidden];
        for (r, row) in rows.iter().enumerate() {
            let t = row.token as usize;
            h[r * hidden..(r + 1) * hidden]
                .copy_from_slice(&self.weights.embed[t * hidden..(t + 1) * hidden]);
        }

        let mut x = vec![0.0f32; n * hidden];
        let mut q = vec![0.0f32; n * q_dim];
        let mut k = vec![0.0f32; n * kv_dim];
        let mut v = vec![0.0f32; n * kv_dim];
        let mut attn = vec![0.0f32; n * q_dim];
        let mut out = vec![0.0f32; n * hidden];
        let mut gate = vec![0.0f32; n * inter];
        let mut up = vec![0.0f32; n * inter];

        for (l, w) in self.weights.layers.iter().enumerate() {
            // x = rmsnorm(h) * w_in; q, k, v = x Wq^T, x Wk^T, x Wv^T
            x.copy_from_slice(&h);
            for xr in x.chunks_exact_mut(hidden) {
                rms_norm(xr, &w.input_norm, self.eps);
            }
            linear(&w.q_proj, q_dim, &x, hidden, &mut q);
            linear(&w.k_proj, kv_dim, &x, hidden, &mut k);
            linear(&w.v_proj, kv_dim, &x, hidden, &mut v);

            // Per head: q = rope(rmsnorm(q) * q_norm), k likewise; cache[pos] = k, v.
            for (r, row) in rows.iter().enumerate() {
                for qh in q[r * q_dim..(r + 1) * q_dim].chunks_exact_mut(hd) {
                    rms_norm(qh, &w.q_norm, self.eps);
                    self.rope.apply(qh, row.pos);
                }
                for g in 0..c.num_key_value_heads {
                    let span = r * kv_dim + g * hd..r * kv_dim + (g + 1) * hd;
                    let kh = &mut k[span.clone()];
                    rms_norm(kh, &w.k_norm, self.eps);
                    self.rope.apply(kh, row.pos);
                    cache.write(l, row.blocks, row.pos, g, kh, &v[span]);
                }
            }

            // Causal GQA attention over each row's cached positions 0..=pos.
            for (r, row) in rows.iter().enumerate() {
                self.attention(
                    cache,
                    l,
                    row,
                    &q[r * q_dim..(r + 1) * q_dim],
                    &mut attn[r * q_dim..(r + 1) * q_dim],
                );
            }

            // h = h + attn Wo^T
            linear(&w.o_proj, hidden, &attn, q_dim, &mut out);
            for (hv, o) in h.iter_mut().zip(&out) {
                *hv += o;
            }

            // h = h + (silu(x Wg^T) * (x Wu^T)) Wd^T, x = rmsnorm(h) * w_post
            x.copy_from_slice(&h);
            for xr in x.chunks_exact_mut(hidden) {
                rms_norm(xr, &w.post_norm, self.eps);
            }
            linear(&w.gate_proj, inter, &x, hidden, &mut gate);
            linear(&w.up_proj, inter, &x, hidden, &mut up);
            for (g, u) in gate.iter_mut().zip(&up) {
                *g = silu(*g) * u;
            }
            linear(&w.down_proj, hidden, &gate, inter, &mut out);
            for (hv, o) in h.iter_mut().zip(&out) {
                *hv += o;
            }
        }
        h
    }

    /// `softmax(q K^T * scale) V` for every query head of one row; query head `i` reads key/value
    /// head `i / gqa_group` (transformers' `repeat_kv`).
    fn attention(
        &self,
        cache: &PagedKvCache,
        layer: usize,
        row: &Row<'_>,
        q: &[f32],
        out: &mut [f32],
    ) {
        let hd = self.config.head_dim;
        let group = self.config.gqa_group();
        let ctx = row.pos + 1;
        let mut p = vec![0.0f32; ctx];
        for (head, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
            let g = head / group;
            for (j, s) in p.iter_mut().enumerate() {
                *s = dot(qh, cache.key(layer, row.blocks, j, g)) * self.attn_scale;
            }
            softmax(&mut p);
            oh.fill(0.0);
            for (j, &pj) in p.iter().enumerate() {
                for (o, &vv) in oh.iter_mut().zip(cache.value(layer, row.blocks, j, g)) {
                    *o += pj * vv;
                }
            }
        }
    }

    /// `logits = (rmsnorm(h) * w_final) E^T` for one row's last hidden state.
    pub fn logits(&self, hidden_row: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let mut x = hidden_row.to_vec();
        rms_norm(&mut x, &self.weights.final_norm, self.eps);
        let mut logits = vec![0.0f32; c.vocab_size];
        linear(
            self.weights.output(),
            c.vocab_size,
            &x,
            c.hidden_size,
            &mut logits,
        );
        logits
    }
}
