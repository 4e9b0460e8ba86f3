//! Model families, one file each: the hyperparameters read from config.json, the tensor table
//! (names, shapes, synthetic init) and the equations. [`ModelConfig`] picks the family by
//! `model_type`; the engine and the scheduler see only its [`ModelDesc`].

pub mod qwen3;
pub mod qwen3_5_moe;
pub mod tensor;

use std::path::Path;

use serde::Serialize;

use crate::config::{parse_root, read_config_text, ConfigError, Fields};
pub use qwen3::Qwen3Config;
pub use qwen3_5_moe::{CheckpointLayout, HybridLayer, Qwen35MoeConfig};
pub use tensor::{Init, Role, TensorSpec};

/// A model's hyperparameters, by family.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum ModelConfig {
    /// Dense Qwen3 (`model_type` `qwen3`).
    Qwen3(Qwen3Config),
    /// Hybrid Qwen3.5/3.6 MoE (`qwen3_5_moe_text`, or `qwen3_5_moe` with a `text_config`).
    Qwen35Moe(Qwen35MoeConfig),
}

/// Most decoder layers a config may give.
pub const MAX_LAYERS: usize = 1024;
/// Most routed experts a config may give.
pub const MAX_EXPERTS: usize = 1024;
/// Most parameters a model may have (2^40, a trillion): every size in bytes derived from the
/// shapes (weights, KV cache per token, recurrent state) then fits `usize` with room to spare.
pub const MAX_PARAMETERS: u128 = 1 << 40;

/// Checks a family's tensor table against [`MAX_PARAMETERS`] (in u128, so that no product can
/// overflow); call it with the layer and expert counts already within their bounds.
fn check_parameters(table: &[TensorSpec]) -> Result<(), (&'static str, String)> {
    let total: u128 = table
        .iter()
        .map(|t| t.shape.iter().map(|&d| d as u128).product::<u128>())
        .sum();
    if total > MAX_PARAMETERS {
        return Err((
            "hidden_size",
            format!(
                "the sizes add up to {total} parameters, more than the {MAX_PARAMETERS} this engine holds; check hidden_size, the intermediate sizes, the head counts and dims, num_experts and num_hidden_layers"
            ),
        ));
    }
    Ok(())
}

/// [`MAX_LAYERS`] for `num_hidden_layers`.
fn check_layers(layers: usize) -> Result<(), (&'static str, String)> {
    if layers > MAX_LAYERS {
        return Err((
            "num_hidden_layers",
            format!("{layers} layers; at most {MAX_LAYERS} are supported"),
        ));
    }
    Ok(())
}

/// The `model_type`s this engine serves, for messages.
const SERVED: &str =
    "`qwen3` (e.g. Qwen/Qwen3-4B), `qwen3_5_moe` and `qwen3_5_moe_text` (Qwen3.5/3.6-35B-A3B)";

