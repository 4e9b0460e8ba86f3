//! Reading a Hugging Face `config.json`: the error type and a reader of typed fields whose every
//! error names the file, the key and the fix. Each model family (`crate::model`) reads its own
//! fields through [`Fields`]; `crate::model::ModelConfig` picks the family by `model_type`.

use std::path::Path;

use serde_json::{Map, Value};

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

/// The largest size, count or length a config.json may give (2^24): a million-token context and
/// a vocabulary of 248k fit; a value past it is a typo or a hostile file.
pub const MAX_CONFIG_SIZE: usize = 1 << 24;

/// Reads a config file's text; the error names the file.
pub fn read_config_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Parses config text into its root object; `origin` names the file in errors.
pub fn parse_root(text: &str, origin: &str) -> Result<Map<String, Value>, ConfigError> {
    let root: Value = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    match root {
        Value::Object(obj) => Ok(obj),
        _ => Err(ConfigError::Invalid {
            path: origin.to_string(),
            key: "(root)".into(),
            message: "expected a JSON object".into(),
        }),
    }
}

/// The fields of one JSON object of a config (the root, or a nested `text_config`), read with
/// errors that name the key as the user sees it (`text_config.hidden_size`).
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    origin: &'a str,
    /// Key path of this object in the file, empty or ending with `.`.
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Map<String, Value>, origin: &'a str, prefix: &'a str) -> Self {
        Fields {
            obj,
            origin,
            prefix,
        }
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// An error about `key` of this object.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.origin.to_string(),
            key: format!("{}{key}", self.prefix),
            message: message.into(),
        }
    }

    /// The nested object `key` (e.g. `text_config`), or an error naming it.
    pub fn object(&self, key: &str, prefix: &'a str) -> Result<Fields<'a>, ConfigError> {
        match self.get(key) {
            Some(Value::Object(obj)) => Ok(Fields::new(obj, self.origin, prefix)),
            Some(v) => Err(self.invalid(key, format!("expected an object, found {v}"))),
            None => Err(self.invalid(key, "missing")),
        }
    }

    pub fn str(&self, key: &str) -> Option<&'a str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A positive whole number that must be present, at most [`MAX_CONFIG_SIZE`] (no model size
    /// comes near it, and the products of sizes stay far from overflow).
    pub fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        match self.get(key) {
            Some(v) => match v.as_u64().filter(|&n| n > 0) {
                Some(n) if n > MAX_CONFIG_SIZE as u64 => Err(self.invalid(
                    key,
                    format!("{n} is larger than any model size this engine takes (at most {MAX_CONFIG_SIZE}); check the value"),
                )),
                Some(n) => Ok(n as usize),
                None => Err(self.invalid(key, format!("expected a positive whole number, found {v}"))),
            },
            None => Err(self.invalid(key, "missing")),
        }
    }

    /// A positive whole number, `default` when absent or null.
    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    /// A positive finite number read from `v` (the value of `key`).
    pub fn positive_f64(&self, v: &Value, key: &str) -> Result<f64, ConfigError> {
        v.as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| self.invalid(key, format!("expected a positive number, found {v}")))
    }

    /// A positive finite number, `default` when absent or null.
    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => self.positive_f64(v, key),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.invalid(key, format!("expected true or false, found {v}"))),
        }
    }

    /// Refuses `key: true` (a feature the engine does not implement), naming why.
    pub fn refuse_true(&self, key: &str, why: &str) -> Result<(), ConfigError> {
        match self.get(key) {
            Some(Value::Bool(true)) => Err(self.invalid(key, format!("true: {why}"))),
            _ => Ok(()),
        }
    }

    /// Tokens that end a generation: `eos_token_id`, a number or a list (empty when absent).
    pub fn eos_token_ids(&self) -> Result<Vec<u32>, ConfigError> {
        let key = "eos_token_id";
        let id = |v: &Value| -> Result<u32, ConfigError> {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.invalid(key, format!("`{v}` is not a token id")))
        };
        match self.get(key) {
            None => Ok(vec![]),
            Some(v @ Value::Number(_)) => Ok(vec![id(v)?]),
            Some(Value::Array(a)) => a.iter().map(id).collect(),
            Some(v) => Err(self.invalid(key, format!("expected a token id or a list, found {v}"))),
        }
    }

    /// The RoPE parameters: transformers 4.x writes `rope_theta` at the top level (maybe with
    /// `rope_scaling`); 5.x writes `rope_parameters: {rope_type, rope_theta, ...}`. Only plain
    /// RoPE is served; `rope_parameters` is returned for family-specific keys.
    pub fn rope(&self) -> Result<RopeFields<'a>, ConfigError> {
        let check_type = |key: &str, params: &Value| -> Result<(), ConfigError> {
            match params
                .get("rope_type")
                .or_else(|| params.get("type"))
                .and_then(Value::as_str)
            {
                None | Some("default") => Ok(()),
                Some(other) => Err(self.invalid(
                    key,
                    format!(
                        "rope_type `{other}` is not supported; this engine implements default RoPE"
                    ),
                )),
            }
        };
        // Checked whichever way theta is given: a yarn block beside 5.x's `rope_parameters` is
        // still a scaling this engine does not implement.
        if let Some(scaling) = self.get("rope_scaling") {
            check_type("rope_scaling", scaling)?;
        }
        let params = self.get("rope_parameters");
        if let Some(params) = params {
            check_type("rope_parameters", params)?;
            if let Some(theta) = params.get("rope_theta") {
                return Ok(RopeFields {
                    theta: self.positive_f64(theta, "rope_parameters.rope_theta")?,
                    params,
                });
            }
        }
        match self.get("rope_theta") {
            Some(v) => Ok(RopeFields {
                theta: self.positive_f64(v, "rope_theta")?,
                params: params.unwrap_or(&Value::Null),
            }),
            None => Err(self.invalid(
                "rope_theta",
                "missing: expected `rope_theta` (transformers 4.x) or `rope_parameters.rope_theta` (5.x)",
            )),
        }
    }
}

