//! Qwen3 (dense): the hyperparameters (`model_type` `qwen3`), the tensor table and the equations.
//! Every weight the model reads, with its Hugging Face name, its shape and how a synthetic model
//! initialises it. The table drives the loader's checks, the synthetic-weight generator and the
//! runners' uploads; the forward pass lives with each runner (`cpu::qwen3`, `gpu::GpuRunner`) and
//! reads like these equations (docs/models.md):
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

use super::tensor::{Init, Role, TableBuilder, TensorSpec};
use crate::config::{ConfigError, Fields};

/// Shapes and constants of a dense Qwen3 model (`model_type` `qwen3`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Tokens that end a generation (`eos_token_id`, a number or a list).
    pub eos_token_ids: Vec<u32>,
}

impl Qwen3Config {
    /// Head counts times head size: the width of the attention input and output.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Rows of the fused `[q | k | v]` projection.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }

    /// Query heads that share one key/value head.
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Number of parameters (the tied lm_head counted once).
    pub fn parameter_count(&self) -> u64 {
        tensor_table(self)
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum()
    }

    /// KV cache bytes per token in bf16 (keys and values of every layer).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.num_hidden_layers * 2 * self.kv_dim() * 2
    }

    /// The built-in small model (`--model tiny`): seeded random weights, a byte-level tokenizer.
    /// Its shapes exercise what the real ones do: GQA 2:1, head_dim 64, a hidden size and an MLP
    /// width that are not powers of two.
    pub fn tiny() -> Self {
        Qwen3Config {
            vocab_size: 384,
            hidden_size: 320,
            intermediate_size: 864,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 64,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            eos_token_ids: vec![],
        }
    }

    /// The shapes of Qwen3-4B (docs/models.md), for running the full-size model without a download.
    pub fn qwen3_4b() -> Self {
        Qwen3Config {
            vocab_size: 151_936,
            hidden_size: 2560,
            intermediate_size: 9728,
            num_hidden_layers: 36,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            max_position_embeddings: 40_960,
            tie_word_embeddings: true,
            eos_token_ids: vec![151_645, 151_643],
        }
    }

    /// Reads the fields of a `qwen3` config.json (as transformers 4.x and 5.x write them).
    pub fn from_fields(f: &Fields<'_>) -> Result<Self, ConfigError> {
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let num_key_value_heads = f.usize_or("num_key_value_heads", num_attention_heads)?;
        let head_dim = f.usize_or("head_dim", hidden_size / num_attention_heads)?;
        let rope_theta = f.rope()?.theta;
        f.refuse_true(
            "attention_bias",
            "projections with biases are not supported (Qwen3 has none)",
        )?;
        f.refuse_true(
            "use_sliding_window",
            "sliding-window attention is not supported; every layer attends to the whole context",
        )?;
        if let Some(act) = f.str("hidden_act").filter(|a| *a != "silu") {
            return Err(f.invalid(
                "hidden_act",
                format!("`{act}` is not supported; the MLP kernels compute silu"),
            ));
        }
        if let Some(serde_json::Value::Array(types)) = f.get("layer_types") {
            if let Some((i, t)) = types
                .iter()
                .enumerate()
                .find(|(_, t)| t.as_str() != Some("full_attention"))
            {
                return Err(f.invalid(
                    "layer_types",
                    format!("layer {i} is {t}; only full_attention layers are supported"),
                ));
            }
        }
        let config = Qwen3Config {
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            max_position_embeddings: f.usize("max_position_embeddings")?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            eos_token_ids: f.eos_token_ids()?,
        };
        config
            .validate()
            .map_err(|(key, message)| f.invalid(key, message))?;
        Ok(config)
    }

    /// Checks the relations the kernels rely on; `(key, message)` names what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err((
                "num_key_value_heads",
                format!(
                    "{} attention heads are not a multiple of {} key/value heads",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !SUPPORTED_HEAD_DIMS.contains(&self.head_dim) {
            return Err((
                "head_dim",
                format!("{} is not supported; the attention kernels are built for {SUPPORTED_HEAD_DIMS:?}", self.head_dim),
            ));
        }
        if self.gqa_group() > MAX_GQA_GROUP {
            return Err((
                "num_attention_heads",
                format!(
                    "{} query heads per key/value head; at most {MAX_GQA_GROUP} are supported",
                    self.gqa_group()
                ),
            ));
        }
        if !self.hidden_size.is_multiple_of(8) || !self.intermediate_size.is_multiple_of(8) {
            return Err((
                "hidden_size",
                format!(
                    "hidden_size {} and intermediate_size {} must be multiples of 8 (16-byte weight rows)",
                    self.hidden_size, self.intermediate_size
                ),
            ));
        }
        if self.vocab_size > i32::MAX as usize {
            return Err((
                "vocab_size",
                format!("{} does not fit a 32-bit token id", self.vocab_size),
            ));
        }
        super::check_layers(self.num_hidden_layers)?;
        super::check_parameters(&tensor_table(self))
    }
}

/// Head sizes the attention kernels are instantiated for.
pub const SUPPORTED_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Most query heads per key/value head the attention kernels hold.
pub const MAX_GQA_GROUP: usize = 8;

