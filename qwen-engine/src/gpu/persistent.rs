//! The dense forward pass on the persistent step (issue 32): the projections of a decode pass run
//! as persistent launches (one block an SM walking a task list, counters between the ops, each
//! block's weight stream running ahead of them: `aot_kernels::ops::persistent`), with attention
//! launched between them. One launch covers everything from one layer's attention output to the
//! next layer's qkv:
//!
//! ```text
//! step 0      qkv_0 (x = rmsnorm(h))
//! attn_0      attention (q/k norm, RoPE, cache write, split-KV), launched as in `qwen3`
//! step l + 1  o_l (h += o), gate_up_l (x = rmsnorm(h) -> silu(gate) * up), down_l (h += down),
//!             then qkv_{l+1} (x = rmsnorm(h)), or after the last layer lm_head (final norm, fp32)
//! attn_{l+1}  ...
//! ```
//!
//! then sampling: 2 L + 3 launches a pass (75 for Qwen3-4B) against the launch path's 5 L + 3
//! (183). Where the step streams with the Tensor Memory Accelerator (an sm_90+ image) it reads the
//! model's own row-major tensors through 2D tensor maps (four box copies a ring slot; no second
//! copy of the model), which since the stream and the math hold each tile's descriptors in
//! registers is faster than the packed copy (docs/experiments.md, session 55); where it streams
//! with `cp.async` (the compute_80 PTX, images for GPUs before sm_90) it reads a packed copy of
//! the projections (a ring slot contiguous) where free memory holds it.
//! `QWEN_PERSISTENT_WEIGHTS` overrides. Each launch is programmatic where the image allows, so its
//! weights start streaming while attention ends.
//!
//! Numerics: the epilogues and the norm's roundings are the launch path's; the sums are not (a
//! tile's fp32 sum runs over K in the step's slot order, and a norm's sum of squares is the
//! block's own over the bf16 `h`), so the step's bits differ from the launch path's, while being
//! the same over every block count, alone or batched, and under `auto` and `ptx-only`.
//!
//! The steps of a row count are built on its first pass (the schedule and the op table in device
//! memory, a few hundred KB) and kept, bound to the runner's buffers, which never move.

use aot_kernels::ops::embedding::embedding;
use aot_kernels::ops::persistent::{
    self, schedule, GemvBinding, GemvNode, PackedWeights, PersistentStep, StepInput, StepOutput,
    StepWeights,
};
use aot_kernels::ops::{dev, dev_mut, OpsError};

use super::qwen3::{attention_layer, AttnLayer};
use super::{inputs, GpuRunner};
use crate::runner::RunnerError;

/// Tile rows of the narrow ops (o_proj and down: `hidden` outputs): more tiles to spread over the
/// blocks (the probe's better setting on the H200); the wide ones take 16.
const NARROW_TILE_ROWS: usize = 8;

/// How the runner's decode passes run (named `launches` or `persistent` in reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeStep {
    /// One launch per op (the graph of `qwen3`).
    Launches,
    /// Persistent steps over `blocks` blocks (`None`: one an SM).
    Persistent { blocks: Option<usize> },
}

impl DecodeStep {
    pub fn name(&self) -> &'static str {
        match self {
            DecodeStep::Launches => "launches",
            DecodeStep::Persistent { .. } => "persistent",
        }
    }
}

impl serde::Serialize for DecodeStep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl std::str::FromStr for DecodeStep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "launches" => Ok(DecodeStep::Launches),
            "persistent" => Ok(DecodeStep::Persistent { blocks: None }),
            _ => Err(format!("--step {s}: expected `persistent` or `launches`")),
        }
    }
}

/// What the runner chose and why (the report's `step`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepChoice {
    pub step: DecodeStep,
    /// Blocks of each persistent launch (0 on the launch path).
    pub blocks: usize,
    /// How the persistent step reads the weights: `row-major` (the model's own tensors: four 2D box
    /// copies a ring slot where it streams with tensor copies) or `packed` (a second copy in slot
    /// order: one bulk copy a slot, or its pieces in order under `cp.async`); [`WEIGHTS_ENV`]
    /// chooses; empty on the launch path.
    pub weights: &'static str,
    /// Why the persistent step asked for is not the one running, or runs on row-major weights
    /// where a packed copy was wanted (asked for, or `auto` under `cp.async`) and does not fit.
    pub fallback: Option<String>,
}

