//! Naming a model on the command line: a Hugging Face folder, the trained `tiny-en` (the folder
//! `models/tiny-en` of this repository), or a built-in synthetic model whose seeded weights are
//! generated where they run: `tiny` (small dense shapes and a byte
//! tokenizer), `qwen3-4b` (the real Qwen3-4B shapes), `tiny-moe` (small hybrid shapes, a byte
//! tokenizer) and `qwen3.6-35b-a3b` (the real Qwen3.6-35B-A3B shapes).

use std::path::{Path, PathBuf};

use crate::load::{load_model_dir, LoadError};
use crate::model::{ModelConfig, Qwen35MoeConfig, Qwen3Config};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// A model ready to be put on a device.
#[derive(Debug)]
pub struct ModelSource {
    /// What the user named (`tiny-en`, `tiny`, `qwen3-4b`, ..., or the folder).
    pub name: String,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
}

impl ModelSource {
    /// A built-in synthetic model cut to its first `layers` decoder layers (see
    /// [`ModelConfig::first_layers`]; named `<name> (first N layers)`): every layer keeps its
    /// shapes, so each kernel runs as in the whole model, on a fraction of the memory. For
    /// profilers whose kernel replay saves and restores what a kernel may write, which the whole
    /// 35B-A3B (69 GB) makes slow. A model read from a folder is refused: its weights are the
    /// checkpoint's, all of them.
    pub fn first_layers(self, layers: usize) -> Result<ModelSource, String> {
        if !matches!(self.weights, Weights::Synthetic { .. }) {
            return Err(format!(
                "--layers cuts the built-in synthetic models only ({}); `{}` reads its weights from a folder: drop --layers",
                BUILTIN[1..].join(", "),
                self.name
            ));
        }
        let config = self
            .config
            .first_layers(layers)
            .map_err(|e| format!("--layers {layers} for `{}`: {e}", self.name))?;
        Ok(ModelSource {
            name: format!("{} (first {layers} layers)", self.name),
            config,
            ..self
        })
    }
}

/// Built-in model names.
pub const BUILTIN: [&str; 5] = ["tiny-en", "tiny", "qwen3-4b", "tiny-moe", "qwen3.6-35b-a3b"];

/// The folder of `tiny-en`: a byte-level Qwen3 trained on Shakespeare's plays by
/// `scripts/train-tiny.py` (its record is `train-record.json` there), committed with the source.
pub fn tiny_en_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-en")
}

/// Resolves `spec`: a built-in name (synthetic weights from `seed`) or a model folder.
pub fn open_model(spec: &str, seed: u64) -> Result<ModelSource, LoadError> {
    let synthetic = |config: ModelConfig, tokenizer: Tokenizer| ModelSource {
        name: spec.to_string(),
        config,
        weights: Weights::Synthetic { seed },
        tokenizer,
    };
    match spec {
        "tiny-en" => {
            // Where the binary was built, else the checkout it runs in (a binary copied to
            // another machine with the source tree, as the GPU bundle is).
            let dir = [tiny_en_dir(), PathBuf::from("models/tiny-en")]
                .into_iter()
                .find(|d| d.is_dir())
                .ok_or_else(|| LoadError::TinyEnMissing {
                    built: tiny_en_dir().display().to_string(),
                })?;
            let (config, weights, tokenizer) = load_model_dir(&dir)?;
            Ok(ModelSource {
                name: spec.to_string(),
                config,
                weights,
                tokenizer,
            })
        }
        "tiny" => Ok(synthetic(
            ModelConfig::Qwen3(Qwen3Config::tiny()),
            Tokenizer::Bytes,
        )),
        "qwen3-4b" => Ok(synthetic(
            ModelConfig::Qwen3(Qwen3Config::qwen3_4b()),
            Tokenizer::None {
                reason: "the synthetic qwen3-4b has random weights and no tokenizer.json".into(),
            },
        )),
        "tiny-moe" => Ok(synthetic(
            ModelConfig::Qwen35Moe(Qwen35MoeConfig::tiny()),
            Tokenizer::Bytes,
        )),
        "qwen3.6-35b-a3b" => Ok(synthetic(
            ModelConfig::Qwen35Moe(Qwen35MoeConfig::qwen3_6_35b_a3b()),
            Tokenizer::None {
                reason: "the synthetic qwen3.6-35b-a3b has random weights and no tokenizer.json"
                    .into(),
            },
        )),
        path => {
            let (config, weights, tokenizer) = load_model_dir(Path::new(path))?;
            Ok(ModelSource {
                name: path.to_string(),
                config,
                weights,
                tokenizer,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HybridLayer;

    #[test]
    fn a_synthetic_hybrid_keeps_its_first_layers_and_their_pattern() {
        let full = open_model("qwen3.6-35b-a3b", 1).unwrap();
        let ModelConfig::Qwen35Moe(whole) = &full.config else {
            panic!("not the hybrid family")
        };
        let cut = full.config.first_layers(4).unwrap();
        let ModelConfig::Qwen35Moe(c) = &cut else {
            panic!("not the hybrid family")
        };
        assert_eq!(c.num_hidden_layers, 4);
        assert_eq!(c.layer_types, whole.layer_types[..4]);
        assert!(c.layer_types.contains(&HybridLayer::FullAttention));
        assert_eq!(c.hidden_size, whole.hidden_size);
        assert_eq!(c.num_experts, whole.num_experts);
        let d = cut.describe();
        assert_eq!(d.layers.len(), 4);
        assert!(d.parameter_count < full.config.describe().parameter_count);

        let src = full.first_layers(8).unwrap();
        assert_eq!(src.name, "qwen3.6-35b-a3b (first 8 layers)");
        assert_eq!(src.config.describe().layers.len(), 8);
    }

    #[test]
    fn a_cut_that_would_drop_a_kind_of_layer_or_leave_none_is_refused() {
        let hybrid = open_model("qwen3.6-35b-a3b", 1).unwrap();
        let e = hybrid.config.first_layers(3).unwrap_err();
        assert!(
            e.contains("no full_attention layer") && e.contains("give at least 4"),
            "{e}"
        );
        let e = hybrid.config.first_layers(0).unwrap_err();
        assert!(e.contains("give 1 to 40"), "{e}");
        let e = hybrid.config.first_layers(41).unwrap_err();
        assert!(e.contains("this model has 40"), "{e}");

        let dense = open_model("qwen3-4b", 1).unwrap();
        let cut = dense.first_layers(2).unwrap();
        assert_eq!(cut.config.describe().layers.len(), 2);
        assert_eq!(cut.name, "qwen3-4b (first 2 layers)");
    }

    #[test]
    fn a_model_read_from_a_folder_is_not_cut() {
        let e = open_model("tiny-en", 1)
            .unwrap()
            .first_layers(1)
            .unwrap_err();
        assert!(e.contains("drop --layers") && e.contains("tiny-en"), "{e}");
    }
}
