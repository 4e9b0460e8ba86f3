//! The oracle fixtures (`tests/fixtures/<name>/`, made by `scripts/oracle/make_fixtures.py`):
//! a tiny Qwen3 model folder (config.json, bf16 model.safetensors) and `expected.json`, what
//! transformers computed on exactly those weights in float32: per prompt, the greedy continuation
//! and each step's top-5 logits and top-1/top-2 margin.
//!
//! The hybrid family's fixtures (`tests/fixtures-hybrid/`, `scripts/oracle/make_hybrid_fixtures.py`)
//! have the same files and `expected.json` fields.
//!
//! `QWEN_FIXTURES=DIR` (`QWEN_HYBRID_FIXTURES=DIR`) points the tests at another set (e.g. one
//! regenerated on the GPU machine).

use std::path::{Path, PathBuf};

use super::driver::Generation;
use qwen_engine::load::load_model_dir;
use qwen_engine::model::ModelConfig;
use qwen_engine::weights::Weights;
use serde::Deserialize;

/// One generated token as the oracle saw it.
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    /// The greedy choice (largest logit, lowest id on ties).
    pub token: u32,
    /// Its logit.
    pub logit: f32,
    /// Top-1 minus top-2 logit: steps with a margin below a runner's noise may pick either.
    pub margin: f64,
    pub top5_ids: Vec<u32>,
    pub top5_logits: Vec<f32>,
    /// transformers' logits for the same ids with the model run in bfloat16 (teacher-forced).
    pub bf16_top5_logits: Vec<f32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Prompt {
    pub name: String,
    pub ids: Vec<u32>,
    pub generated: Vec<u32>,
    pub steps: Vec<Step>,
}

/// `expected.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Expected {
    pub script_version: u32,
    pub name: String,
    pub seed: u64,
    pub config_style: String,
    pub torch: String,
    pub transformers: String,
    pub device: String,
    pub steps_per_prompt: usize,
    /// transformers' own bf16-vs-float32 distance on these steps: max |bf16 - f32| / max(|f32|, 1).
    pub bf16_relative_noise: f32,
    pub prompts: Vec<Prompt>,
}

#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    pub dir: PathBuf,
    pub expected: Expected,
}

impl Fixture {
    /// The model folder through the engine's loader.
    pub fn load_model(&self) -> (ModelConfig, Weights) {
        let (config, weights, _) =
            load_model_dir(&self.dir).unwrap_or_else(|e| panic!("fixture {}: {e}", self.name));
        (config, weights)
    }

    /// The longest prompt (every fixture has one longer than 512 tokens).
    pub fn longest_prompt(&self) -> &Prompt {
        self.expected
            .prompts
            .iter()
            .max_by_key(|p| p.ids.len())
            .expect("a fixture has prompts")
    }
}

pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("QWEN_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

pub fn load(dir: &Path) -> Fixture {
    let path = dir.join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/oracle/make_fixtures.py)",
            path.display()
        )
    });
    let expected: Expected =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for p in &expected.prompts {
        assert_eq!(
            p.steps.len(),
            p.generated.len(),
            "{}: {}",
            path.display(),
            p.name
        );
    }
    Fixture {
        name: dir.file_name().unwrap().to_string_lossy().into_owned(),
        dir: dir.to_path_buf(),
        expected,
    }
}

pub fn hybrid_fixtures_dir() -> PathBuf {
    match std::env::var_os("QWEN_HYBRID_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures-hybrid"),
    }
}

/// Every dense fixture folder (those with an expected.json), by name.
pub fn all() -> Vec<Fixture> {
    all_in(&fixtures_dir())
}

/// Every hybrid fixture folder, by name.
pub fn all_hybrid() -> Vec<Fixture> {
    all_in(&hybrid_fixtures_dir())
}

fn all_in(root: &Path) -> Vec<Fixture> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "{}: no fixtures", root.display());
    dirs.iter().map(|d| load(d)).collect()
}

pub fn by_name(name: &str) -> Fixture {
    load(&fixtures_dir().join(name))
}

/// Tokens equal, step by step, and each step's top-5 logits within `tol` (relative to
/// `max(|logit|, 1)`), for the CPU runner's `got`. Returns the
/// largest absolute and relative logit differences seen.
pub fn check_against_oracle(
    f: &Fixture,
    prompt: &Prompt,
    got: &Generation,
    tol: f32,
) -> (f32, f32) {
    let (mut worst_abs, mut worst_rel) = (0.0f32, 0.0f32);
    for (i, step) in prompt.steps.iter().enumerate() {
        let logits = &got.logits[i];
        for (&id, &want) in step.top5_ids.iter().zip(&step.top5_logits) {
            let diff = (logits[id as usize] - want).abs();
            worst_abs = worst_abs.max(diff);
            worst_rel = worst_rel.max(diff / want.abs().max(1.0));
            assert!(
                diff <= tol * want.abs().max(1.0),
                "{} {} step {i}: logit of token {id} is {}, transformers {want} (diff {diff:e})",
                f.name,
                prompt.name,
                logits[id as usize]
            );
        }
        assert_eq!(
            got.tokens[i], step.token,
            "{} {} step {i}: cpu chose {}, transformers {} (margin {})",
            f.name, prompt.name, got.tokens[i], step.token, step.margin
        );
    }
    (worst_abs, worst_rel)
}