/// The projection weights packed for the persistent step ([`persistent::pack_weights`]): per layer
/// qkv, o, gate_up (gate and up rows paired) and down, then lm_head.
pub struct PackedModel {
    layers: Vec<[PackedWeights; 4]>,
    lm_head: PackedWeights,
}

/// The environment variable that chooses how the persistent step reads the projections.
pub const WEIGHTS_ENV: &str = "QWEN_PERSISTENT_WEIGHTS";

/// Whether to pack the projections for the persistent step: as [`WEIGHTS_ENV`] says (`packed` or
/// `row-major`), else where the step streams with `cp.async` (`tensor_copies` false: the
/// compute_80 PTX, a pre-Hopper image), whose copy per 16-byte piece makes row-major weights slow,
/// and not where it streams with tensor copies, which read the row-major tensors faster than the
/// packed copy (docs/experiments.md, session 55). A bad value is an error that names the choices
/// (whichever step runs: [`choose_and_pack`] reads it first).
fn pack_projections(tensor_copies: bool) -> Result<bool, RunnerError> {
    match std::env::var(WEIGHTS_ENV) {
        Err(std::env::VarError::NotPresent) => parse_weights_mode("auto", tensor_copies),
        Ok(v) => parse_weights_mode(&v, tensor_copies),
        Err(e) => Err(RunnerError::Device(format!("{WEIGHTS_ENV}: {e}"))),
    }
}

fn parse_weights_mode(v: &str, tensor_copies: bool) -> Result<bool, RunnerError> {
    match v {
        "auto" | "" => Ok(!tensor_copies),
        "row-major" => Ok(false),
        "packed" => Ok(true),
        other => Err(RunnerError::Device(format!(
            "{WEIGHTS_ENV}={other}: use `auto` (the default: row-major where the step streams \
             with tensor copies, packed where it streams with cp.async), `row-major` (the \
             model's own tensors) or `packed` (a second copy of the projections in the ring's \
             slot order)"
        ))),
    }
}

/// Headroom the packed copy leaves free (the KV cache, activations, graphs).
const PACK_HEADROOM: usize = 2 << 30;

/// [`choose`], then the weights the persistent step reads ([`pack_projections`]): the model's
/// row-major tensors, or a packed copy of the projections if free memory holds it with
/// [`PACK_HEADROOM`] to spare (otherwise the row-major tensors, and the report says why).
pub(super) fn choose_and_pack(
    kernels: &aot_kernels::dispatch::LoadedKernels,
    c: &crate::model::Qwen3Config,
    w: &super::weights::DeviceWeights,
    asked: DecodeStep,
    widest_k: usize,
) -> Result<(StepChoice, Option<PackedModel>), RunnerError> {
    // Read first, so that a bad value is refused whichever step runs.
    let tensor_copies = persistent::tensor_copies(kernels);
    let pack = pack_projections(tensor_copies)?;
    let mut choice = choose(kernels, asked, widest_k);
    if choice.step == DecodeStep::Launches || !pack {
        return Ok((choice, None));
    }
    let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let shapes = [
        (c.qkv_dim(), h, 16, false),
        (h, c.q_dim(), NARROW_TILE_ROWS, false),
        (2 * i, h, 16, true),
        (h, i, NARROW_TILE_ROWS, false),
    ];
    let bytes: usize = c.num_hidden_layers
        * shapes
            .iter()
            .map(|&(n, k, r, _)| 2 * persistent::packed_len(n, k, r))
            .sum::<usize>()
        + 2 * persistent::packed_len(v, h, 16);
    let (free, _) = kernels
        .context()
        .mem_get_info()
        .map_err(super::dev_err("reading free memory"))?;
    if free < bytes + PACK_HEADROOM {
        choice.weights = "row-major";
        // Under cp.async (what `auto` packs for) the row-major weights stream slower.
        let slower = if tensor_copies {
            ""
        } else {
            " (slower here: the step streams with cp.async, a copy per 16-byte piece)"
        };
        choice.fallback = Some(format!(
            "the persistent step reads the row-major weights{slower}: their packed copy needs \
             {:.2} GB and {:.2} GB is free (with {:.1} GB to spare)",
            bytes as f64 / 1e9,
            free as f64 / 1e9,
            PACK_HEADROOM as f64 / 1e9
        ));
        return Ok((choice, None));
    }
    let pack_one = |t, (n, k, rows, paired): (usize, usize, usize, bool)| {
        persistent::pack_weights(kernels, dev(kernels, t), n, k, rows, paired)
            .map_err(super::ops_err)
    };
    let mut layers = Vec::with_capacity(w.layers.len());
    for lw in &w.layers {
        layers.push([
            pack_one(&lw.qkv, shapes[0])?,
            pack_one(&lw.o, shapes[1])?,
            pack_one(&lw.gate_up, shapes[2])?,
            pack_one(&lw.down, shapes[3])?,
        ]);
    }
    let lm_head = pack_one(w.lm_head(), (v, h, 16, false))?;
    choice.weights = "packed";
    Ok((choice, Some(PackedModel { layers, lm_head })))
}

