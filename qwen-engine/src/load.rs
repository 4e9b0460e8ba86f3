//! Opening a Hugging Face model folder: `config.json` ([`ModelConfig::from_file`]), the
//! safetensors checkpoint ([`crate::weights::safetensors`]) and `tokenizer.json` if present.

use std::path::Path;

use crate::config::ConfigError;
use crate::model::ModelConfig;
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::weights::safetensors::{load_weights, WeightsError};
use crate::weights::Weights;

/// A model folder that cannot be served; each variant's message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path} is not a folder: a model is a Hugging Face folder (config.json, model.safetensors or its shards, tokenizer.json) or a built-in name (tiny-en, tiny, qwen3-4b, tiny-moe, qwen3.6-35b-a3b)")]
    NotAFolder { path: String },
    #[error("the built-in tiny-en is the folder models/tiny-en of the source checkout, found neither at {built} (where this binary was built) nor at models/tiny-en under the current folder: run from the checkout's root, or pass --model <path to models/tiny-en>")]
    TinyEnMissing { built: String },
    #[error("{dir} has no config.json: download the whole model folder (e.g. `huggingface-cli download Qwen/Qwen3-4B --local-dir {dir}`), not only its weights")]
    MissingConfig { dir: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// Loads the model in `dir`: its config, every weight checked against the tensor table (in table
/// order), and its tokenizer ([`Tokenizer::None`] when the folder has no tokenizer.json).
pub fn load_model_dir(dir: &Path) -> Result<(ModelConfig, Weights, Tokenizer), LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::NotAFolder {
            path: dir.display().to_string(),
        });
    }
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(LoadError::MissingConfig {
            dir: dir.display().to_string(),
        });
    }
    let config = ModelConfig::from_file(&config_path)?;
    let weights = load_weights(dir, &config)?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    Ok((config, Weights::Loaded(weights), tokenizer))
}
