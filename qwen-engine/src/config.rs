//! The model's hyperparameters: read from a Hugging Face `config.json` (as transformers 4.x and
//! 5.x write it) or taken from a built-in preset (`tiny`, `qwen3-4b`).

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

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

/// A config that cannot be served, naming the file, the key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read config.json: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {message}")]
    Syntax { path: String, message: String },
    #[error("{path}: `{key}`: {message}")]
    Invalid {
        path: String,
        key: String,
        message: String,
    },
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
        crate::model::qwen3::tensor_table(self)
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

    /// Reads `config.json` of a Hugging Face model folder.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses config.json text; `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: origin.to_string(),
            key: key.to_string(),
            message,
        };
        let obj = root
            .as_object()
            .ok_or_else(|| invalid("(root)", "expected a JSON object".into()))?;

        match obj.get("model_type").and_then(Value::as_str) {
            Some("qwen3") => {}
            Some(other) => {
                return Err(invalid(
                    "model_type",
                    format!("`{other}` is not served by this engine; it runs dense Qwen3 models (`qwen3`, e.g. Qwen/Qwen3-4B)"),
                ))
            }
            None => {
                return Err(invalid(
                    "model_type",
                    "missing; a Qwen3 config.json has \"model_type\": \"qwen3\"".into(),
                ))
            }
        }

        let usize_key = |key: &str| -> Result<usize, ConfigError> {
            match obj.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        invalid(key, format!("expected a positive whole number, found {v}"))
                    }),
                None => Err(invalid(key, "missing".into())),
            }
        };
        let f64_key = |v: &Value, key: &str| -> Result<f64, ConfigError> {
            v.as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| invalid(key, format!("expected a positive number, found {v}")))
        };

        let hidden_size = usize_key("hidden_size")?;
        let num_attention_heads = usize_key("num_attention_heads")?;
        let num_key_value_heads = match obj.get("num_key_value_heads") {
            Some(Value::Null) | None => num_attention_heads,
            Some(_) => usize_key("num_key_value_heads")?,
        };
        let head_dim = match obj.get("head_dim") {
            Some(Value::Null) | None => hidden_size / num_attention_heads,
            Some(_) => usize_key("head_dim")?,
        };
        let rope_theta = rope_theta(obj, &invalid, &f64_key)?;
        let rms_norm_eps = match obj.get("rms_norm_eps") {
            Some(v) => f64_key(v, "rms_norm_eps")?,
            None => 1e-6,
        };
        let tie_word_embeddings = match obj.get("tie_word_embeddings") {
            Some(Value::Bool(b)) => *b,
            None => false,
            Some(v) => {
                return Err(invalid(
                    "tie_word_embeddings",
                    format!("expected true or false, found {v}"),
                ))
            }
        };
        if let Some(v) = obj.get("attention_bias") {
            if v.as_bool() == Some(true) {
                return Err(invalid(
                    "attention_bias",
                    "true: projections with biases are not supported (Qwen3 has none)".into(),
                ));
            }
        }
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Number(n)) => vec![token_id(n, &invalid)?],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::Number(n) => token_id(n, &invalid),
                    other => Err(invalid(
                        "eos_token_id",
                        format!("expected token ids, found {other}"),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(invalid(
                    "eos_token_id",
                    format!("expected a token id or a list, found {v}"),
                ))
            }
        };

        let config = Qwen3Config {
            vocab_size: usize_key("vocab_size")?,
            hidden_size,
            intermediate_size: usize_key("intermediate_size")?,
            num_hidden_layers: usize_key("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            max_position_embeddings: usize_key("max_position_embeddings")?,
            tie_word_embeddings,
            eos_token_ids,
        };
        config
            .validate()
            .map_err(|(key, message)| invalid(key, message))?;
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
        Ok(())
    }
}

/// Head sizes the attention kernels are instantiated for.
pub const SUPPORTED_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Most query heads per key/value head the attention kernels hold.
pub const MAX_GQA_GROUP: usize = 8;

fn token_id(
    n: &serde_json::Number,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<u32, ConfigError> {
    n.as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| invalid("eos_token_id", format!("`{n}` is not a token id")))
}

/// transformers 4.x writes `rope_theta` at the top level (and maybe `rope_scaling`); 5.x writes
/// `rope_parameters: {rope_type, rope_theta}`. Only plain RoPE is served.
fn rope_theta(
    obj: &serde_json::Map<String, Value>,
    invalid: &dyn Fn(&str, String) -> ConfigError,
    f64_key: &dyn Fn(&Value, &str) -> Result<f64, ConfigError>,
) -> Result<f64, ConfigError> {
    let check_type = |key: &str, params: &Value| -> Result<(), ConfigError> {
        match params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
        {
            None | Some("default") => Ok(()),
            Some(other) => Err(invalid(
                key,
                format!(
                    "rope_type `{other}` is not supported; this engine implements default RoPE"
                ),
            )),
        }
    };
    if let Some(params) = obj.get("rope_parameters").filter(|v| !v.is_null()) {
        check_type("rope_parameters", params)?;
        if let Some(theta) = params.get("rope_theta") {
            return f64_key(theta, "rope_parameters.rope_theta");
        }
    }
    if let Some(scaling) = obj.get("rope_scaling").filter(|v| !v.is_null()) {
        check_type("rope_scaling", scaling)?;
    }
    match obj.get("rope_theta") {
        Some(v) => f64_key(v, "rope_theta"),
        None => Err(invalid(
            "rope_theta",
            "missing: expected `rope_theta` (transformers 4.x) or `rope_parameters.rope_theta` (5.x)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        Qwen3Config::from_json(&Value::Object(m.clone()).to_string(), "config.json")
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

        let err = Qwen3Config::from_json("{not json", "x/config.json")
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
