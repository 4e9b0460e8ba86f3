//! Qwen3.5 / Qwen3.6 MoE (hybrid): Gated DeltaNet and gated attention layers, every layer with a
//! routed MoE block (docs/models.md). Served from either layout transformers writes: the text-only
//! class (`model_type` `qwen3_5_moe_text`, tensors `model.layers.N...`) and the released
//! checkpoint (`qwen3_5_moe`, the text config under `text_config`, tensors
//! `model.language_model.layers.N...`, with a vision tower and `mtp.*` weights text decode skips).
//!
//! ```text
//! h = embed[token]
//! per layer:  x = rmsnorm(h) * (1 + w_in)
//!   linear:   qkv = silu(conv4(x Wqkv^T)) (state: the last 3 inputs);  z, b, a = x Wz^T, x Wb^T, x Wa^T
//!             q, k = l2norm(q) / sqrt(dk), l2norm(k);  beta = sigmoid(b);  g = -exp(A_log) softplus(a + dt_bias)
//!             per value head: S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
//!             h = h + (rmsnorm(o) * w_norm * silu(z)) Wout^T
//!   full:     [q | gate] = x Wq^T per head;  q, k = rmsnorm(.) * (1 + w);  rope on the first dims
//!             h = h + (softmax(q K^T / sqrt(d)) V * sigmoid(gate)) Wo^T   (causal, GQA)
//!   moe:      x = rmsnorm(h) * (1 + w_post);  p = top_k(softmax(x Wr^T)), p /= sum p
//!             h = h + sum_e p_e down_e(silu(gate_e x) up_e x) + sigmoid(x Wsg^T) shared(x)
//! logits = (rmsnorm(h) * (1 + w_final)) lm_head^T
//! ```

use serde::Serialize;
use serde_json::Value;

use super::tensor::{Init, Role, TableBuilder, TensorSpec};
use crate::config::{ConfigError, Fields};

/// What a layer's token mixer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HybridLayer {
    /// Gated DeltaNet: recurrent state per sequence, no KV cache.
    LinearAttention,
    /// Gated softmax attention over the paged KV cache.
    FullAttention,
}

/// Which of transformers' two layouts the checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointLayout {
    /// `Qwen3_5MoeForCausalLM`: tensors under `model.`.
    TextOnly,
    /// `Qwen3_5MoeForConditionalGeneration`: text tensors under `model.language_model.`.
    Conditional,
}

/// Shapes and constants of a Qwen3.5/3.6 MoE model's text decoder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Qwen35MoeConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub layer_types: Vec<HybridLayer>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each attention head that RoPE rotates (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub layout: CheckpointLayout,
}

impl Qwen35MoeConfig {
    /// Reads a text config's fields: the root of a `qwen3_5_moe_text` config.json, or the
    /// `text_config` of a `qwen3_5_moe` one (`layout` says which).
    pub fn from_fields(f: &Fields<'_>, layout: CheckpointLayout) -> Result<Self, ConfigError> {
        if let Some(act) = f.str("hidden_act").filter(|a| *a != "silu") {
            return Err(f.invalid(
                "hidden_act",
                format!("`{act}` is not supported; this family's experts use silu"),
            ));
        }
        f.refuse_true(
            "attention_bias",
            "projections with biases are not supported (Qwen3.5 has none)",
        )?;
        let num_hidden_layers = f.usize("num_hidden_layers")?;
        let rope = f.rope()?;
        let factor = match rope.params.get("partial_rotary_factor") {
            Some(v) => f.positive_f64(v, "rope_parameters.partial_rotary_factor")?,
            None => f.f64_or("partial_rotary_factor", 0.25)?,
        };
        let head_dim = f.usize_or("head_dim", 256)?;
        let config = Qwen35MoeConfig {
            vocab_size: f.usize("vocab_size")?,
            hidden_size: f.usize("hidden_size")?,
            num_hidden_layers,
            layer_types: layer_types(f, num_hidden_layers)?,
            num_attention_heads: f.usize("num_attention_heads")?,
            num_key_value_heads: f.usize("num_key_value_heads")?,
            head_dim,
            rotary_dim: (head_dim as f64 * factor) as usize,
            rope_theta: rope.theta,
            linear_num_key_heads: f.usize("linear_num_key_heads")?,
            linear_num_value_heads: f.usize("linear_num_value_heads")?,
            linear_key_head_dim: f.usize("linear_key_head_dim")?,
            linear_value_head_dim: f.usize("linear_value_head_dim")?,
            linear_conv_kernel_dim: f.usize_or("linear_conv_kernel_dim", 4)?,
            num_experts: f.usize("num_experts")?,
            num_experts_per_tok: f.usize("num_experts_per_tok")?,
            moe_intermediate_size: f.usize("moe_intermediate_size")?,
            shared_expert_intermediate_size: f.usize("shared_expert_intermediate_size")?,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            max_position_embeddings: f.usize("max_position_embeddings")?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            eos_token_ids: f.eos_token_ids()?,
            layout,
        };
        config
            .validate()
            .map_err(|(key, message)| f.invalid(key, message))?;
        Ok(config)
    }