/// Decides the step: the persistent one where asked and it can run here (its module loaded, its
/// blocks no more than the SMs, a ring beside the widest x fitting shared memory), otherwise the
/// launch path with the reason.
pub(super) fn choose(
    kernels: &aot_kernels::dispatch::LoadedKernels,
    asked: DecodeStep,
    widest_k: usize,
) -> StepChoice {
    let DecodeStep::Persistent { blocks } = asked else {
        return StepChoice {
            step: asked,
            blocks: 0,
            weights: "",
            fallback: None,
        };
    };
    let sms = kernels.sm_count();
    let blocks = blocks.unwrap_or(sms);
    let why = if blocks == 0 || blocks > sms {
        Some(format!(
            "{blocks} persistent blocks on {sms} SMs: every block must be resident (1..={sms})"
        ))
    } else {
        persistent::stages_for(kernels, persistent::MAX_TOKENS, widest_k)
            .err()
            .map(|e| e.to_string())
    };
    match why {
        None => StepChoice {
            step: asked,
            blocks,
            weights: "row-major",
            fallback: None,
        },
        Some(reason) => StepChoice {
            step: DecodeStep::Launches,
            blocks: 0,
            weights: "",
            fallback: Some(format!(
                "the persistent decode step cannot run here, so the launch path runs: {reason}"
            )),
        },
    }
}

