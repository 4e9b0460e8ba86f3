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