    /// The shapes of Qwen3.6-35B-A3B (and Qwen3.5-35B-A3B), text-only layout.
    pub fn qwen3_6_35b_a3b() -> Self {
        Qwen35MoeConfig {
            vocab_size: 248_320,
            hidden_size: 2048,
            num_hidden_layers: 40,
            layer_types: (0..40).map(default_layer_type(4)).collect(),
            num_attention_heads: 16,
            num_key_value_heads: 2,
            head_dim: 256,
            rotary_dim: 64,
            rope_theta: 10_000_000.0,
            linear_num_key_heads: 16,
            linear_num_value_heads: 32,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            tie_word_embeddings: false,
            // Synthetic weights: generations end at their length.
            eos_token_ids: vec![],
            layout: CheckpointLayout::TextOnly,
        }
    }

    /// A small model of this family for tests: three linear layers around one attention layer.
    pub fn tiny() -> Self {
        Qwen35MoeConfig {
            vocab_size: 384,
            hidden_size: 128,
            num_hidden_layers: 4,
            layer_types: (0..4).map(default_layer_type(4)).collect(),
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 64,
            rotary_dim: 16,
            rope_theta: 10_000_000.0,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 32,
            linear_value_head_dim: 32,
            linear_conv_kernel_dim: 4,
            num_experts: 16,
            num_experts_per_tok: 4,
            moe_intermediate_size: 64,
            shared_expert_intermediate_size: 64,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            eos_token_ids: vec![],
            layout: CheckpointLayout::TextOnly,
        }
    }