impl GpuRunner {
    /// The persistent steps of `m`-row passes: `layers + 1` of them (see the module's table).
    fn build_steps(&self, m: usize) -> Result<Vec<PersistentStep<'static>>, OpsError> {
        let c = &self.cfg;
        let kernels = &self.kernels;
        let b = &self.b;
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let eps = c.rms_norm_eps as f32;
        let layers = &self.w.layers;
        // Packed weights where the runner packed them, else the row-major tensors.
        let weight = |l: usize, which: usize, row_major| match &self.packed {
            Some(p) if l < p.layers.len() => StepWeights::Packed(&p.layers[l][which]),
            Some(p) => StepWeights::Packed(&p.lm_head),
            None => StepWeights::RowMajor(dev(kernels, row_major)),
        };
        let norm = |w| StepInput::Norm {
            weight: dev(kernels, w),
            eps,
            weight_offset: 0.0,
        };
        let mut steps = Vec::with_capacity(layers.len() + 1);
        for s in 0..=layers.len() {
            let mut nodes: Vec<GemvNode> = Vec::new();
            let mut binds: Vec<GemvBinding<'_>> = Vec::new();
            let mut push = |nodes: &mut Vec<GemvNode>, n, k, tile_rows, bind| {
                let after = nodes.len().checked_sub(1);
                nodes.push(GemvNode {
                    n,
                    k,
                    tile_rows,
                    after,
                });
                binds.push(bind);
            };
            if s > 0 {
                let lw = &layers[s - 1];
                push(
                    &mut nodes,
                    h,
                    c.q_dim(),
                    NARROW_TILE_ROWS,
                    GemvBinding {
                        w: weight(s - 1, 1, &lw.o),
                        x: dev(kernels, &b.attn),
                        input: StepInput::Plain,
                        out: StepOutput::Residual(dev(kernels, &b.h)),
                        m,
                        ld_x: c.q_dim(),
                        ld_out: h,
                    },
                );
                push(
                    &mut nodes,
                    2 * i,
                    h,
                    16,
                    GemvBinding {
                        w: weight(s - 1, 2, &lw.gate_up),
                        x: dev(kernels, &b.h),
                        input: norm(&lw.post_norm),
                        out: StepOutput::SiluMul(dev(kernels, &b.act)),
                        m,
                        ld_x: h,
                        ld_out: i,
                    },
                );
                push(
                    &mut nodes,
                    h,
                    i,
                    NARROW_TILE_ROWS,
                    GemvBinding {
                        w: weight(s - 1, 3, &lw.down),
                        x: dev(kernels, &b.act),
                        input: StepInput::Plain,
                        out: StepOutput::Residual(dev(kernels, &b.h)),
                        m,
                        ld_x: i,
                        ld_out: h,
                    },
                );
            }
            if let Some(lw) = layers.get(s) {
                push(
                    &mut nodes,
                    c.qkv_dim(),
                    h,
                    16,
                    GemvBinding {
                        w: weight(s, 0, &lw.qkv),
                        x: dev(kernels, &b.h),
                        input: norm(&lw.input_norm),
                        out: StepOutput::Bf16(dev(kernels, &b.qkv)),
                        m,
                        ld_x: h,
                        ld_out: c.qkv_dim(),
                    },
                );
            } else {
                push(
                    &mut nodes,
                    v,
                    h,
                    16,
                    GemvBinding {
                        w: weight(layers.len(), 0, self.w.lm_head()),
                        x: dev(kernels, &b.h),
                        input: norm(&self.w.final_norm),
                        out: StepOutput::F32(dev(kernels, &b.logits)),
                        m,
                        ld_x: h,
                        ld_out: v,
                    },
                );
            }
            let sched = schedule(&nodes, self.step.blocks)?;
            // SAFETY: every buffer bound here is a field of this runner (its weights and pass
            // buffers), allocated once in `GpuRunner::new`, never reallocated, and dropped with the
            // runner, which drops these steps too; the runner's launches all go on the one stream
            // the steps launch on, which orders every other access.
            let mut step = unsafe { PersistentStep::new_unbound(kernels, &nodes, &sched, binds)? };
            if self.persistent_stamps {
                step.enable_stamps(kernels)?;
            }
            steps.push(step);
        }
        Ok(steps)
    }

    /// Launches one forward pass over the first `m` rows on the persistent steps (attention with
    /// `grid_splits` splits deep, pipelined or not, merged in clusters or not, as on the launch
    /// path), then the sampling.
    pub(super) fn launch_forward_persistent(
        &mut self,
        m: usize,
        grid_splits: usize,
        pipelined: bool,
        cluster: bool,
    ) -> Result<(), OpsError> {
        if self.persistent_steps[m].is_none() {
            self.persistent_steps[m] = Some(self.build_steps(m)?);
        }
        self.last_rows = m;
        let c = &self.cfg;
        let kernels = &self.kernels;
        let (h, v) = (c.hidden_size, c.vocab_size);
        embedding(
            kernels,
            dev_mut(kernels, &mut self.b.h),
            h,
            None,
            dev(kernels, &self.w.embed),
            v,
            h,
            dev(kernels, &inputs::tokens(&self.b.inputs)),
            m,
        )?;
        let layers = self.w.layers.len();
        for s in 0..=layers {
            let steps = self.persistent_steps[m]
                .as_mut()
                .expect("built above for this row count");
            steps[s].launch(&self.kernels)?;
            if s < layers {
                attention_layer(
                    &self.kernels,
                    &self.cfg,
                    AttnLayer {
                        lw: &self.w.layers[s],
                        k_cache: &mut self.k_cache[s],
                        v_cache: &mut self.v_cache[s],
                        rope: &self.rope,
                        max_pos: self.max_pos,
                        block_table: &self.block_table,
                        ld_bt: self.ld_bt,
                    },
                    &mut self.b,
                    (m, grid_splits, pipelined, cluster),
                )?;
            }
        }
        self.b.sample(&self.kernels, m, v)
    }
}

/// The op kinds of step `s` of `layers` (see the module's table), as the trace names them.
fn step_kinds(s: usize, layers: usize) -> Vec<&'static str> {
    let mut kinds = if s == 0 {
        vec![]
    } else {
        vec!["o_proj", "gate_up", "down"]
    };
    kinds.push(if s < layers { "qkv" } else { "lm_head" });
    kinds
}

