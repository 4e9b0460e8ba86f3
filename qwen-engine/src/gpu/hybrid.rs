//! The GPU runner of the hybrid Qwen3.5/3.6 MoE family: set-up (kernels, weights, the KV cache
//! of the attention layers, the recurrent-state pools of the linear layers), the passes a step
//! becomes, and the [`Runner`]. The launches of a pass live in [`super::qwen3_5_moe`].
//!
//! A step's generated tokens run in decode passes of up to eight rows, one row per sequence; its
//! prompt chunks are packed into prefill passes of up to [`HYBRID_PASS_ROWS`] rows, a chunk longer
//! than that split across passes, with its recurrent state carried from piece to piece. A decode
//! pass replays a CUDA graph of its row count once that count has run eagerly
//! ([`super::graphs::hybrid_graph_decision`]); a pass with prompt rows runs eagerly. The host waits
//! for each pass's sampled tokens; decode-ahead is off, because a dropped pass would have advanced
//! recurrent state for good.
//!
//! State rules: a sequence whose step starts at position 0 starts from zero state (the
//! kernels ignore the slot's old content, `has_state = 0`), so a reused slot never sees the
//! request before it; a pass touches only the state slots of its own sequences.
//!
//! The Gated DeltaNet and MoE kernels are Triton modules compiled for the shapes of
//! Qwen3.5/3.6-35B-A3B (their constants are fixed at compile time); [`triton_fit`] says whether a
//! config has those shapes, and the runner refuses one that has not, naming the field. The
//! Triton modules exist for CUDA 13 only: on a 12.x driver the runner stops with the plan's reason.

use std::collections::HashMap;
use std::time::Instant;

use aot_kernels::device::{CudaGraph, CudaSlice};
use aot_kernels::dispatch::{self, LoadedKernels, ModuleSource};
use aot_kernels::ops::attention::{attn_scratch_needs, MAX_GROUP};
use aot_kernels::ops::gated_delta_net::{GdnScratch, GdnShape};
use aot_kernels::ops::gemv::{residual_groups, MAX_TOKENS};
use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;
use aot_kernels::ops::moe::{MoeScratch, MoeShape};
use aot_kernels::registry::ModuleKind;
use half::bf16;

use super::graphs::{hybrid_graph_decision, GraphDecision};
use super::hybrid_weights::{self, partial_rope_table, HybridWeights};
use super::{dev_err, inputs, GpuOptions, GpuStats, PassOutput, Row};
use crate::memory;
use crate::model::{ModelConfig, Qwen35MoeConfig};
use crate::runner::{
    check_plan, DeviceKind, PlanLimits, Runner, RunnerError, SampleRequest, StepOutput, StepPlan,
};
use crate::weights::Weights;

/// Rows of one prefill pass. The MoE kernels take 16 rows a call, so a pass runs them in groups.
pub const HYBRID_PASS_ROWS: usize = 64;

/// Whether the config has the shapes the Triton GDN and MoE modules were compiled for (Qwen3.5 /
/// Qwen3.6-35B-A3B's), and the attention shapes the CUDA kernels serve; `Err` names the field
/// that differs.
pub fn triton_fit(c: &Qwen35MoeConfig) -> Result<(), String> {
    let gdn = GdnShape::QWEN3_5_A3B;
    let moe = MoeShape::QWEN3_5_A3B;
    let checks = [
        ("hidden_size", c.hidden_size, moe.hidden),
        ("num_experts", c.num_experts, moe.experts),
        ("num_experts_per_tok", c.num_experts_per_tok, moe.top_k),
        ("moe_intermediate_size", c.moe_intermediate_size, moe.inter),
        (
            "shared_expert_intermediate_size",
            c.shared_expert_intermediate_size,
            moe.inter,
        ),
        (
            "linear_num_key_heads",
            c.linear_num_key_heads,
            gdn.key_heads,
        ),
        (
            "linear_num_value_heads",
            c.linear_num_value_heads,
            gdn.value_heads,
        ),
        ("linear_key_head_dim", c.linear_key_head_dim, gdn.key_dim),
        (
            "linear_value_head_dim",
            c.linear_value_head_dim,
            gdn.value_dim,
        ),
        (
            "linear_conv_kernel_dim",
            c.linear_conv_kernel_dim,
            gdn.conv_width,
        ),
    ];
    for (field, have, built) in checks {
        if have != built {
            return Err(format!(
                "{field} is {have}; the GPU's Gated DeltaNet and MoE kernels are compiled for {built} \
                 (Qwen3.5/3.6-35B-A3B's shapes). Run this model on the CPU reference runner (--device cpu)"
            ));
        }
    }
    let group = c.num_attention_heads / c.num_key_value_heads.max(1);
    if ![64, 128, 256].contains(&c.head_dim) || group > MAX_GROUP {
        return Err(format!(
            "head_dim {} with {group} query heads per KV head: the attention kernels serve head dims \
             64, 128 and 256 and up to {MAX_GROUP} heads per KV head. Run this model on the CPU (--device cpu)",
            c.head_dim
        ));
    }
    Ok(())
}

