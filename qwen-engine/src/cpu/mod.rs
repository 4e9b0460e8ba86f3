//! The CPU reference runner: the model in fp32 on the bf16 weights (widened once), its own paged
//! KV cache in the GPU's layout, the recurrent state of a hybrid model per state slot, and
//! sampling through the backend's reference sampler (the GPU kernel's semantics, bit for bit). It
//! is the oracle the GPU runner is checked against, so it is written to be read: one file per
//! family ([`qwen3`], [`qwen3_5_moe`]) is the model, [`kv`] the cache, [`state`] the recurrent
//! state, [`math`] the fp32 primitives.

pub mod kv;
pub mod math;
pub mod qwen3;
pub mod qwen3_5_moe;
pub mod state;
pub mod weights;

use std::time::Instant;

use aot_kernels::ops::sampling::sample_reference;
use serde_json::json;

use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;

use crate::model::{ModelConfig, ModelDesc};
use crate::runner::{
    check_plan, DeviceKind, PlanLimits, Runner, RunnerError, StepOutput, StepPlan,
};
use crate::weights::Weights;
use kv::PagedKvCache;
use qwen3::DenseModel;
use qwen3_5_moe::HybridModel;
use state::RecurrentStates;
use weights::{CpuWeights, RoleTensors};

/// One token of one sequence in a step.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub token: u32,
    pub pos: usize,
    /// The sequence's KV block table.
    pub blocks: &'a [u32],
    /// The sequence's recurrent-state slot (hybrid models).
    pub state: Option<u32>,
}

/// The model of one family, in fp32.
#[derive(Debug)]
enum CpuModel {
    Dense(DenseModel),
    Hybrid(HybridModel, RecurrentStates),
}

/// Sizes of the runner's slot pool and KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuRunnerOptions {
    /// Most sequences one step may carry (and, for a hybrid model, its recurrent-state slots).
    pub max_slots: usize,
    /// KV blocks of [`KV_BLOCK_TOKENS`] tokens in the cache.
    pub kv_blocks: usize,
}

#[derive(Debug)]
pub struct CpuRunner {
    config: ModelConfig,
    desc: ModelDesc,
    model: CpuModel,
    cache: PagedKvCache,
    options: CpuRunnerOptions,
    /// Most positions a request may reach (`Runner::max_context`); unbounded unless set.
    max_context: usize,
    steps: u64,
    tokens: u64,
    seconds: f64,
}

