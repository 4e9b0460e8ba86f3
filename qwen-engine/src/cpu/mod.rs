//! The CPU reference runner: the model in fp32 on the bf16 weights (widened once), its own paged
//! KV cache in the GPU's layout, and sampling through the backend's reference sampler (the GPU
//! kernel's semantics, bit for bit). It is the oracle the GPU runner is checked against, so it is
//! written to be read: [`forward`] is the model, [`kv`] the cache, [`math`] the fp32 primitives.

pub mod forward;
pub mod kv;
pub mod math;
pub mod weights;

use std::collections::HashSet;
use std::time::Instant;

use aot_kernels::ops::sampling::sample_reference;
use serde_json::json;

use crate::config::Qwen3Config;
use crate::runner::{DeviceKind, Runner, RunnerError, StepOutput, StepPlan, KV_BLOCK_SIZE};
use crate::weights::Weights;
use forward::{CpuModel, Row};
use kv::PagedKvCache;
use weights::CpuWeights;

/// Sizes of the runner's slot pool and KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuRunnerOptions {
    /// Most sequences one step may carry.
    pub max_slots: usize,
    /// KV blocks of [`KV_BLOCK_SIZE`] tokens in the cache.
    pub kv_blocks: usize,
}

#[derive(Debug)]
pub struct CpuRunner {
    model: CpuModel,
    cache: PagedKvCache,
    options: CpuRunnerOptions,
    steps: u64,
    tokens: u64,
    seconds: f64,
}