/// One sequence's rows in a pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassSeq {
    /// Its first row in the pass, and how many.
    pub row: usize,
    pub len: usize,
    /// Request slot (block-table row) and recurrent-state slot.
    pub slot: usize,
    pub state_slot: usize,
    pub start_pos: usize,
    /// Sample after the last row.
    pub sample: Option<SampleRequest>,
}

/// Per-pass buffers, sized for [`HYBRID_PASS_ROWS`] rows.
pub(super) struct HybridBuffers {
    /// `[tokens | positions | slot of row]`, `rows` each.
    pub rows_meta: CudaSlice<i32>,
    pub cu_seqlens: CudaSlice<i32>,
    pub state_slots: CudaSlice<i32>,
    pub has_state: CudaSlice<i32>,
    /// The residual stream, and the normalised inputs of the mixers and the MoE blocks.
    pub h: CudaSlice<bf16>,
    pub x: CudaSlice<bf16>,
    pub y: CudaSlice<bf16>,
    /// A decode pass's output projections: the new h's sums of squares per 16 rows, and the count
    /// of the GEMV's blocks that finished (zero between launches), for the norm its last block
    /// applies.
    pub out_ssq: CudaSlice<f32>,
    pub out_arrived: CudaSlice<i32>,
    /// Gated DeltaNet projections and output.
    pub gdn_qkv: CudaSlice<bf16>,
    pub gdn_z: CudaSlice<bf16>,
    pub gdn_b: CudaSlice<bf16>,
    pub gdn_a: CudaSlice<bf16>,
    pub gdn_out: CudaSlice<bf16>,
    pub gdn_scratch: GdnScratch,
    /// Gated attention: `[queries | keys | values | gates]`, the queries after norm and RoPE
    /// (prefill), the attention output.
    pub qkvg: CudaSlice<bf16>,
    pub q: CudaSlice<bf16>,
    pub attn: CudaSlice<bf16>,
    pub attn_ml: CudaSlice<f32>,
    pub attn_o: CudaSlice<f32>,
    pub attn_counters: CudaSlice<u32>,
    /// The MoE block's input rows of one prefill call (16 of a pass's rows), and its scratch.
    pub moe_in: CudaSlice<bf16>,
    pub moe_scratch: MoeScratch,
    /// A decode pass's count of distinct experts per layer, at fixed addresses (a graph writes
    /// them); copied into the expert log after the pass.
    pub moe_counts: CudaSlice<i32>,
    /// The sampling rows' final hidden states, their logits, the sampling inputs, the tokens.
    pub last: CudaSlice<bf16>,
    pub logits: CudaSlice<f32>,
    pub inputs: CudaSlice<u64>,
    pub sampled: CudaSlice<i32>,
}