    /// Channels of the convolved `[q | k | v]` input of a linear layer.
    pub fn conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }

    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    pub fn attention_layers(&self) -> usize {
        self.layer_types
            .iter()
            .filter(|t| **t == HybridLayer::FullAttention)
            .count()
    }

    pub fn linear_layers(&self) -> usize {
        self.num_hidden_layers - self.attention_layers()
    }

    /// KV cache bytes per token in bf16 (the attention layers only).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.attention_layers() * 2 * self.kv_dim() * 2
    }

    /// Recurrent state of one sequence in fp32: per linear layer the convolution's last
    /// `kernel - 1` inputs and the delta rule's `[dk x dv]` state of every value head.
    pub fn state_bytes(&self) -> usize {
        let conv = self.conv_dim() * (self.linear_conv_kernel_dim - 1);
        let delta =
            self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim;
        self.linear_layers() * (conv + delta) * 4
    }

    /// Where the text decoder's tensors live in the checkpoint.
    pub fn prefix(&self) -> &'static str {
        match self.layout {
            CheckpointLayout::TextOnly => "model.",
            CheckpointLayout::Conditional => "model.language_model.",
        }
    }

    /// Checks the relations the math relies on; `(key, message)` names what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let fail = |key, message: String| Err((key, message));
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return fail(
                "num_key_value_heads",
                format!(
                    "{} attention heads are not a multiple of {} key/value heads",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            );
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            return fail(
                "linear_num_value_heads",
                format!(
                    "{} value heads are not a multiple of {} key heads",
                    self.linear_num_value_heads, self.linear_num_key_heads
                ),
            );
        }
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return fail(
                "partial_rotary_factor",
                format!(
                    "rotates {} of {} head dims; it must be an even number of them, at least 2",
                    self.rotary_dim, self.head_dim
                ),
            );
        }
        if self.num_experts_per_tok > self.num_experts {
            return fail(
                "num_experts_per_tok",
                format!(
                    "{} experts per token, but the model has {}",
                    self.num_experts_per_tok, self.num_experts
                ),
            );
        }
        if self.linear_conv_kernel_dim < 2 {
            return fail(
                "linear_conv_kernel_dim",
                format!(
                    "{} taps; at least 2 are needed",
                    self.linear_conv_kernel_dim
                ),
            );
        }
        if self.vocab_size > i32::MAX as usize {
            return fail(
                "vocab_size",
                format!("{} does not fit a 32-bit token id", self.vocab_size),
            );
        }
        super::check_layers(self.num_hidden_layers)?;
        if self.num_experts > super::MAX_EXPERTS {
            return fail(
                "num_experts",
                format!(
                    "{} experts; at most {} are supported",
                    self.num_experts,
                    super::MAX_EXPERTS
                ),
            );
        }
        super::check_parameters(&tensor_table(self))
    }
}

/// transformers' default pattern: every `interval`-th layer is attention.
fn default_layer_type(interval: usize) -> impl Fn(usize) -> HybridLayer {
    move |i| {
        if (i + 1) % interval == 0 {
            HybridLayer::FullAttention
        } else {
            HybridLayer::LinearAttention
        }
    }
}