impl CpuRunner {
    /// Widens `weights` (loaded or synthetic) to fp32 and allocates the KV cache.
    pub fn new(
        config: &Qwen3Config,
        weights: &Weights,
        options: CpuRunnerOptions,
    ) -> Result<CpuRunner, RunnerError> {
        if options.max_slots == 0 || options.kv_blocks == 0 {
            return Err(RunnerError::Device(format!(
                "cpu runner: {} slots and {} KV blocks; both must be at least 1",
                options.max_slots, options.kv_blocks
            )));
        }
        let weight_bytes = config.parameter_count().saturating_mul(4);
        let kv_bytes = (options.kv_blocks as u64)
            .saturating_mul((KV_BLOCK_SIZE * config.kv_bytes_per_token() * 2) as u64);
        if let Some(available) = available_memory_bytes() {
            if weight_bytes.saturating_add(kv_bytes) > available {
                return Err(RunnerError::Device(format!(
                    "cpu runner: fp32 weights ({:.1} GB) and KV cache ({:.1} GB) need more than the {:.1} GB of memory available; the CPU reference is for small models: use --device cuda, a smaller model, or fewer KV blocks",
                    weight_bytes as f64 / 1e9,
                    kv_bytes as f64 / 1e9,
                    available as f64 / 1e9
                )));
            }
        }
        let w = CpuWeights::new(config, weights)
            .map_err(|m| RunnerError::Device(format!("cpu runner: {m}")))?;
        Ok(CpuRunner {
            cache: PagedKvCache::new(
                config.num_hidden_layers,
                options.kv_blocks,
                config.num_key_value_heads,
                config.head_dim,
            ),
            model: CpuModel::new(config.clone(), w),
            options,
            steps: 0,
            tokens: 0,
            seconds: 0.0,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.model.config
    }

    /// Checks a plan against the runner's slots, cache and vocabulary; the message names the
    /// sequence (by slot) and what is wrong.
    fn validate(&self, plan: &StepPlan<'_>) -> Result<(), RunnerError> {
        let err = |m: String| Err(RunnerError::Plan(m));
        let c = &self.model.config;
        if plan.seqs.len() > self.options.max_slots {
            return err(format!(
                "{} sequences in one step, but this runner has {} slots",
                plan.seqs.len(),
                self.options.max_slots
            ));
        }
        let mut slots = HashSet::new();
        let mut written = HashSet::new();
        for s in &plan.seqs {
            let slot = s.slot;
            if slot >= self.options.max_slots {
                return err(format!(
                    "slot {slot} does not exist (this runner has slots 0..{})",
                    self.options.max_slots
                ));
            }
            if !slots.insert(slot) {
                return err(format!("slot {slot} appears twice in one step"));
            }
            if s.tokens.is_empty() {
                return err(format!("slot {slot}: a step must feed at least one token"));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return err(format!(
                    "slot {slot}: token {t} is outside the vocabulary (0..{})",
                    c.vocab_size
                ));
            }
            if s.end_pos() > c.max_position_embeddings {
                return err(format!(
                    "slot {slot}: positions up to {} exceed the model's context of {} (max_position_embeddings)",
                    s.end_pos(),
                    c.max_position_embeddings
                ));
            }
            let needed = s.end_pos().div_ceil(KV_BLOCK_SIZE);
            if s.blocks.len() < needed {
                return err(format!(
                    "slot {slot}: {} positions need {needed} KV blocks, the block table has {}",
                    s.end_pos(),
                    s.blocks.len()
                ));
            }
            let used = &s.blocks[..needed];
            if let Some(&b) = used
                .iter()
                .find(|&&b| b as usize >= self.cache.num_blocks())
            {
                return err(format!(
                    "slot {slot}: KV block {b} does not exist (the cache has {} blocks)",
                    self.cache.num_blocks()
                ));
            }
            if used.iter().collect::<HashSet<_>>().len() != used.len() {
                return err(format!(
                    "slot {slot}: the block table {used:?} names a block twice"
                ));
            }
            for pos in s.start_pos..s.end_pos() {
                let cell = (s.blocks[pos / KV_BLOCK_SIZE], pos % KV_BLOCK_SIZE);
                if !written.insert(cell) {
                    return err(format!(
                        "slot {slot}: position {pos} writes KV block {} row {}, which another sequence of this step writes too",
                        cell.0, cell.1
                    ));
                }
            }
            if let Some(req) = &s.sample {
                req.params
                    .validate()
                    .map_err(|m| RunnerError::Plan(format!("slot {slot}: {m}")))?;
            }
        }
        Ok(())
    }
}

impl Runner for CpuRunner {
    fn device(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn kv_blocks(&self) -> usize {
        self.options.kv_blocks
    }

    fn max_slots(&self) -> usize {
        self.options.max_slots
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Result<StepOutput, RunnerError> {
        self.validate(plan)?;
        let started = Instant::now();
        let mut rows = Vec::new();
        let mut last_row = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            for (i, &token) in s.tokens.iter().enumerate() {
                rows.push(Row {
                    token,
                    pos: s.start_pos + i,
                    blocks: s.blocks,
                });
            }
            last_row.push(rows.len() - 1);
        }
        let hidden = self.model.forward(&mut self.cache, &rows);

        let h = self.model.config.hidden_size;
        let mut out = StepOutput::default();
        for (s, &r) in plan.seqs.iter().zip(&last_row) {
            match &s.sample {
                Some(req) => {
                    let logits = self.model.logits(&hidden[r * h..(r + 1) * h]);
                    out.tokens.push(Some(sample_reference(
                        &logits,
                        &req.params,
                        req.seed,
                        req.counter,
                    )));
                    out.logits
                        .push(if plan.want_logits { logits } else { Vec::new() });
                }
                None => {
                    out.tokens.push(None);
                    out.logits.push(Vec::new());
                }
            }
        }
        self.steps += 1;
        self.tokens += rows.len() as u64;
        self.seconds += started.elapsed().as_secs_f64();
        Ok(out)
    }

    fn report(&self) -> serde_json::Value {
        json!({
            "device": "cpu",
            "math": "fp32 reference (weights widened from bf16)",
            "max_slots": self.options.max_slots,
            "kv_blocks": self.options.kv_blocks,
            "kv_block_size": KV_BLOCK_SIZE,
            "kv_cache_bytes": self.cache.bytes(),
            "weight_bytes_f32": self.model.weights.bytes(),
            "steps": self.steps,
            "tokens_processed": self.tokens,
            "step_seconds": self.seconds,
        })
    }
}

/// `MemAvailable` of /proc/meminfo, where there is one.
fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