/// What [`Fields::rope`] found.
#[derive(Debug, Clone, Copy)]
pub struct RopeFields<'a> {
    pub theta: f64,
    /// `rope_parameters` as written (`Null` when the config has none).
    pub params: &'a Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn nested_objects_name_their_keys_with_the_path() {
        let obj = fields_of(serde_json::json!({"text_config": {"hidden_size": -1}}));
        let root = Fields::new(&obj, "m/config.json", "");
        let text = root.object("text_config", "text_config.").unwrap();
        let err = text.usize("hidden_size").unwrap_err().to_string();
        assert_eq!(
            err,
            "m/config.json: `text_config.hidden_size`: expected a positive whole number, found -1"
        );
        assert!(root
            .object("vision_config", "vision_config.")
            .unwrap_err()
            .to_string()
            .contains("`vision_config`: missing"));
    }

    #[test]
    fn eos_ids_are_a_number_a_list_or_nothing() {
        for (v, want) in [
            (serde_json::json!({"eos_token_id": 7}), Some(vec![7])),
            (
                serde_json::json!({"eos_token_id": [1, 2]}),
                Some(vec![1, 2]),
            ),
            (serde_json::json!({"eos_token_id": null}), Some(vec![])),
            (serde_json::json!({"eos_token_id": "x"}), None),
            (serde_json::json!({"eos_token_id": [-1]}), None),
        ] {
            let obj = fields_of(v);
            assert_eq!(Fields::new(&obj, "c", "").eos_token_ids().ok(), want);
        }
    }

    #[test]
    fn a_rope_scaling_is_refused_beside_either_form_of_theta() {
        let yarn = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        for v in [
            serde_json::json!({"rope_theta": 1e6, "rope_scaling": yarn}),
            serde_json::json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": yarn}),
        ] {
            let obj = fields_of(v);
            let err = Fields::new(&obj, "c", "").rope().unwrap_err().to_string();
            assert!(
                err.contains("`rope_scaling`") && err.contains("yarn"),
                "{err}"
            );
        }
        let obj = fields_of(serde_json::json!({"rope_theta": 1e6, "rope_scaling": null}));
        assert_eq!(Fields::new(&obj, "c", "").rope().unwrap().theta, 1e6);
    }
}