/// Every tensor of the model, in a fixed order (the order is also each tensor's index for the
/// synthetic generator, so it never changes for a given config).
pub fn tensor_table(c: &Qwen3Config) -> Vec<TensorSpec> {
    let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let mut t = TableBuilder::default();
    t.push(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        Role::Embed,
        None,
        Init::EMBEDDING,
    );
    for l in 0..c.num_hidden_layers {
        let mut push = |name: &str, shape: Vec<usize>, role: Role, init: Init| {
            t.push(
                format!("model.layers.{l}.{name}"),
                shape,
                role,
                Some(l),
                init,
            );
        };
        push(
            "input_layernorm.weight",
            vec![h],
            Role::InputNorm,
            Init::NORM,
        );
        let (q, kv, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
        push(
            "self_attn.q_proj.weight",
            vec![q, h],
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
        push("self_attn.q_norm.weight", vec![hd], Role::QNorm, Init::NORM);
        push("self_attn.k_norm.weight", vec![hd], Role::KNorm, Init::NORM);
        push(
            "post_attention_layernorm.weight",
            vec![h],
            Role::PostNorm,
            Init::NORM,
        );
        push(
            "mlp.gate_proj.weight",
            vec![i, h],
            Role::GateProj,
            Init::linear(h),
        );
        push(
            "mlp.up_proj.weight",
            vec![i, h],
            Role::UpProj,
            Init::linear(h),
        );
        push(
            "mlp.down_proj.weight",
            vec![h, i],
            Role::DownProj,
            Init::linear(i),
        );
    }
    t.push(
        "model.norm.weight".into(),
        vec![h],
        Role::FinalNorm,
        None,
        Init::NORM,
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

/// Names a checkpoint may carry that the model does not read: a tied checkpoint's
/// `lm_head.weight`, and rotary buffers older exports saved (recomputed from `rope_theta`).
pub fn ignorable_tensor(c: &Qwen3Config, name: &str) -> bool {
    (c.tie_word_embeddings && name == "lm_head.weight") || name.ends_with(".rotary_emb.inv_freq")
}

#[cfg(test)]
mod config_tests {
    use super::*;
    use crate::model::ModelConfig;
    use serde_json::Value;

    fn base() -> serde_json::Map<String, Value> {
        serde_json::json!({
            "model_type": "qwen3", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 344,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": true,
            "eos_token_id": 7
        })
        .as_object()
        .unwrap()
        .clone()
    }

    fn parse(m: &serde_json::Map<String, Value>) -> Result<Qwen3Config, ConfigError> {
        match ModelConfig::from_json(&Value::Object(m.clone()).to_string(), "config.json")? {
            ModelConfig::Qwen3(c) => Ok(c),
            other => panic!("a qwen3 config parsed as {}", other.model_type()),
        }
    }

    #[test]
    fn reads_rope_theta_as_4x_and_5x_write_it() {
        let mut v4 = base();
        v4.insert("rope_theta".into(), serde_json::json!(1e6));
        let mut v5 = base();
        v5.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 5e6}),
        );
        assert_eq!(parse(&v4).unwrap().rope_theta, 1e6);
        assert_eq!(parse(&v5).unwrap().rope_theta, 5e6);
        let mut neither = base();
        neither.remove("rope_theta");
        let err = parse(&neither).unwrap_err().to_string();
        assert!(
            err.contains("rope_theta") && err.contains("missing"),
            "{err}"
        );
        let mut yarn = base();
        yarn.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
        );
        assert!(parse(&yarn).unwrap_err().to_string().contains("yarn"));
    }

    #[test]
    fn names_the_wrong_model_type_and_bad_fields() {
        let mut m = base();
        m.insert("rope_theta".into(), serde_json::json!(1e6));
        m.insert("model_type".into(), serde_json::json!("llama"));
        let err = parse(&m).unwrap_err().to_string();
        assert!(err.contains("model_type") && err.contains("llama"), "{err}");

        let mut m = base();
        m.insert("rope_theta".into(), serde_json::json!(1e6));
        m.insert("num_key_value_heads".into(), serde_json::json!(3));
        let err = parse(&m).unwrap_err().to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");

        let mut m = base();
        m.insert("rope_theta".into(), serde_json::json!(1e6));
        m.insert("hidden_size".into(), serde_json::json!(-5));
        assert!(parse(&m).unwrap_err().to_string().contains("hidden_size"));

        let err = ModelConfig::from_json("{not json", "x/config.json")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("x/config.json: not valid JSON"), "{err}");
    }

    #[test]
    fn defaults_and_eos_lists() {
        let mut m = base();
        m.insert("rope_theta".into(), serde_json::json!(1e6));
        m.remove("head_dim");
        m.remove("num_key_value_heads");
        m.insert("hidden_size".into(), serde_json::json!(256));
        m.insert("eos_token_id".into(), serde_json::json!([1, 2]));
        let c = parse(&m).unwrap();
        assert_eq!((c.head_dim, c.num_key_value_heads), (64, 4));
        assert_eq!(c.eos_token_ids, vec![1, 2]);
    }

    #[test]
    fn presets_are_valid_and_4b_has_the_published_size() {
        Qwen3Config::tiny().validate().unwrap();
        let c = Qwen3Config::qwen3_4b();
        c.validate().unwrap();
        assert_eq!(c.parameter_count(), 4_022_468_096);
        assert_eq!(c.kv_bytes_per_token(), 147_456);
    }
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