impl CpuRunner {
    /// Widens `weights` (loaded or synthetic) to fp32 and allocates the KV cache (and, for a
    /// hybrid model, one recurrent-state slot per request slot).
    pub fn new(
        config: &ModelConfig,
        weights: &Weights,
        options: CpuRunnerOptions,
    ) -> Result<CpuRunner, RunnerError> {
        if options.max_slots == 0 || options.kv_blocks == 0 {
            return Err(RunnerError::Device(format!(
                "cpu runner: {} slots and {} KV blocks; both must be at least 1",
                options.max_slots, options.kv_blocks
            )));
        }
        let desc = config.describe();
        let weight_bytes = desc.parameter_count.saturating_mul(4);
        let kv_bytes = (options.kv_blocks as u64)
            .saturating_mul((KV_BLOCK_TOKENS * desc.kv_bytes_per_token * 2) as u64)
            .saturating_add((desc.state_bytes * options.max_slots) as u64);
        if let Some(available) = available_memory_bytes() {
            if weight_bytes.saturating_add(kv_bytes) > available {
                return Err(RunnerError::Device(format!(
                    "cpu runner: fp32 weights ({:.1} GB) and KV cache and state ({:.1} GB) need more than the {:.1} GB of memory available; the CPU reference is for small models: use --device cuda, a smaller model, or fewer KV blocks",
                    weight_bytes as f64 / 1e9,
                    kv_bytes as f64 / 1e9,
                    available as f64 / 1e9
                )));
            }
        }
        let cpu_err = |m: String| RunnerError::Device(format!("cpu runner: {m}"));
        let (model, cache) = match config {
            ModelConfig::Qwen3(c) => {
                let w = CpuWeights::new(c, weights).map_err(cpu_err)?;
                let cache = PagedKvCache::new(
                    c.num_hidden_layers,
                    options.kv_blocks,
                    c.num_key_value_heads,
                    c.head_dim,
                );
                (CpuModel::Dense(DenseModel::new(c.clone(), w)), cache)
            }
            ModelConfig::Qwen35Moe(c) => {
                let w = RoleTensors::new(&config.tensor_table(), weights).map_err(cpu_err)?;
                let cache = PagedKvCache::new(
                    c.attention_layers(),
                    options.kv_blocks,
                    c.num_key_value_heads,
                    c.head_dim,
                );
                let states = RecurrentStates::new(c, options.max_slots);
                let model = HybridModel::new(c.clone(), w).map_err(cpu_err)?;
                (CpuModel::Hybrid(model, states), cache)
            }
        };
        Ok(CpuRunner {
            config: config.clone(),
            desc,
            cache,
            model,
            options,
            max_context: usize::MAX,
            steps: 0,
            tokens: 0,
            seconds: 0.0,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Checks a plan against the runner's slots, cache and vocabulary ([`check_plan`]).
    fn validate(&self, plan: &StepPlan<'_>) -> Result<(), RunnerError> {
        check_plan(
            plan,
            &PlanLimits {
                slots: self.options.max_slots,
                kv_blocks: self.cache.num_blocks(),
                vocab: self.desc.vocab_size,
                max_context: self.desc.max_context,
                recurrent: self.desc.has_recurrent_state(),
            },
        )
    }
}

impl CpuRunner {
    /// Bounds the positions one request may reach (the engine refuses a longer one as too long,
    /// naming `--max-context`): for a cache sized as a number of slots times a context rather
    /// than by its budget.
    pub fn with_max_context(mut self, positions: usize) -> CpuRunner {
        self.max_context = positions;
        self
    }
}

impl Runner for CpuRunner {
    fn device(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn kv_blocks(&self) -> usize {
        self.options.kv_blocks
    }

    fn kv_block_bytes(&self) -> Option<usize> {
        // fp32 keys and values: twice the bf16 block.
        Some(2 * crate::memory::block_bytes(&self.desc))
    }

    fn max_slots(&self) -> usize {
        self.options.max_slots
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn state_slots(&self) -> usize {
        match self.model {
            CpuModel::Dense(_) => 0,
            CpuModel::Hybrid(_, ref states) => states.slots(),
        }
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
                    state: s.state_slot,
                });
            }
            last_row.push(rows.len() - 1);
        }
        let hidden = match &mut self.model {
            CpuModel::Dense(m) => m.forward(&mut self.cache, &rows),
            CpuModel::Hybrid(m, states) => {
                // A sequence's first step starts from zero state, whatever the slot held.
                for s in plan.seqs.iter().filter(|s| s.start_pos == 0) {
                    states.reset(s.state_slot.expect("validated") as usize);
                }
                m.forward(&mut self.cache, states, &rows)
            }
        };

        let h = self.desc.hidden_size;
        let mut out = StepOutput::default();
        for (s, &r) in plan.seqs.iter().zip(&last_row) {
            match &s.sample {
                Some(req) => {
                    let row = &hidden[r * h..(r + 1) * h];
                    let logits = match &self.model {
                        CpuModel::Dense(m) => m.logits(row),
                        CpuModel::Hybrid(m, _) => m.logits(row),
                    };
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
            "kv_block_size": KV_BLOCK_TOKENS,
            "model_type": self.desc.model_type,
            "kv_cache_bytes": self.cache.bytes(),
            "state_slots": self.state_slots(),
            "weight_bytes_f32": match &self.model {
                CpuModel::Dense(m) => m.weights.bytes(),
                CpuModel::Hybrid(m, _) => m.weight_bytes(),
            },
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
