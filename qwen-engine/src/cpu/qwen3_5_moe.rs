//! The Qwen3.5/3.6 MoE forward pass in fp32, as transformers' `Qwen3_5MoeForCausalLM` computes it
//! in float32 with its pure-torch paths (the equations of `model::qwen3_5_moe`). A step is a flat
//! list of rows; rows of one sequence come in position order, because a linear layer's state
//! carries from each token to the next. The delta rule runs token by token (the recurrent form)
//! for prompts too, so a prompt gives the same bits however it is chunked.

use super::kv::PagedKvCache;
use super::math::{
    dot, l2_norm, linear, rms_norm, rms_norm_centred, sigmoid, silu, softmax, softplus, Rope,
};
use super::state::RecurrentStates;
use super::weights::RoleTensors;
use super::Row;
use crate::model::{HybridLayer, Qwen35MoeConfig, Role};

/// A linear (Gated DeltaNet) layer's weights.
#[derive(Debug)]
struct LinearMixer {
    in_proj_qkv: Vec<f32>,
    in_proj_z: Vec<f32>,
    in_proj_b: Vec<f32>,
    in_proj_a: Vec<f32>,
    /// `[channels][kernel]`.
    conv: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Vec<f32>,
}

/// A gated attention layer's weights.
#[derive(Debug)]
struct AttentionMixer {
    /// `[heads][q (head_dim) | gate (head_dim)]` rows.
    q_proj: Vec<f32>,
    k_proj: Vec<f32>,
    v_proj: Vec<f32>,
    o_proj: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// This layer's index among the attention layers (its place in the KV cache).
    cache_layer: usize,
}

#[derive(Debug)]
enum Mixer {
    Linear(LinearMixer),
    Attention(AttentionMixer),
}

#[derive(Debug)]
struct Moe {
    router: Vec<f32>,
    /// `[experts][2 * inter][hidden]`, gate rows first.
    gate_up: Vec<f32>,
    /// `[experts][hidden][inter]`.
    down: Vec<f32>,
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    shared_down: Vec<f32>,
    shared_expert_gate: Vec<f32>,
}

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    mixer: Mixer,
    post_norm: Vec<f32>,
    moe: Moe,
}

#[derive(Debug)]
pub struct HybridModel {
    pub config: Qwen35MoeConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Vec<f32>,
    rope: Rope,
    eps: f32,
    attn_scale: f32,
    bytes: usize,
}

impl HybridModel {
    pub fn new(config: Qwen35MoeConfig, mut w: RoleTensors) -> Result<HybridModel, String> {
        let bytes = w.bytes();
        let mut cache_layer = 0;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for (l, kind) in config.layer_types.iter().enumerate() {
            let mut take = |role| w.take(role, Some(l));
            let input_norm = take(Role::InputNorm)?;
            let mixer = match kind {
                HybridLayer::LinearAttention => Mixer::Linear(LinearMixer {
                    in_proj_qkv: take(Role::GdnInProjQkv)?,
                    in_proj_z: take(Role::GdnInProjZ)?,
                    in_proj_b: take(Role::GdnInProjB)?,
                    in_proj_a: take(Role::GdnInProjA)?,
                    conv: take(Role::GdnConv1d)?,
                    a_log: take(Role::GdnALog)?,
                    dt_bias: take(Role::GdnDtBias)?,
                    norm: take(Role::GdnNorm)?,
                    out_proj: take(Role::GdnOutProj)?,
                }),
                HybridLayer::FullAttention => {
                    cache_layer += 1;
                    Mixer::Attention(AttentionMixer {
                        q_proj: take(Role::QProj)?,
                        k_proj: take(Role::KProj)?,
                        v_proj: take(Role::VProj)?,
                        o_proj: take(Role::OProj)?,
                        q_norm: take(Role::QNorm)?,
                        k_norm: take(Role::KNorm)?,
                        cache_layer: cache_layer - 1,
                    })
                }
            };
            layers.push(Layer {
                input_norm,
                mixer,
                post_norm: take(Role::PostNorm)?,
                moe: Moe {
                    router: take(Role::MoeRouter)?,
                    gate_up: take(Role::MoeExpertsGateUp)?,
                    down: take(Role::MoeExpertsDown)?,
                    shared_gate: take(Role::SharedGateProj)?,
                    shared_up: take(Role::SharedUpProj)?,
                    shared_down: take(Role::SharedDownProj)?,
                    shared_expert_gate: take(Role::SharedExpertGate)?,
                },
            });
        }
        let embed = w.take(Role::Embed, None)?;
        let lm_head = if config.tie_word_embeddings {
            embed.clone()
        } else {
            w.take(Role::LmHead, None)?
        };
        Ok(HybridModel {
            rope: Rope::new(config.rotary_dim, config.rope_theta),
            eps: config.rms_norm_eps as f32,
            attn_scale: (config.head_dim as f64).powf(-0.5) as f32,
            final_norm: w.take(Role::FinalNorm, None)?,
            embed,
            lm_head,
            layers,
            config,
            bytes,
        })
    }