impl GpuRunner {
    /// The last persistent pass's stamps as a table and a timeline (synchronizes the stream);
    /// `None` unless stamping.
    pub(super) fn persistent_trace(&self) -> Option<Result<crate::runner::PassTrace, RunnerError>> {
        use aot_kernels::ops::persistent_trace::{kind_times, table, timeline_svg};
        if !self.persistent_stamps || self.last_rows == 0 {
            return None;
        }
        let steps = self.persistent_steps[self.last_rows].as_ref()?;
        let layers = self.w.layers.len();
        let names = ["qkv", "o_proj", "gate_up", "down", "lm_head"];
        let mut launches = Vec::with_capacity(steps.len());
        for (s, step) in steps.iter().enumerate() {
            let kinds = step_kinds(s, layers);
            let runs = match step.read_stamps(&self.kernels) {
                Ok(r) => r,
                Err(e) => return Some(Err(super::ops_err(e))),
            };
            launches.push(
                runs.into_iter()
                    .map(|mut r| {
                        r.op = names.iter().position(|n| *n == kinds[r.op]).unwrap_or(0);
                        r
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let kind_of = |op: usize| names[op].to_string();
        let all: Vec<_> = launches.iter().flatten().copied().collect();
        let times = kind_times(&all, &kind_of);
        // The pass's span, the launches' own spans, and what lies between them (attention, the
        // launches' starts and ends).
        let span = |runs: &[aot_kernels::ops::persistent::RunStamp]| {
            let live = runs.iter().filter(|r| r.start > 0 && r.end >= r.start);
            let lo = live.clone().map(|r| r.start).min();
            let hi = live.map(|r| r.end).max();
            lo.zip(hi)
        };
        let covered: u64 = launches
            .iter()
            .filter_map(|l| span(l))
            .map(|(a, b)| b - a)
            .sum();
        let whole = span(&all).map_or(0, |(a, b)| b - a);
        let mut md = format!(
            "Persistent step, {} rows, {} blocks: the pass spans {:.1} us; its {} persistent launches span {:.1} us together, {:.1} us lie between them (attention, launch ends and starts).\n\n",
            self.last_rows,
            self.step.blocks,
            whole as f64 / 1e3,
            launches.len(),
            covered as f64 / 1e3,
            whole.saturating_sub(covered) as f64 / 1e3
        );
        md.push_str(&table(&times));
        let svg = timeline_svg(
            &launches,
            &kind_of,
            &format!(
                "{}: one decode pass of {} rows on the persistent step",
                self.kernels.report().device_name,
                self.last_rows
            ),
        );
        Some(Ok(crate::runner::PassTrace {
            rows: self.last_rows,
            table: md,
            svg,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_name_their_ops_in_the_order_the_module_lists_them() {
        assert_eq!(step_kinds(0, 3), ["qkv"]);
        assert_eq!(step_kinds(2, 3), ["o_proj", "gate_up", "down", "qkv"]);
        assert_eq!(step_kinds(3, 3), ["o_proj", "gate_up", "down", "lm_head"]);
    }

    #[test]
    fn the_weights_mode_parses_by_name_and_names_the_choices_on_a_bad_one() {
        for tensor_copies in [false, true] {
            assert!(!parse_weights_mode("row-major", tensor_copies).unwrap());
            assert!(parse_weights_mode("packed", tensor_copies).unwrap());
            // auto: packed only where the stream is cp.async's.
            assert_eq!(
                parse_weights_mode("auto", tensor_copies).unwrap(),
                !tensor_copies
            );
            assert_eq!(
                parse_weights_mode("", tensor_copies).unwrap(),
                !tensor_copies
            );
        }
        let e = parse_weights_mode("rowmajor", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains(WEIGHTS_ENV) && e.contains("rowmajor"), "{e}");
        assert!(
            e.contains("`auto`") && e.contains("`row-major`") && e.contains("`packed`"),
            "{e}"
        );
    }

    #[test]
    fn the_step_parses_by_name_and_names_the_choices_on_a_bad_one() {
        assert_eq!("launches".parse(), Ok(DecodeStep::Launches));
        assert_eq!(
            "persistent".parse(),
            Ok(DecodeStep::Persistent { blocks: None })
        );
        let e = "fused".parse::<DecodeStep>().unwrap_err();
        assert!(e.contains("persistent") && e.contains("launches"), "{e}");
    }
}