impl ModelConfig {
    /// Reads `config.json` of a Hugging Face model folder.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(&read_config_text(path)?, &path.display().to_string())
    }

    /// Parses config.json text; `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let root = parse_root(text, origin)?;
        let f = Fields::new(&root, origin, "");
        if let Some(q) = f.get("quantization_config") {
            let method = q
                .get("quant_method")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("unnamed");
            return Err(f.invalid(
                "quantization_config",
                format!("the weights are `{method}`-quantized; this engine reads bf16, f16 or f32 weights: use the model's unquantized release"),
            ));
        }
        match f.str("model_type") {
            Some("qwen3") => Ok(ModelConfig::Qwen3(Qwen3Config::from_fields(&f)?)),
            Some("qwen3_5_moe_text") => Ok(ModelConfig::Qwen35Moe(Qwen35MoeConfig::from_fields(
                &f,
                CheckpointLayout::TextOnly,
            )?)),
            Some("qwen3_5_moe") => {
                let text = f.object("text_config", "text_config.")?;
                let mut c = Qwen35MoeConfig::from_fields(&text, CheckpointLayout::Conditional)?;
                // The outer config may carry the end tokens and the tie instead of the inner one.
                if c.eos_token_ids.is_empty() {
                    c.eos_token_ids = f.eos_token_ids()?;
                }
                c.tie_word_embeddings |= f.bool_or("tie_word_embeddings", false)?;
                Ok(ModelConfig::Qwen35Moe(c))
            }
            Some(other) => Err(f.invalid(
                "model_type",
                format!("`{other}` is not served by this engine; it runs {SERVED}"),
            )),
            None => Err(f.invalid(
                "model_type",
                format!("missing; config.json names its family there, one of {SERVED}"),
            )),
        }
    }

    /// The `model_type` this config is served as.
    pub fn model_type(&self) -> &'static str {
        match self {
            ModelConfig::Qwen3(_) => "qwen3",
            ModelConfig::Qwen35Moe(c) => match c.layout {
                CheckpointLayout::TextOnly => "qwen3_5_moe_text",
                CheckpointLayout::Conditional => "qwen3_5_moe",
            },
        }
    }

    /// Every tensor the model reads, in a fixed order.
    pub fn tensor_table(&self) -> Vec<TensorSpec> {
        match self {
            ModelConfig::Qwen3(c) => qwen3::tensor_table(c),
            ModelConfig::Qwen35Moe(c) => qwen3_5_moe::tensor_table(c),
        }
    }

    /// A checkpoint tensor the model does not read and the loader may skip.
    pub fn ignorable_tensor(&self, name: &str) -> bool {
        match self {
            ModelConfig::Qwen3(c) => qwen3::ignorable_tensor(c, name),
            ModelConfig::Qwen35Moe(c) => qwen3_5_moe::ignorable_tensor(c, name),
        }
    }

    /// The dense config, for code that serves only that family.
    pub fn as_qwen3(&self) -> Option<&Qwen3Config> {
        match self {
            ModelConfig::Qwen3(c) => Some(c),
            _ => None,
        }
    }

    /// The same model cut to its first `layers` decoder layers (the hybrid family's layer pattern
    /// as it starts), or why not: `layers` must be from 1 to the model's count, and the layers
    /// kept must hold every kind of layer the model has, so that each of its kernels still runs.
    pub fn first_layers(&self, layers: usize) -> Result<ModelConfig, String> {
        let total = self.describe().layers.len();
        if layers == 0 || layers > total {
            return Err(format!(
                "{layers} layers asked for; this model has {total}: give 1 to {total}"
            ));
        }
        match self {
            ModelConfig::Qwen3(c) => Ok(ModelConfig::Qwen3(Qwen3Config {
                num_hidden_layers: layers,
                ..c.clone()
            })),
            ModelConfig::Qwen35Moe(c) => {
                let kept = &c.layer_types[..layers];
                if let Some(missing) = [HybridLayer::LinearAttention, HybridLayer::FullAttention]
                    .into_iter()
                    .find(|k| c.layer_types.contains(k) && !kept.contains(k))
                {
                    let first = c
                        .layer_types
                        .iter()
                        .position(|t| *t == missing)
                        .unwrap_or(0);
                    let kind = match missing {
                        HybridLayer::LinearAttention => "linear_attention (Gated DeltaNet)",
                        HybridLayer::FullAttention => "full_attention",
                    };
                    return Err(format!(
                        "the first {layers} layers hold no {kind} layer (the first is layer {first}): give at least {}",
                        first + 1
                    ));
                }
                Ok(ModelConfig::Qwen35Moe(Qwen35MoeConfig {
                    num_hidden_layers: layers,
                    layer_types: kept.to_vec(),
                    ..c.clone()
                }))
            }
        }
    }

    /// What the engine and the scheduler need to know of the model.
    pub fn describe(&self) -> ModelDesc {
        let parameter_count = self
            .tensor_table()
            .iter()
            .map(|t| t.elements() as u64)
            .sum();
        match self {
            ModelConfig::Qwen3(c) => ModelDesc {
                model_type: self.model_type(),
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                max_context: c.max_position_embeddings,
                eos_token_ids: c.eos_token_ids.clone(),
                layers: vec![LayerKind::Attention; c.num_hidden_layers],
                kv_bytes_per_token: c.kv_bytes_per_token(),
                state_bytes: 0,
                parameter_count,
            },
            ModelConfig::Qwen35Moe(c) => ModelDesc {
                model_type: self.model_type(),
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                max_context: c.max_position_embeddings,
                eos_token_ids: c.eos_token_ids.clone(),
                layers: c
                    .layer_types
                    .iter()
                    .map(|t| match t {
                        HybridLayer::FullAttention => LayerKind::Attention,
                        HybridLayer::LinearAttention => LayerKind::Recurrent,
                    })
                    .collect(),
                kv_bytes_per_token: c.kv_bytes_per_token(),
                state_bytes: c.state_bytes(),
                parameter_count,
            },
        }
    }
}

/// Which part of the memory a layer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Keys and values in the paged KV cache, one row per position.
    Attention,
    /// A fixed-size state per sequence, advanced by every token.
    Recurrent,
}

/// The small description of a model that the engine and the scheduler work from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelDesc {
    pub model_type: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Longest sequence the model's positions cover (`max_position_embeddings`).
    pub max_context: usize,
    pub eos_token_ids: Vec<u32>,
    pub layers: Vec<LayerKind>,
    /// KV cache bytes per token in bf16, over the attention layers.
    pub kv_bytes_per_token: usize,
    /// Recurrent state bytes of one sequence (0 when no layer is recurrent).
    pub state_bytes: usize,
    /// Parameters the model reads (a tied lm_head counted once).
    pub parameter_count: u64,
}