    pub fn weight_bytes(&self) -> usize {
        self.bytes
    }

    /// Runs every layer over `rows` (each row's keys and values into `cache`, each linear layer's
    /// state of the row's slot advanced in `states`) and returns the last hidden states
    /// `[rows][hidden]` (before the final norm).
    pub fn forward(
        &self,
        cache: &mut PagedKvCache,
        states: &mut RecurrentStates,
        rows: &[Row<'_>],
    ) -> Vec<f32> {
        let hidden = self.config.hidden_size;
        let mut h = vec![0.0f32; rows.len() * hidden];
        for (r, row) in rows.iter().enumerate() {
            let t = row.token as usize;
            h[r * hidden..(r + 1) * hidden]
                .copy_from_slice(&self.embed[t * hidden..(t + 1) * hidden]);
        }
        let mut x = vec![0.0f32; rows.len() * hidden];
        let mut mixed = vec![0.0f32; rows.len() * hidden];
        let mut linear_index = 0;
        for layer in &self.layers {
            // h = h + mixer(rmsnorm(h) * (1 + w_in))
            x.copy_from_slice(&h);
            for xr in x.chunks_exact_mut(hidden) {
                rms_norm_centred(xr, &layer.input_norm, self.eps);
            }
            match &layer.mixer {
                Mixer::Linear(m) => {
                    self.delta_net(m, linear_index, states, rows, &x, &mut mixed);
                    linear_index += 1;
                }
                Mixer::Attention(m) => self.attention(m, cache, rows, &x, &mut mixed),
            }
            for (hv, o) in h.iter_mut().zip(&mixed) {
                *hv += o;
            }
            // h = h + moe(rmsnorm(h) * (1 + w_post))
            x.copy_from_slice(&h);
            for xr in x.chunks_exact_mut(hidden) {
                rms_norm_centred(xr, &layer.post_norm, self.eps);
            }
            self.moe(&layer.moe, &x, &mut mixed);
            for (hv, o) in h.iter_mut().zip(&mixed) {
                *hv += o;
            }
        }
        h
    }

    /// One Gated DeltaNet layer over the rows, token by token per sequence.
    fn delta_net(
        &self,
        m: &LinearMixer,
        linear_index: usize,
        states: &mut RecurrentStates,
        rows: &[Row<'_>],
        x: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hidden, channels, kernel) = (c.hidden_size, c.conv_dim(), c.linear_conv_kernel_dim);
        let (nk, nv) = (c.linear_num_key_heads, c.linear_num_value_heads);
        let (dk, dv) = (c.linear_key_head_dim, c.linear_value_head_dim);
        let (key_dim, value_dim) = (c.linear_key_dim(), c.linear_value_dim());
        let n = rows.len();
        let mut qkv = vec![0.0f32; n * channels];
        let mut z = vec![0.0f32; n * value_dim];
        let mut b = vec![0.0f32; n * nv];
        let mut a = vec![0.0f32; n * nv];
        linear(&m.in_proj_qkv, channels, x, hidden, &mut qkv);
        linear(&m.in_proj_z, value_dim, x, hidden, &mut z);
        linear(&m.in_proj_b, nv, x, hidden, &mut b);
        linear(&m.in_proj_a, nv, x, hidden, &mut a);
        let scale = (dk as f64).powf(-0.5) as f32;
        let mut o = vec![0.0f32; value_dim];
        let mut core = vec![0.0f32; n * value_dim];
        let mut kv_mem = vec![0.0f32; dv];
        for (r, row) in rows.iter().enumerate() {
            let slot = row
                .state
                .expect("the runner checks every hybrid row has a state slot");
            let (conv_state, delta_state) = states.layer_mut(slot as usize, linear_index);
            // Causal depthwise conv over [the kernel - 1 previous inputs, this one], then silu.
            let input = &mut qkv[r * channels..(r + 1) * channels];
            let history = kernel - 1;
            for (ch, v) in input.iter_mut().enumerate() {
                let w = &m.conv[ch * kernel..(ch + 1) * kernel];
                let past = &mut conv_state[ch * history..(ch + 1) * history];
                let mut acc = w[history] * *v;
                for j in 0..history {
                    acc += w[j] * past[j];
                }
                past.rotate_left(1);
                past[history - 1] = *v;
                *v = silu(acc);
            }
            let (q, rest) = input.split_at_mut(key_dim);
            let (k, v) = rest.split_at_mut(key_dim);
            for qh in q.chunks_exact_mut(dk) {
                l2_norm(qh, 1e-6);
                for e in qh.iter_mut() {
                    *e *= scale;
                }
            }
            for kh in k.chunks_exact_mut(dk) {
                l2_norm(kh, 1e-6);
            }
            for head in 0..nv {
                let kh = head / (nv / nk);
                let (qh, khv) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
                let vh = &v[head * dv..(head + 1) * dv];
                let beta = sigmoid(b[r * nv + head]);
                let g = -m.a_log[head].exp() * softplus(a[r * nv + head] + m.dt_bias[head]);
                let decay = g.exp();
                // S: [dk][dv]. S = exp(g) S; kv = S^T k; delta = beta (v - kv); S += k delta^T.
                let s = &mut delta_state[head * dk * dv..(head + 1) * dk * dv];
                for e in s.iter_mut() {
                    *e *= decay;
                }
                kv_mem.fill(0.0);
                for (i, srow) in s.chunks_exact(dv).enumerate() {
                    for (acc, &sv) in kv_mem.iter_mut().zip(srow) {
                        *acc += sv * khv[i];
                    }
                }
                for (i, srow) in s.chunks_exact_mut(dv).enumerate() {
                    for ((sv, &vv), &mem) in srow.iter_mut().zip(vh).zip(&kv_mem) {
                        *sv += khv[i] * ((vv - mem) * beta);
                    }
                }
                // o = S^T q, then the gated norm: rmsnorm(o) * w * silu(z).
                let oh = &mut o[head * dv..(head + 1) * dv];
                oh.fill(0.0);
                for (i, srow) in s.chunks_exact(dv).enumerate() {
                    for (acc, &sv) in oh.iter_mut().zip(srow) {
                        *acc += sv * qh[i];
                    }
                }
                rms_norm(oh, &m.norm, self.eps);
                let zh = &z[r * value_dim + head * dv..r * value_dim + (head + 1) * dv];
                for (e, &zv) in oh.iter_mut().zip(zh) {
                    *e *= silu(zv);
                }
            }
            core[r * value_dim..(r + 1) * value_dim].copy_from_slice(&o);
        }
        linear(&m.out_proj, hidden, &core, value_dim, out);
    }

    /// Gated attention: `[q | gate]` per head, zero-centred q/k norms, RoPE on the leading dims,
    /// causal GQA softmax over the cache, `o * sigmoid(gate)`, then o_proj.
    fn attention(
        &self,
        m: &AttentionMixer,
        cache: &mut PagedKvCache,
        rows: &[Row<'_>],
        x: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hidden, hd, rot) = (c.hidden_size, c.head_dim, c.rotary_dim);
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
        let group = c.num_attention_heads / c.num_key_value_heads;
        let n = rows.len();
        let mut qg = vec![0.0f32; n * 2 * q_dim];
        let mut k = vec![0.0f32; n * kv_dim];
        let mut v = vec![0.0f32; n * kv_dim];
        linear(&m.q_proj, 2 * q_dim, x, hidden, &mut qg);
        linear(&m.k_proj, kv_dim, x, hidden, &mut k);
        linear(&m.v_proj, kv_dim, x, hidden, &mut v);
        for (r, row) in rows.iter().enumerate() {
            for head in qg[r * 2 * q_dim..(r + 1) * 2 * q_dim].chunks_exact_mut(2 * hd) {
                let q = &mut head[..hd];
                rms_norm_centred(q, &m.q_norm, self.eps);
                self.rope.apply(&mut q[..rot], row.pos);
            }
            for g in 0..c.num_key_value_heads {
                let span = r * kv_dim + g * hd..r * kv_dim + (g + 1) * hd;
                let kh = &mut k[span.clone()];
                rms_norm_centred(kh, &m.k_norm, self.eps);
                self.rope.apply(&mut kh[..rot], row.pos);
                cache.write(m.cache_layer, row.blocks, row.pos, g, kh, &v[span]);
            }
        }
        let mut attn = vec![0.0f32; n * q_dim];
        for (r, row) in rows.iter().enumerate() {
            let ctx = row.pos + 1;
            let mut p = vec![0.0f32; ctx];
            for head in 0..c.num_attention_heads {
                let base = r * 2 * q_dim + head * 2 * hd;
                let (qh, gate) = (&qg[base..base + hd], &qg[base + hd..base + 2 * hd]);
                let g = head / group;
                for (j, s) in p.iter_mut().enumerate() {
                    *s = dot(qh, cache.key(m.cache_layer, row.blocks, j, g)) * self.attn_scale;
                }
                softmax(&mut p);
                let oh = &mut attn[r * q_dim + head * hd..r * q_dim + (head + 1) * hd];
                for (j, &pj) in p.iter().enumerate() {
                    for (o, &vv) in oh
                        .iter_mut()
                        .zip(cache.value(m.cache_layer, row.blocks, j, g))
                    {
                        *o += pj * vv;
                    }
                }
                for (o, &gv) in oh.iter_mut().zip(gate) {
                    *o *= sigmoid(gv);
                }
            }
        }
        linear(&m.o_proj, hidden, &attn, q_dim, out);
    }

    /// The MoE block: softmax router, top-k renormalised, each chosen expert's SwiGLU weighted
    /// and summed in expert order, plus the sigmoid-gated shared expert.
    fn moe(&self, m: &Moe, x: &[f32], out: &mut [f32]) {
        let c = &self.config;
        let (hidden, e, inter, shared) = (
            c.hidden_size,
            c.num_experts,
            c.moe_intermediate_size,
            c.shared_expert_intermediate_size,
        );
        let n = x.len() / hidden;
        let mut logits = vec![0.0f32; n * e];
        linear(&m.router, e, x, hidden, &mut logits);
        let mut gate_up = vec![0.0f32; 2 * inter];
        let mut act = vec![0.0f32; inter.max(shared)];
        let mut y = vec![0.0f32; hidden];
        let mut sg = vec![0.0f32; shared];
        let mut su = vec![0.0f32; shared];
        for r in 0..n {
            let xr = &x[r * hidden..(r + 1) * hidden];
            let p = &mut logits[r * e..(r + 1) * e];
            softmax(p);
            let chosen = top_k(p, c.num_experts_per_tok);
            let sum: f32 = chosen.iter().map(|&i| p[i]).sum();
            let o = &mut out[r * hidden..(r + 1) * hidden];
            o.fill(0.0);
            let mut by_expert = chosen.clone();
            by_expert.sort_unstable();
            for &ex in &by_expert {
                let weight = p[ex] / sum;
                let w_gu = &m.gate_up[ex * 2 * inter * hidden..(ex + 1) * 2 * inter * hidden];
                linear(w_gu, 2 * inter, xr, hidden, &mut gate_up);
                for i in 0..inter {
                    act[i] = silu(gate_up[i]) * gate_up[inter + i];
                }
                let w_down = &m.down[ex * hidden * inter..(ex + 1) * hidden * inter];
                linear(w_down, hidden, &act[..inter], inter, &mut y);
                for (ov, yv) in o.iter_mut().zip(&y) {
                    *ov += yv * weight;
                }
            }
            linear(&m.shared_gate, shared, xr, hidden, &mut sg);
            linear(&m.shared_up, shared, xr, hidden, &mut su);
            for i in 0..shared {
                act[i] = silu(sg[i]) * su[i];
            }
            linear(&m.shared_down, hidden, &act[..shared], shared, &mut y);
            let gate = sigmoid(dot(&m.shared_expert_gate, xr));
            for (ov, yv) in o.iter_mut().zip(&y) {
                *ov += gate * yv;
            }
        }
    }

    /// `logits = (rmsnorm(h) * (1 + w_final)) lm_head^T` for one row's last hidden state.
    pub fn logits(&self, hidden_row: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let mut x = hidden_row.to_vec();
        rms_norm_centred(&mut x, &self.final_norm, self.eps);
        let mut logits = vec![0.0f32; c.vocab_size];
        linear(&self.lm_head, c.vocab_size, &x, c.hidden_size, &mut logits);
        logits
    }
}

/// Indices of the `k` largest values, largest first; ties go to the lower index (`torch.topk`
/// on distinct values; exact ties do not occur on real inputs).
pub fn top_k(p: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_largest_in_order() {
        assert_eq!(top_k(&[0.1, 0.5, 0.2, 0.5, 0.0], 3), vec![1, 3, 2]);
    }
}