pub struct HybridGpuRunner {
    pub(super) kernels: LoadedKernels,
    pub(super) cfg: Qwen35MoeConfig,
    pub(super) gdn: GdnShape,
    pub(super) moe: MoeShape,
    pub(super) w: HybridWeights,
    /// Per attention layer.
    pub(super) k_cache: Vec<CudaSlice<bf16>>,
    pub(super) v_cache: Vec<CudaSlice<bf16>>,
    /// Per linear layer: `[slots, conv_state_len]` bf16 and `[slots, recurrent_state_len]` fp32.
    pub(super) conv_state: Vec<CudaSlice<bf16>>,
    pub(super) rec_state: Vec<CudaSlice<f32>>,
    pub(super) kv_blocks: usize,
    /// The permuted partial-RoPE table ([`hybrid_weights`]).
    pub(super) rope: CudaSlice<f32>,
    pub(super) max_pos: usize,
    pub(super) b: HybridBuffers,
    pub(super) block_table: CudaSlice<i32>,
    host_table: Vec<i32>,
    pub(super) ld_bt: usize,
    slots: usize,
    pub(super) stats: GpuStats,
    setup_s: f64,
    /// The distinct experts of every decode pass's MoE calls, one count per call (copied on the
    /// device from the routing kernel's output; [`EXPERT_LOG`] calls at most), for the bench's
    /// bytes per step, and how many were logged.
    pub(super) expert_log: CudaSlice<i32>,
    pub(super) expert_log_len: usize,
    graphs_on: bool,
    /// The layers of a decode pass, captured per row count.
    graphs: HashMap<usize, CudaGraph>,
    /// Decode row counts that have run eagerly once (graphs capture after that).
    seen: [bool; MAX_TOKENS + 1],
}

/// MoE calls whose distinct experts a runner logs (then it stops logging).
pub const EXPERT_LOG: usize = 1 << 20;

