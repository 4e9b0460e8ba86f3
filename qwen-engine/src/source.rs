//! Naming a model on the command line: a Hugging Face folder, or a built-in synthetic model
//! (`tiny`: small shapes and a byte tokenizer; `qwen3-4b`: the real Qwen3-4B shapes) whose
//! seeded weights are generated where they run.

use std::path::Path;

use crate::config::Qwen3Config;
use crate::load::{load_model_dir, LoadError};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// A model ready to be put on a device.
#[derive(Debug)]
pub struct ModelSource {
    /// What the user named (`tiny`, `qwen3-4b`, or the folder).
    pub name: String,
    pub config: Qwen3Config,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
}

/// Built-in model names.
pub const BUILTIN: [&str; 2] = ["tiny", "qwen3-4b"];

/// Resolves `spec`: a built-in name (synthetic weights from `seed`) or a model folder.
pub fn open_model(spec: &str, seed: u64) -> Result<ModelSource, LoadError> {
    let synthetic = |config: Qwen3Config, tokenizer: Tokenizer| ModelSource {
        name: spec.to_string(),
        config,
        weights: Weights::Synthetic { seed },
        tokenizer,
    };
    match spec {
        "tiny" => Ok(synthetic(Qwen3Config::tiny(), Tokenizer::Bytes)),
        "qwen3-4b" => Ok(synthetic(
            Qwen3Config::qwen3_4b(),
            Tokenizer::None {
                reason: "the synthetic qwen3-4b has random weights and no tokenizer.json".into(),
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
