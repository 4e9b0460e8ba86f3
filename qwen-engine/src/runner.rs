//! What the engine asks of a device: run one step of the model for some sequences and sample.
//!
//! The scheduler decides *which* sequences run and *what* they feed (a prefill chunk, or the one
//! token a decode step feeds); a [`Runner`] executes that on its device (`cpu::CpuRunner`, the
//! fp32 reference; `gpu::GpuRunner`, the AOT kernels) and returns the sampled tokens. Both keep
//! the KV cache in the same paged layout (blocks of the backend's `KV_BLOCK_TOKENS`), addressed
//! through the block tables the scheduler owns, and the recurrent state of a hybrid model in
//! numbered state slots the scheduler hands out.

use std::collections::HashSet;

use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;
use aot_kernels::ops::sampling::SamplingParams;
use serde::Serialize;

/// Draw a token after this sequence's last input token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRequest {
    pub params: SamplingParams,
    pub seed: u64,
    /// Index of the token being generated in the request's output (the draw's counter).
    pub counter: u64,
}

/// One sequence's part of a step.
#[derive(Debug, Clone)]
pub struct SeqStep<'a> {
    /// The request slot (its state on the device, e.g. its block table row).
    pub slot: usize,
    /// Input tokens: a prefill chunk, or the single token a decode step feeds.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// The slot's KV blocks, covering at least `start_pos + tokens.len()` positions.
    pub blocks: &'a [u32],
    /// The sequence's recurrent-state slot (models with recurrent layers; `None` otherwise). A
    /// step with `start_pos == 0` starts from zero state, whatever the slot held before.
    pub state_slot: Option<u32>,
    /// Sample after the last token (a decode step, or the last chunk of a prompt).
    pub sample: Option<SampleRequest>,
    /// Prompt tokens (any chunk of the prompt, however short) rather than a generated token:
    /// runners must compute prompt tokens the same way whatever the chunking.
    pub prefill: bool,
    /// The sequence runs again in the next step (it has tokens left to generate after this
    /// step's), unless it samples an end-of-sequence token that stops it. A hint: a runner may
    /// start the next step's work early on it (the GPU runner decodes ahead), and must still
    /// compute exactly the plan it gets. Setting it promises that the slot's blocks past
    /// `end_pos()` are its own (no other sequence reads or shares them): the early work writes
    /// the next position's key and value there before the next plan is seen.
    pub continues: bool,
}

impl SeqStep<'_> {
    /// Context length after this step.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// Everything one engine step runs.
#[derive(Debug, Clone, Default)]
pub struct StepPlan<'a> {
    pub seqs: Vec<SeqStep<'a>>,
    /// Return the logits each sampling sequence drew from (tests and teacher forcing).
    pub want_logits: bool,
}

/// What a step produced, per sequence of the plan (same order).
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// The sampled token, for sequences that asked for one.
    pub tokens: Vec<Option<u32>>,
    /// With `want_logits`: the fp32 logits of each sampling sequence (empty for the others).
    pub logits: Vec<Vec<f32>>,
}

/// The device a runner computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("{0}")]
    Device(String),
    #[error("step plan: {0}")]
    Plan(String),
}

/// What a runner holds, for [`check_plan`].
#[derive(Debug, Clone, Copy)]
pub struct PlanLimits {
    /// Request slots (and recurrent-state slots, one a request slot).
    pub slots: usize,
    /// KV blocks in the cache.
    pub kv_blocks: usize,
    pub vocab: usize,
    /// The most positions a sequence may reach.
    pub max_context: usize,
    /// The model has recurrent layers: every sequence names its own state slot.
    pub recurrent: bool,
}