fn layer_types(f: &Fields<'_>, layers: usize) -> Result<Vec<HybridLayer>, ConfigError> {
    let key = "layer_types";
    let Some(v) = f.get(key) else {
        let interval = f.usize_or("full_attention_interval", 4)?;
        return Ok((0..layers).map(default_layer_type(interval)).collect());
    };
    let Value::Array(list) = v else {
        return Err(f.invalid(key, format!("expected a list of layer types, found {v}")));
    };
    if list.len() != layers {
        return Err(f.invalid(
            key,
            format!(
                "{} entries for {layers} layers (num_hidden_layers); give one type per layer",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("linear_attention") => Ok(HybridLayer::LinearAttention),
            Some("full_attention") | Some("attention") => Ok(HybridLayer::FullAttention),
            _ => Err(f.invalid(
                key,
                format!("layer {i} is {t}; this family has `linear_attention` and `full_attention` layers"),
            )),
        })
        .collect()
}

/// Every tensor of the text decoder, in a fixed order; experts in the fused form transformers
/// 5.x writes, with the per-expert names an older checkpoint uses as the alternative.
pub fn tensor_table(c: &Qwen35MoeConfig) -> Vec<TensorSpec> {
    let (h, v, p) = (c.hidden_size, c.vocab_size, c.prefix());
    let (e, i, is) = (
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    );
    let mut t = TableBuilder::default();
    t.push(
        format!("{p}embed_tokens.weight"),
        vec![v, h],
        Role::Embed,
        None,
        Init::EMBEDDING,
    );
    for (l, kind) in c.layer_types.iter().enumerate() {
        let at = |name: &str| format!("{p}layers.{l}.{name}");
        let mut push = |name: &str, shape: Vec<usize>, role: Role, init: Init| {
            t.push(at(name), shape, role, Some(l), init);
        };
        push(
            "input_layernorm.weight",
            vec![h],
            Role::InputNorm,
            Init::CENTRED_NORM,
        );
        match kind {
            HybridLayer::LinearAttention => {
                let (vd, nv) = (c.linear_value_dim(), c.linear_num_value_heads);
                let kernel = c.linear_conv_kernel_dim;
                push(
                    "linear_attn.in_proj_qkv.weight",
                    vec![c.conv_dim(), h],
                    Role::GdnInProjQkv,
                    Init::linear(h),
                );
                push(
                    "linear_attn.in_proj_z.weight",
                    vec![vd, h],
                    Role::GdnInProjZ,
                    Init::linear(h),
                );
                push(
                    "linear_attn.in_proj_b.weight",
                    vec![nv, h],
                    Role::GdnInProjB,
                    Init::linear(h),
                );
                push(
                    "linear_attn.in_proj_a.weight",
                    vec![nv, h],
                    Role::GdnInProjA,
                    Init::linear(h),
                );
                push(
                    "linear_attn.conv1d.weight",
                    vec![c.conv_dim(), 1, kernel],
                    Role::GdnConv1d,
                    Init::linear(kernel),
                );
                push("linear_attn.dt_bias", vec![nv], Role::GdnDtBias, Init::NORM);
                push(
                    "linear_attn.A_log",
                    vec![nv],
                    Role::GdnALog,
                    Init {
                        offset: 0.0,
                        scale: 1.0,
                    },
                );
                push(
                    "linear_attn.norm.weight",
                    vec![c.linear_value_head_dim],
                    Role::GdnNorm,
                    Init::NORM,
                );
                push(
                    "linear_attn.out_proj.weight",
                    vec![h, vd],
                    Role::GdnOutProj,
                    Init::linear(vd),
                );
            }
            HybridLayer::FullAttention => {
                let (q, kv, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
                push(
                    "self_attn.q_proj.weight",
                    vec![2 * q, h],
                    Role::QProj,
                    Init::linear(h),
                );
                push(
                    "self_attn.k_proj.weight",
                    vec![kv, h],
                    Role::KProj,
                    Init::linear(h),
                );
                push(
                    "self_attn.v_proj.weight",
                    vec![kv, h],
                    Role::VProj,
                    Init::linear(h),
                );
                push(
                    "self_attn.o_proj.weight",
                    vec![h, q],
                    Role::OProj,
                    Init::linear(q),
                );
                push(
                    "self_attn.q_norm.weight",
                    vec![hd],
                    Role::QNorm,
                    Init::CENTRED_NORM,
                );
                push(
                    "self_attn.k_norm.weight",
                    vec![hd],
                    Role::KNorm,
                    Init::CENTRED_NORM,
                );
            }
        }
        push(
            "post_attention_layernorm.weight",
            vec![h],
            Role::PostNorm,
            Init::CENTRED_NORM,
        );
        push(
            "mlp.gate.weight",
            vec![e, h],
            Role::MoeRouter,
            Init::linear(h),
        );
        let per_expert = |names: &[&str]| -> Vec<String> {
            (0..e)
                .flat_map(|x| {
                    names
                        .iter()
                        .map(move |n| at(&format!("mlp.experts.{x}.{n}.weight")))
                })
                .collect()
        };
        t.push(
            at("mlp.experts.gate_up_proj"),
            vec![e, 2 * i, h],
            Role::MoeExpertsGateUp,
            Some(l),
            Init::linear(h),
        )
        .stored_as_parts(per_expert(&["gate_proj", "up_proj"]), vec![i, h]);
        t.push(
            at("mlp.experts.down_proj"),
            vec![e, h, i],
            Role::MoeExpertsDown,
            Some(l),
            Init::linear(i),
        )
        .stored_as_parts(per_expert(&["down_proj"]), vec![h, i]);
        let mut push = |name: &str, shape: Vec<usize>, role: Role, init: Init| {
            t.push(at(name), shape, role, Some(l), init);
        };
        push(
            "mlp.shared_expert.gate_proj.weight",
            vec![is, h],
            Role::SharedGateProj,
            Init::linear(h),
        );
        push(
            "mlp.shared_expert.up_proj.weight",
            vec![is, h],
            Role::SharedUpProj,
            Init::linear(h),
        );
        push(
            "mlp.shared_expert.down_proj.weight",
            vec![h, is],
            Role::SharedDownProj,
            Init::linear(is),
        );
        push(
            "mlp.shared_expert_gate.weight",
            vec![1, h],
            Role::SharedExpertGate,
            Init::linear(h),
        );
    }
    t.push(
        format!("{p}norm.weight"),
        vec![h],
        Role::FinalNorm,
        None,
        Init::CENTRED_NORM,
    );
    if !c.tie_word_embeddings {
        t.push(
            "lm_head.weight".into(),
            vec![v, h],
            Role::LmHead,
            None,
            Init::linear(h),
        );
    }
    t.specs
}

/// Names a checkpoint may carry that text decode does not read: the vision tower, the
/// multi-token-prediction head, saved rotary buffers and a tied checkpoint's `lm_head.weight`.
pub fn ignorable_tensor(c: &Qwen35MoeConfig, name: &str) -> bool {
    name.starts_with("mtp.")
        || name.starts_with("model.visual.")
        || name.ends_with(".rotary_emb.inv_freq")
        || (c.tie_word_embeddings && name == "lm_head.weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_size_table_has_the_published_parameter_count() {
        let c = Qwen35MoeConfig::qwen3_6_35b_a3b();
        c.validate().unwrap();
        let params: usize = tensor_table(&c).iter().map(TensorSpec::elements).sum();
        // About 34.7 B parameters in the text decoder (docs/models.md).
        assert!((34.5e9..35.0e9).contains(&(params as f64)), "{params}");
        assert_eq!(c.attention_layers(), 10);
        assert_eq!(c.kv_bytes_per_token(), 20_480);
        // 30 linear layers: (8192 x 3 + 32 x 128 x 128) fp32 each, about 63 MB.
        assert_eq!(c.state_bytes(), 30 * (8192 * 3 + 32 * 128 * 128) * 4);
    }

    #[test]
    fn every_name_is_unique_and_layers_get_their_own_mixer() {
        let c = Qwen35MoeConfig::tiny();
        let t = tensor_table(&c);
        let mut names: Vec<&str> = t.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), t.len());
        let roles = |l: usize| -> Vec<Role> {
            t.iter()
                .filter(|s| s.layer == Some(l))
                .map(|s| s.role)
                .collect()
        };
        assert!(roles(0).contains(&Role::GdnInProjQkv) && !roles(0).contains(&Role::QProj));
        assert!(roles(3).contains(&Role::QProj) && !roles(3).contains(&Role::GdnConv1d));
        let gate_up = t
            .iter()
            .find(|s| s.role == Role::MoeExpertsGateUp && s.layer == Some(1))
            .unwrap();
        assert_eq!(gate_up.parts.len(), 2 * c.num_experts);
        assert_eq!(
            gate_up.parts[1],
            "model.layers.1.mlp.experts.0.up_proj.weight"
        );
    }

    #[test]
    fn the_conditional_layout_moves_the_decoder_under_language_model() {
        let c = Qwen35MoeConfig {
            layout: CheckpointLayout::Conditional,
            ..Qwen35MoeConfig::tiny()
        };
        let t = tensor_table(&c);
        assert_eq!(t[0].name, "model.language_model.embed_tokens.weight");
        assert_eq!(t.last().unwrap().name, "lm_head.weight");
        assert!(ignorable_tensor(&c, "mtp.layers.0.mlp.gate.weight"));
        assert!(ignorable_tensor(
            &c,
            "model.visual.blocks.0.attn.qkv.weight"
        ));
        assert!(!ignorable_tensor(
            &c,
            "model.language_model.layers.9.mlp.gate.weight"
        ));
    }
}