impl HybridGpuRunner {
    /// Loads the kernels (CUDA and Triton modules), uploads or generates the weights, sizes the
    /// KV cache and the state pools.
    pub fn new(
        config: &ModelConfig,
        weights: &Weights,
        options: &GpuOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<HybridGpuRunner, RunnerError> {
        let started = Instant::now();
        let ModelConfig::Qwen35Moe(cfg) = config else {
            return Err(RunnerError::Device(format!(
                "the hybrid GPU runner serves `qwen3_5_moe`, not `{}`",
                config.model_type()
            )));
        };
        triton_fit(cfg).map_err(RunnerError::Device)?;
        let model = config.describe();
        let kernels = load_kernels(options)?;
        let s = kernels.stream().clone();
        let w = hybrid_weights::upload(&kernels, cfg, weights, progress)?;
        let t = HYBRID_PASS_ROWS;
        let (h, d, v) = (cfg.hidden_size, cfg.head_dim, cfg.vocab_size);
        let (nh, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let gdn = GdnShape {
            key_heads: cfg.linear_num_key_heads,
            value_heads: cfg.linear_num_value_heads,
            key_dim: cfg.linear_key_head_dim,
            value_dim: cfg.linear_value_head_dim,
            conv_width: cfg.linear_conv_kernel_dim,
        };
        let moe = MoeShape {
            hidden: h,
            experts: cfg.num_experts,
            top_k: cfg.num_experts_per_tok,
            inter: cfg.moe_intermediate_size,
        };
        let bf = |n: usize, what: &str| s.alloc_zeros::<bf16>(n.max(1)).map_err(dev_err(what));
        let f32s = |n: usize, what: &str| s.alloc_zeros::<f32>(n.max(1)).map_err(dev_err(what));
        let i32s = |n: usize, what: &str| s.alloc_zeros::<i32>(n.max(1)).map_err(dev_err(what));
        let ops = |e| RunnerError::Device(format!("pass buffers: {e}"));
        let (ml, o, ac) = attn_scratch_needs(MAX_TOKENS, nh, kv, d);
        let b = HybridBuffers {
            rows_meta: i32s(3 * t, "pass inputs")?,
            cu_seqlens: i32s(t + 1, "pass inputs")?,
            state_slots: i32s(t, "pass inputs")?,
            has_state: i32s(t, "pass inputs")?,
            h: bf(t * h, "hidden")?,
            x: bf(t * h, "hidden")?,
            y: bf(t * h, "hidden")?,
            out_ssq: f32s(residual_groups(h) * MAX_TOKENS, "output projection")?,
            out_arrived: i32s(1, "output projection")?,
            gdn_qkv: bf(t * gdn.conv_dim(), "linear attention")?,
            gdn_z: bf(t * gdn.value_width(), "linear attention")?,
            gdn_b: bf(t * gdn.value_heads, "linear attention")?,
            gdn_a: bf(t * gdn.value_heads, "linear attention")?,
            gdn_out: bf(t * gdn.value_width(), "linear attention")?,
            gdn_scratch: GdnScratch::new(&s, &gdn, t).map_err(ops)?,
            qkvg: bf(t * (2 * nh + 2 * kv) * d, "attention")?,
            q: bf(t * nh * d, "attention")?,
            attn: bf(t * nh * d, "attention")?,
            attn_ml: f32s(ml, "attention workspace")?,
            attn_o: f32s(o, "attention workspace")?,
            attn_counters: s
                .alloc_zeros::<u32>(ac.max(1))
                .map_err(dev_err("attention workspace"))?,
            moe_in: bf(MOE_ROWS * h, "moe")?,
            moe_scratch: MoeScratch::new(&s, &moe, MOE_ROWS).map_err(ops)?,
            moe_counts: i32s(cfg.num_hidden_layers, "expert counts")?,
            last: bf(MAX_TOKENS * h, "sampling rows")?,
            logits: f32s(MAX_TOKENS * v, "logits")?,
            inputs: s
                .alloc_zeros::<u64>(inputs::WORDS)
                .map_err(dev_err("sampling inputs"))?,
            sampled: i32s(MAX_TOKENS, "sampled tokens")?,
        };
        let max_pos = options.max_context.min(cfg.max_position_embeddings).max(1);
        let rope = s
            .clone_htod(&partial_rope_table(
                max_pos,
                d,
                cfg.rotary_dim,
                cfg.rope_theta,
            ))
            .map_err(dev_err("RoPE table"))?;
        let ld_bt = max_pos.div_ceil(KV_BLOCK_TOKENS);
        let slots = options.slots.max(1);
        let block_table = i32s(slots * ld_bt, "block tables")?;
        let mut conv_state = Vec::new();
        let mut rec_state = Vec::new();
        for _ in 0..cfg.linear_layers() {
            conv_state.push(bf(slots * gdn.conv_state_len(), "conv state")?);
            rec_state.push(f32s(slots * gdn.recurrent_state_len(), "recurrent state")?);
        }
        let (free, _) = kernels
            .context()
            .mem_get_info()
            .map_err(dev_err("reading free memory"))?;
        // What the expert log will take is not free for the cache.
        let free = free.saturating_sub(EXPERT_LOG * 4);
        let kv_blocks = memory::gpu_kv_blocks(&model, options.kv_budget, free, slots * ld_bt)
            .map_err(RunnerError::Device)?;
        let per_layer = kv_blocks * kv * KV_BLOCK_TOKENS * d;
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.attention_layers() {
            k_cache.push(bf(per_layer, "KV cache")?);
            v_cache.push(bf(per_layer, "KV cache")?);
        }
        s.synchronize().map_err(dev_err("allocating"))?;
        Ok(HybridGpuRunner {
            kernels,
            cfg: cfg.clone(),
            gdn,
            moe,
            w,
            k_cache,
            v_cache,
            conv_state,
            rec_state,
            kv_blocks,
            rope,
            max_pos,
            b,
            block_table,
            host_table: vec![-1; slots * ld_bt],
            ld_bt,
            slots,
            stats: GpuStats::default(),
            setup_s: started.elapsed().as_secs_f64(),
            expert_log: i32s(EXPERT_LOG, "expert log")?,
            expert_log_len: 0,
            graphs_on: options.graphs,
            graphs: HashMap::new(),
            seen: [false; MAX_TOKENS + 1],
        })
    }

    pub fn kernels(&self) -> &LoadedKernels {
        &self.kernels
    }

    pub fn stats(&self) -> GpuStats {
        self.stats
    }

    /// Makes the device block table of `slot` name `blocks` (uploads the row if it changed).
    fn set_blocks(&mut self, slot: usize, blocks: &[u32]) -> Result<(), RunnerError> {
        super::set_block_row(
            &self.kernels,
            &mut self.block_table,
            &mut self.host_table,
            (self.slots, self.ld_bt, self.kv_blocks),
            slot,
            blocks,
        )
    }

    /// Uploads a pass's row and sequence inputs, runs it, and returns the sampled token of each
    /// sequence that asked for one (in `seqs` order, `None` for the others).
    fn run_pass(
        &mut self,
        seqs: &[PassSeq],
        tokens: &[u32],
        decode: bool,
        want_logits: bool,
    ) -> Result<PassOutput, RunnerError> {
        let n = tokens.len();
        let t = HYBRID_PASS_ROWS;
        let mut meta = vec![0i32; 3 * t];
        let mut cu = vec![0i32; seqs.len() + 1];
        let mut state_slots = Vec::with_capacity(seqs.len());
        let mut has_state = Vec::with_capacity(seqs.len());
        for (j, sq) in seqs.iter().enumerate() {
            for r in 0..sq.len {
                meta[sq.row + r] = tokens[sq.row + r] as i32;
                meta[t + sq.row + r] = (sq.start_pos + r) as i32;
                meta[2 * t + sq.row + r] = sq.slot as i32;
            }
            cu[j + 1] = (sq.row + sq.len) as i32;
            state_slots.push(sq.state_slot as i32);
            has_state.push(i32::from(sq.start_pos > 0));
        }
        let s = self.kernels.stream().clone();
        let err = dev_err("pass inputs");
        s.memcpy_htod(&meta, &mut self.b.rows_meta).map_err(&err)?;
        s.memcpy_htod(&cu, &mut self.b.cu_seqlens).map_err(&err)?;
        s.memcpy_htod(&state_slots, &mut self.b.state_slots)
            .map_err(&err)?;
        s.memcpy_htod(&has_state, &mut self.b.has_state)
            .map_err(&err)?;
        self.stats.passes += 1;
        self.run_layers(seqs, n, decode)?;
        if decode {
            self.log_experts()?;
        }

        // Sampling: the last row of every sequence that asks, eight at a time.
        let sampling: Vec<(usize, &PassSeq)> = seqs
            .iter()
            .enumerate()
            .filter(|(_, sq)| sq.sample.is_some())
            .collect();
        let mut out_tokens = vec![None; seqs.len()];
        let mut out_logits = vec![Vec::new(); seqs.len()];
        for group in sampling.chunks(MAX_TOKENS) {
            let rows: Vec<Row> = group
                .iter()
                .map(|(_, sq)| Row {
                    token: 0,
                    pos: sq.start_pos + sq.len - 1,
                    slot: sq.slot,
                    sample: sq.sample,
                })
                .collect();
            let last_rows: Vec<usize> = group.iter().map(|(_, sq)| sq.row + sq.len - 1).collect();
            let mut words = vec![0u64; inputs::WORDS];
            inputs::pack(&rows, &mut words);
            s.memcpy_htod(&words, &mut self.b.inputs).map_err(&err)?;
            self.launch_logits(&last_rows).map_err(super::ops_err)?;
            let sampled = s
                .clone_dtoh(&self.b.sampled.slice(0..group.len()))
                .map_err(dev_err("reading sampled tokens"))?;
            let v = self.cfg.vocab_size;
            for (i, ((j, _), tok)) in group.iter().zip(sampled).enumerate() {
                out_tokens[*j] = Some(tok as u32);
                if want_logits {
                    out_logits[*j] = s
                        .clone_dtoh(&self.b.logits.slice(i * v..(i + 1) * v))
                        .map_err(dev_err("reading logits"))?;
                }
            }
        }
        Ok((out_tokens, out_logits))
    }
}

impl HybridGpuRunner {
    /// The layers of a pass over the inputs already in the pass buffers: a replay of the graph
    /// of its row count (captured now if it has none), or launches
    /// ([`hybrid_graph_decision`] says which).
    fn run_layers(&mut self, seqs: &[PassSeq], n: usize, decode: bool) -> Result<(), RunnerError> {
        let seen = self.seen[n.min(MAX_TOKENS)];
        match hybrid_graph_decision(self.graphs_on, decode, n, seen) {
            GraphDecision::Replay => {
                if !self.graphs.contains_key(&n) {
                    let s = self.kernels.stream().clone();
                    let graph = super::graphs::capture(&s, "capturing the layers", || {
                        self.launch_layers(seqs, n, decode)
                    })?;
                    self.graphs.insert(n, graph);
                    self.stats.graph_captures += 1;
                }
                self.graphs[&n]
                    .launch()
                    .map_err(dev_err("replaying the layers"))?;
                self.stats.graph_replays += 1;
            }
            _ => {
                self.launch_layers(seqs, n, decode)
                    .map_err(super::ops_err)?;
                if decode {
                    self.seen[n.min(MAX_TOKENS)] = true;
                }
                self.stats.eager_passes += 1;
            }
        }
        Ok(())
    }

    /// Appends a decode pass's per-layer expert counts to the expert log (while it has room).
    fn log_experts(&mut self) -> Result<(), RunnerError> {
        let layers = self.cfg.num_hidden_layers;
        let at = self.expert_log_len;
        if at + layers > EXPERT_LOG {
            return Ok(());
        }
        self.kernels
            .stream()
            .memcpy_dtod(
                &self.b.moe_counts.slice(0..layers),
                &mut self.expert_log.slice_mut(at..at + layers),
            )
            .map_err(dev_err("expert log"))?;
        self.expert_log_len += layers;
        Ok(())
    }
}

/// Rows of one MoE call (the Triton modules' `MAX_TOKENS`; the launcher checks it).
pub(super) const MOE_ROWS: usize = 16;

/// Every CUDA module and the Triton modules the family needs; on a driver the Triton modules'
/// toolchain does not serve, the plan's reason.
fn load_kernels(options: &GpuOptions) -> Result<LoadedKernels, RunnerError> {
    let policy = options.policy;
    let sources = super::with_ptx_modules(
        [ModuleKind::Cuda, ModuleKind::Triton]
            .into_iter()
            .flat_map(ModuleSource::registry_of_kind)
            .map(|m| m.with_toolchains(options.toolchain))
            .collect(),
        &options.ptx_modules,
    )?;
    let device = dispatch::open_device(0).map_err(|e| RunnerError::Device(e.to_string()))?;
    let plan = dispatch::plan::plan(device.spec, policy, false, &sources);
    let needed: Vec<&str> = aot_kernels::ops::gated_delta_net::LAUNCHED
        .iter()
        .chain(aot_kernels::ops::moe::LAUNCHED)
        .map(|(module, _)| *module)
        .collect();
    for m in &plan.modules {
        if let (true, Some(why)) = (needed.contains(&m.module.as_str()), &m.unavailable) {
            return Err(RunnerError::Device(format!(
                "the hybrid model needs the Triton module `{}`, unavailable here: {why}",
                m.module
            )));
        }
    }
    dispatch::load_available(&device, policy, &sources)
        .map_err(|e| RunnerError::Device(e.to_string()))
}

impl Runner for HybridGpuRunner {
    fn device(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    fn state_slots(&self) -> usize {
        self.slots
    }

    fn max_slots(&self) -> usize {
        self.slots
    }

    fn max_context(&self) -> usize {
        self.max_pos
    }

    fn step(&mut self, plan: &StepPlan<'_>) -> Result<StepOutput, RunnerError> {
        check_plan(
            plan,
            &PlanLimits {
                slots: self.slots,
                kv_blocks: self.kv_blocks,
                vocab: self.cfg.vocab_size,
                max_context: self.max_pos,
                recurrent: true,
            },
        )?;
        for seq in &plan.seqs {
            self.set_blocks(seq.slot, seq.blocks)?;
        }
        let mut out = StepOutput {
            tokens: vec![None; plan.seqs.len()],
            logits: vec![Vec::new(); plan.seqs.len()],
        };
        let state = |j: usize| plan.seqs[j].state_slot.unwrap_or(0) as usize;
        // Generated tokens: one row per sequence, eight a pass.
        let decode: Vec<usize> = (0..plan.seqs.len())
            .filter(|&j| !plan.seqs[j].prefill)
            .collect();
        for group in decode.chunks(MAX_TOKENS) {
            let seqs: Vec<PassSeq> = group
                .iter()
                .enumerate()
                .map(|(r, &j)| {
                    let sq = &plan.seqs[j];
                    PassSeq {
                        row: r,
                        len: 1,
                        slot: sq.slot,
                        state_slot: state(j),
                        start_pos: sq.start_pos,
                        sample: sq.sample,
                    }
                })
                .collect();
            let tokens: Vec<u32> = group.iter().map(|&j| plan.seqs[j].tokens[0]).collect();
            let (t, l) = self.run_pass(&seqs, &tokens, true, plan.want_logits)?;
            for ((&j, t), l) in group.iter().zip(t).zip(l) {
                out.tokens[j] = t;
                out.logits[j] = l;
            }
        }
        // Prompt chunks: packed into passes of HYBRID_PASS_ROWS rows; a chunk that does not fit
        // the rest of a pass goes on in the next (its state carried), sampling after its last row.
        let mut seqs: Vec<PassSeq> = Vec::new();
        let mut owners: Vec<usize> = Vec::new();
        let mut tokens: Vec<u32> = Vec::new();
        for j in (0..plan.seqs.len()).filter(|&j| plan.seqs[j].prefill) {
            let sq = &plan.seqs[j];
            let mut from = 0;
            while from < sq.tokens.len() {
                let room = HYBRID_PASS_ROWS - tokens.len();
                let len = room.min(sq.tokens.len() - from);
                let last = from + len == sq.tokens.len();
                seqs.push(PassSeq {
                    row: tokens.len(),
                    len,
                    slot: sq.slot,
                    state_slot: state(j),
                    start_pos: sq.start_pos + from,
                    sample: if last { sq.sample } else { None },
                });
                owners.push(j);
                tokens.extend_from_slice(&sq.tokens[from..from + len]);
                from += len;
                if tokens.len() == HYBRID_PASS_ROWS {
                    self.flush_prefill(&mut seqs, &mut owners, &mut tokens, plan, &mut out)?;
                }
            }
        }
        if !tokens.is_empty() {
            self.flush_prefill(&mut seqs, &mut owners, &mut tokens, plan, &mut out)?;
        }
        Ok(out)
    }

    fn report(&self) -> serde_json::Value {
        let distinct: Option<i64> = self
            .kernels
            .stream()
            .clone_dtoh(&self.expert_log.slice(0..self.expert_log_len))
            .ok()
            .map(|v| v.iter().map(|&n| i64::from(n)).sum());
        serde_json::json!({
            "moe_routing": {
                "decode_moe_calls": self.expert_log_len,
                "distinct_experts": distinct,
            },
            "device": DeviceKind::Cuda,
            "device_name": self.kernels.report().device_name,
            "sm_count": self.kernels.sm_count(),
            "dispatch": self.kernels.report(),
            "kv_blocks": self.kv_blocks,
            "kv_block_tokens": KV_BLOCK_TOKENS,
            "state_slots": self.slots,
            "weights_bytes": self.w.bytes,
            "graphs": self.graphs_on,
            "stats": self.stats,
            "setup_s": self.setup_s,
        })
    }
}

impl HybridGpuRunner {
    /// Runs the packed prefill pass and empties the packing.
    fn flush_prefill(
        &mut self,
        seqs: &mut Vec<PassSeq>,
        owners: &mut Vec<usize>,
        tokens: &mut Vec<u32>,
        plan: &StepPlan<'_>,
        out: &mut StepOutput,
    ) -> Result<(), RunnerError> {
        let (t, l) = self.run_pass(seqs, tokens, false, plan.want_logits)?;
        for ((&j, t), l) in owners.iter().zip(t).zip(l) {
            if t.is_some() {
                out.tokens[j] = t;
                out.logits[j] = l;
            }
        }
        seqs.clear();
        owners.clear();
        tokens.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_a3b_shapes_fit_the_kernels_and_others_are_refused_by_field() {
        assert_eq!(triton_fit(&Qwen35MoeConfig::qwen3_6_35b_a3b()), Ok(()));
        let err = triton_fit(&Qwen35MoeConfig::tiny()).unwrap_err();
        assert!(
            err.contains("hidden_size") && err.contains("--device cpu"),
            "{err}"
        );
        let mut c = Qwen35MoeConfig::qwen3_6_35b_a3b();
        c.num_experts = 512;
        let err = triton_fit(&c).unwrap_err();
        assert!(err.starts_with("num_experts is 512"), "{err}");
    }
}