/// Checks a plan against what a runner holds before anything runs, so that a bad plan changes
/// nothing on the device: each slot and state slot exists and appears once, a step feeds tokens
/// (one for a generated token) inside the vocabulary and the context, the block table covers its
/// positions with distinct blocks of the cache, no two sequences write one KV row, and the
/// sampling parameters are valid. The message names the sequence by its slot.
pub fn check_plan(plan: &StepPlan<'_>, l: &PlanLimits) -> Result<(), RunnerError> {
    let err = |m: String| Err(RunnerError::Plan(m));
    if plan.seqs.len() > l.slots {
        return err(format!(
            "{} sequences in one step, but this runner has {} slots",
            plan.seqs.len(),
            l.slots
        ));
    }
    let mut slots = HashSet::new();
    let mut states = HashSet::new();
    let mut written = HashSet::new();
    let mut blocks_seen = vec![0u64; l.kv_blocks.div_ceil(64)];
    for s in &plan.seqs {
        let slot = s.slot;
        if slot >= l.slots {
            return err(format!(
                "slot {slot} does not exist (this runner has slots 0..{})",
                l.slots
            ));
        }
        if !slots.insert(slot) {
            return err(format!("slot {slot} appears twice in one step"));
        }
        if s.tokens.is_empty() {
            return err(format!("slot {slot}: a step must feed at least one token"));
        }
        if !s.prefill && s.tokens.len() != 1 {
            return err(format!(
                "slot {slot}: a generated-token step feeds one token, this one {}",
                s.tokens.len()
            ));
        }
        if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= l.vocab) {
            return err(format!(
                "slot {slot}: token {t} is outside the vocabulary (0..{})",
                l.vocab
            ));
        }
        if s.end_pos() > l.max_context {
            return err(format!(
                "slot {slot}: positions up to {} exceed the context of {} this runner serves",
                s.end_pos(),
                l.max_context
            ));
        }
        if l.recurrent {
            match s.state_slot {
                Some(state) if (state as usize) < l.slots => {
                    if !states.insert(state) {
                        return err(format!(
                            "slot {slot}: recurrent-state slot {state} is used twice in one step"
                        ));
                    }
                }
                Some(state) => {
                    return err(format!(
                        "slot {slot}: recurrent-state slot {state} does not exist (this runner has 0..{})",
                        l.slots
                    ))
                }
                None => {
                    return err(format!(
                        "slot {slot}: the model has recurrent layers and the step names no recurrent-state slot"
                    ))
                }
            }
        }
        let needed = s.end_pos().div_ceil(KV_BLOCK_TOKENS);
        if s.blocks.len() < needed {
            return err(format!(
                "slot {slot}: {} positions need {needed} KV blocks, the block table has {}",
                s.end_pos(),
                s.blocks.len()
            ));
        }
        let used = &s.blocks[..needed];
        if let Some(&b) = used.iter().find(|&&b| b as usize >= l.kv_blocks) {
            return err(format!(
                "slot {slot}: KV block {b} does not exist (the cache has {} blocks)",
                l.kv_blocks
            ));
        }
        // One bit a block of the cache, set for this sequence's blocks and cleared after, so the
        // check costs two passes over the table on the step's hot path, with no hashing.
        let twice = used.iter().any(|&b| {
            let (word, bit) = (b as usize / 64, 1u64 << (b % 64));
            let seen = blocks_seen[word] & bit != 0;
            blocks_seen[word] |= bit;
            seen
        });
        for &b in used {
            blocks_seen[b as usize / 64] = 0;
        }
        if twice {
            return err(format!(
                "slot {slot}: the block table {used:?} names a block twice"
            ));
        }
        for pos in s.start_pos..s.end_pos() {
            let cell = (s.blocks[pos / KV_BLOCK_TOKENS], pos % KV_BLOCK_TOKENS);
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

/// A model on a device, with its KV cache.
pub trait Runner {
    fn device(&self) -> DeviceKind;
    /// KV blocks this runner's cache holds (`KV_BLOCK_TOKENS` tokens each).
    fn kv_blocks(&self) -> usize;
    /// Recurrent-state slots this runner holds (0 for a model without recurrent layers).
    fn state_slots(&self) -> usize {
        0
    }
    /// Most sequences one step may carry (the request slots).
    fn max_slots(&self) -> usize;
    /// Longest sequence (prompt + generated) this runner can hold: its position tables and
    /// block tables are sized for it. The engine admits no request past it.
    fn max_context(&self) -> usize {
        usize::MAX
    }
    /// Bytes of one KV block in this runner's cache, where it is not the bf16 block of
    /// `memory::block_bytes` (the CPU runner's cache is fp32); for messages that say how much
    /// budget a request needs.
    fn kv_block_bytes(&self) -> Option<usize> {
        None
    }
    /// Runs one step: appends every sequence's tokens to its cache and samples where asked.
    fn step(&mut self, plan: &StepPlan<'_>) -> Result<StepOutput, RunnerError>;
    /// A JSON description for reports: device, dispatch report, graph use, timings.
    fn report(&self) -> serde_json::Value;
    /// The timeline of the last decode pass, where the runner stamps one (the persistent step
    /// with `GpuOptions::persistent_stamps`): a Markdown table and an SVG chart.
    fn pass_trace(&self) -> Option<Result<PassTrace, RunnerError>> {
        None
    }
}

/// A stamped decode pass ([`Runner::pass_trace`]).
#[derive(Debug, Clone)]
pub struct PassTrace {
    /// Rows of the pass.
    pub rows: usize,
    /// Per op kind: counter waits, x loads, weight waits and compute, and what lies between the
    /// launches.
    pub table: String,
    pub svg: String,
}
