//! Qwen3 (dense): the tensor table. Every weight the model reads, with its Hugging Face name,
//! its shape and how a synthetic model initialises it. The table drives the loader's checks, the
//! synthetic-weight generator and the runners' uploads; the forward pass lives with each runner
//! (`cpu::forward`, `gpu::runner`) and reads like the equations in docs/models.md:
//!
//! ```text
//! h = embed[token]
//! per layer:  x = rmsnorm(h) * w_in
//!             q, k, v = x Wq^T, x Wk^T, x Wv^T          (per head: q = rmsnorm(q) * q_norm, k likewise)
//!             q, k = rope(q, pos), rope(k, pos);  cache[pos] = k, v
//!             h = h + softmax(q K^T / sqrt(d)) V Wo^T   (causal, GQA)
//!             x = rmsnorm(h) * w_post
//!             h = h + (silu(x Wg^T) * (x Wu^T)) Wd^T
//! logits = (rmsnorm(h) * w_final) E^T                     (E = lm_head, or embed when tied)
//! ```

use serde::Serialize;

use crate::config::Qwen3Config;

/// What a tensor is for; the runners find tensors by role, never by parsing names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Embed,
    InputNorm,
    QProj,
    KProj,
    VProj,
    OProj,
    QNorm,
    KNorm,
    PostNorm,
    GateProj,
    UpProj,
    DownProj,
    FinalNorm,
    LmHead,
}

/// How a synthetic model fills a tensor: `offset + scale * u`, `u` uniform in [-1, 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Init {
    pub offset: f32,
    pub scale: f32,
}

impl Init {
    /// A projection with `fan_in` inputs: unit variance in, unit variance out.
    fn linear(fan_in: usize) -> Init {
        Init {
            offset: 0.0,
            scale: (3.0 / fan_in as f32).sqrt(),
        }
    }

    const NORM: Init = Init {
        offset: 1.0,
        scale: 0.1,
    };

    const EMBEDDING: Init = Init {
        offset: 0.0,
        scale: 1.0,
    };
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorSpec {
    /// The name in the checkpoint (`model.layers.3.self_attn.q_proj.weight`).
    pub name: String,
    /// Row-major shape as stored (`[out_features, in_features]` for projections).
    pub shape: Vec<usize>,
    pub role: Role,
    pub layer: Option<usize>,
    pub init: Init,
}

impl TensorSpec {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every tensor of the model, in a fixed order (the order is also each tensor's index for the
/// synthetic generator, so it never changes for a given config).
pub fn tensor_table(c: &Qwen3Config) -> Vec<TensorSpec> {
    let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let mut t = Vec::with_capacity(c.num_hidden_layers * 11 + 3);
    let mut push =
        |name: String, shape: Vec<usize>, role: Role, layer: Option<usize>, init: Init| {
            t.push(TensorSpec {
                name,
                shape,
                role,
                layer,
                init,
            })
        };
    push(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        Role::Embed,
        None,
        Init::EMBEDDING,
    );
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let layer = Some(l);
        push(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Role::InputNorm,
            layer,
            Init::NORM,
        );
        push(
            format!("{p}.self_attn.q_proj.weight"),
            vec![c.q_dim(), h],
            Role::QProj,
            layer,
            Init::linear(h),
        );
        push(
            format!("{p}.self_attn.k_proj.weight"),
            vec![c.kv_dim(), h],
            Role::KProj,
            layer,
            Init::linear(h),
        );
        push(
            format!("{p}.self_attn.v_proj.weight"),
            vec![c.kv_dim(), h],
            Role::VProj,
            layer,
            Init::linear(h),
        );
        push(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, c.q_dim()],
            Role::OProj,
            layer,
            Init::linear(c.q_dim()),
        );
        push(
            format!("{p}.self_attn.q_norm.weight"),
            vec![c.head_dim],
            Role::QNorm,
            layer,
            Init::NORM,
        );
        push(
            format!("{p}.self_attn.k_norm.weight"),
            vec![c.head_dim],
            Role::KNorm,
            layer,
            Init::NORM,
        );
        push(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Role::PostNorm,
            layer,
            Init::NORM,
        );
        push(
            format!("{p}.mlp.gate_proj.weight"),
            vec![i, h],
            Role::GateProj,
            layer,
            Init::linear(h),
        );
        push(
            format!("{p}.mlp.up_proj.weight"),
            vec![i, h],
            Role::UpProj,
            layer,
            Init::linear(h),
        );
        push(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, i],
            Role::DownProj,
            layer,
            Init::linear(i),
        );
    }
    push(
        "model.norm.weight".into(),
        vec![h],
        Role::FinalNorm,
        None,
        Init::NORM,
    );
    if !c.tie_word_embeddings {
        push(
            "lm_head.weight".into(),
            vec![v, h],
            Role::LmHead,
            None,
            Init::linear(h),
        );
    }
    t
}

/// Names a checkpoint may carry that the model does not read: a tied checkpoint's
/// `lm_head.weight`, and rotary buffers older exports saved (recomputed from `rope_theta`).
pub fn ignorable_tensor(c: &Qwen3Config, name: &str) -> bool {
    (c.tie_word_embeddings && name == "lm_head.weight") || name.ends_with(".rotary_emb.inv_freq")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_weight_once_with_hf_names() {
        let c = Qwen3Config::qwen3_4b();
        let t = tensor_table(&c);
        assert_eq!(t.len(), 36 * 11 + 2);
        let mut names: Vec<&str> = t.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), t.len());
        let q = t
            .iter()
            .find(|s| s.name == "model.layers.35.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(q.shape, vec![4096, 2560]);
        assert!(
            t.iter().all(|s| s.role != Role::LmHead),
            "Qwen3-4B ties lm_head to the embedding"
        );
        let untied = Qwen3Config {
            tie_word_embeddings: false,
            ..Qwen3Config::tiny()
        };
        assert_eq!(tensor_table(&untied).last().unwrap().role, Role::LmHead);
    }
}