impl ModelDesc {
    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.layers.get(layer) == Some(&LayerKind::Recurrent)
    }

    /// A request needs a recurrent-state slot as well as KV blocks.
    pub fn has_recurrent_state(&self) -> bool {
        self.state_bytes > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid_text_config() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen3_5_moe_text", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32, "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "eos_token_id": 3
        })
    }

    #[test]
    fn both_hybrid_layouts_read_to_the_same_decoder() {
        let text = hybrid_text_config();
        let a = ModelConfig::from_json(&text.to_string(), "a/config.json").unwrap();
        let wrapped = serde_json::json!({
            "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "text_config": text, "vision_config": {"depth": 2}
        });
        let b = ModelConfig::from_json(&wrapped.to_string(), "b/config.json").unwrap();
        let (ModelConfig::Qwen35Moe(a), ModelConfig::Qwen35Moe(b)) = (a, b) else {
            panic!("both are hybrid configs")
        };
        assert_eq!(a.layout, CheckpointLayout::TextOnly);
        assert_eq!(b.layout, CheckpointLayout::Conditional);
        assert_eq!(
            Qwen35MoeConfig {
                layout: a.layout,
                ..b
            },
            a
        );
        assert_eq!(a.rotary_dim, 8);
        assert_eq!(a.eos_token_ids, vec![3]);
    }

    #[test]
    fn hybrid_errors_name_the_nested_key() {
        let mut text = hybrid_text_config();
        text["layer_types"] = serde_json::json!(["linear_attention", "sliding_attention"]);
        let wrapped = serde_json::json!({"model_type": "qwen3_5_moe", "text_config": text});
        let err = ModelConfig::from_json(&wrapped.to_string(), "m/config.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`text_config.layer_types`") && err.contains("sliding_attention"),
            "{err}"
        );
        let err = ModelConfig::from_json(r#"{"model_type": "llama"}"#, "c")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("llama") && err.contains("qwen3_5_moe"),
            "{err}"
        );
    }

    #[test]
    fn sizes_past_any_model_are_refused_by_name_before_anything_is_built() {
        let err = |patch: serde_json::Value| {
            let mut text = hybrid_text_config();
            for (k, v) in patch.as_object().unwrap() {
                text[k] = v.clone();
            }
            ModelConfig::from_json(&text.to_string(), "m/config.json")
                .unwrap_err()
                .to_string()
        };
        // A layer count that would make the layer list itself exhaust memory.
        let e = err(serde_json::json!({"num_hidden_layers": 1_000_000_000_000_000u64}));
        assert!(
            e.contains("`num_hidden_layers`") && e.contains("at most 16777216"),
            "{e}"
        );
        let e = err(serde_json::json!({"num_hidden_layers": 5000, "layer_types": null}));
        assert!(
            e.contains("`num_hidden_layers`") && e.contains("at most 1024"),
            "{e}"
        );
        let e = err(serde_json::json!({"num_experts": 4096}));
        assert!(
            e.contains("`num_experts`") && e.contains("at most 1024"),
            "{e}"
        );
        let e = err(serde_json::json!({"quantization_config": {"quant_method": "fp8"}}));
        assert!(
            e.contains("`quantization_config`") && e.contains("`fp8`") && e.contains("unquantized"),
            "{e}"
        );
        // Each size within bounds, their products past 2^40 parameters (the experts alone 2^52).
        let e = err(serde_json::json!({"hidden_size": 1 << 20, "moe_intermediate_size": 1 << 20}));
        assert!(e.contains("parameters") && e.contains("num_experts"), "{e}");

        let dense = serde_json::json!({
            "model_type": "qwen3", "vocab_size": 512, "hidden_size": 1 << 24,
            "intermediate_size": 1 << 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048,
            "rope_theta": 1e6
        });
        let e = ModelConfig::from_json(&dense.to_string(), "d/config.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`hidden_size`") && e.contains("parameters"),
            "{e}"
        );
    }

    #[test]
    fn dense_features_the_kernels_lack_are_refused_by_key() {
        let base = serde_json::json!({
            "model_type": "qwen3", "vocab_size": 512, "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048,
            "rope_theta": 1e6, "hidden_act": "silu", "use_sliding_window": false,
            "layer_types": ["full_attention", "full_attention"]
        });
        assert!(ModelConfig::from_json(&base.to_string(), "d").is_ok());
        for (key, value, says) in [
            (
                "use_sliding_window",
                serde_json::json!(true),
                "sliding-window",
            ),
            ("hidden_act", serde_json::json!("gelu"), "`gelu`"),
            (
                "layer_types",
                serde_json::json!(["full_attention", "sliding_attention"]),
                "layer 1 is \"sliding_attention\"",
            ),
        ] {
            let mut v = base.clone();
            v[key] = value;
            let e = ModelConfig::from_json(&v.to_string(), "d")
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{key}`")) && e.contains(says), "{e}");
        }
    }

    #[test]
    fn the_description_splits_memory_by_layer_kind() {
        let dense = ModelConfig::Qwen3(Qwen3Config::qwen3_4b()).describe();
        assert!(!dense.has_recurrent_state());
        assert_eq!(dense.kv_bytes_per_token, 147_456);
        assert_eq!(dense.parameter_count, 4_022_468_096);
        let hybrid = ModelConfig::Qwen35Moe(Qwen35MoeConfig::tiny()).describe();
        assert!(hybrid.has_recurrent_state());
        assert!(hybrid.is_recurrent(0) && !hybrid.is_recurrent(3));
        assert_eq!(hybrid.kv_bytes_per_token, 2 * 2 * 64 * 2);
    }
}
