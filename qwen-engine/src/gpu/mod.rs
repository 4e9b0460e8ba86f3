//! The GPU runner on the AOT kernels of `aot-kernels` (every kernel from the embedded registry,
//! picked by the dispatcher for this GPU and driver; nothing beyond libcuda at run time): set-up,
//! passes and the [`Runner`] here; the forward pass of each family in its own file ([`qwen3`]);
//! CUDA graphs in [`graphs`]. The hybrid family has its own runner ([`hybrid`]); [`open_runner`]
//! picks the runner of a config's family.
//!
//! Prompt tokens go through the prefill path ([`prefill`]: GEMMs over a chunk). Generated tokens
//! go through decode passes of 1 to 8 token rows, each a (slot, position, token) of a different
//! request, one forward pass each (launches, or a graph replay). Every row's result depends on that row
//! alone (kernels never mix rows), so a request computes the same bits alone or in a batch, and a
//! prompt the same bits however it is chunked. Passes of a given row count replay a CUDA graph
//! (see [`graphs`]); the host waits in a pass only for its sampled tokens (and before refilling a
//! page-locked staging buffer, for that buffer's copy two passes back), and by then it has queued
//! the likely next pass (see [`ahead`]), so the GPU does not wait for the host between steps.

mod ahead;
pub mod graphs;
pub mod hybrid;
pub mod hybrid_weights;
mod inputs;
mod packing;
pub mod persistent;
pub mod prefill;
mod qwen3;
mod qwen3_5_moe;
pub mod weights;

use std::collections::HashMap;
use std::time::Instant;

use aot_kernels::device::{self, CudaEvent, CudaGraph, CudaSlice, DriverError, PinnedHostSlice};
use aot_kernels::dispatch::{self, LoadedKernels, ModuleSource, Policy, ToolchainChoice};
use aot_kernels::ops::attention::{
    self, attn_cluster, attn_pipelined, attn_scratch_needs, attn_splits,
};
use aot_kernels::ops::gemv::{residual_groups, MAX_TOKENS};
use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::sampling::{sample_tokens, DeviceSamplingParams, LogitsShape};
use aot_kernels::ops::{dev, OpsError};
use aot_kernels::registry::ModuleKind;
use half::bf16;
use serde::Serialize;

pub use self::persistent::DecodeStep;
use self::persistent::StepChoice;
use self::weights::DeviceWeights;
use crate::memory;
use crate::model::{ModelConfig, Qwen3Config};
use crate::runner::{
    check_plan, DeviceKind, PlanLimits, Runner, RunnerError, SampleRequest, StepOutput, StepPlan,
};
use crate::weights::Weights;

/// How to set up the GPU runner.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub policy: Policy,
    /// Request slots (sequences in flight).
    pub slots: usize,
    /// KV cache bytes; `None` sizes it from free memory.
    pub kv_budget: Option<usize>,
    pub graphs: bool,
    /// Longest sequence served (sizes the RoPE table and the block tables).
    pub max_context: usize,
    /// Which toolchains' images the dispatcher may pick (`cuda12`: what a 12.x driver gets, to
    /// test those images on a 13.x driver).
    pub toolchain: ToolchainChoice,
    /// Rows of one packed prefill pass: the prompt chunks of a step share passes of this many
    /// tokens (default [`prefill::PREFILL_TOKENS`]); sizes the prefill activations.
    pub prefill_tokens: usize,
    /// Decode attention's kind: `None` lets `attn_pipelined` pick per pass (the default);
    /// `Some(kind)` forces it (tests: both kinds must give the same bits).
    pub attention_pipelined: Option<bool>,
    /// Whether decode attention may merge its splits inside thread-block clusters where
    /// `attn_cluster` says that pays (Hopper and later, sm_90+ images; the same bits either way).
    /// `false` keeps the workspace merge everywhere (A/B measurements, tests).
    pub attention_cluster: bool,
    /// Queue the likely next decode pass before waiting for a pass's tokens (see [`ahead`]; the
    /// same tokens either way). A plan the pass does not fit (other tokens than those sampled,
    /// other rows) drops it, a pass's work thrown away. `false`: every step waits for its own pass
    /// only.
    pub decode_ahead: bool,
    /// Modules loaded from their PTX whatever `policy` says (`--ptx-modules`): one module's
    /// fallback path beside the others' SASS, to find which module's PTX moves a result or a
    /// step's time. Empty: `policy` alone decides.
    pub ptx_modules: Vec<String>,
    /// How decode passes run (`--step`): launch per op, or the persistent step ([`persistent`])
    /// where it can run here (else the launch path, the report says why).
    pub step: DecodeStep,
    /// Stamp every task run of the persistent step (a diagnostic run: [`Runner::pass_trace`]
    /// draws the last pass); the launch path ignores it.
    pub persistent_stamps: bool,
}

/// `sources` with the modules named in `ptx_modules` cut to their PTX images
/// ([`ModuleSource::ptx_only`]); a name that is none of them is an error that lists them.
pub(crate) fn with_ptx_modules(
    sources: Vec<ModuleSource>,
    ptx_modules: &[String],
) -> Result<Vec<ModuleSource>, RunnerError> {
    if let Some(unknown) = ptx_modules
        .iter()
        .find(|name| !sources.iter().any(|m| &m.name == *name))
    {
        let known: Vec<&str> = sources.iter().map(|m| m.name.as_str()).collect();
        return Err(RunnerError::Plan(format!(
            "--ptx-modules: `{unknown}` is not a module this runner loads; it loads {}",
            known.join(", ")
        )));
    }
    Ok(sources
        .into_iter()
        .map(|m| {
            if ptx_modules.contains(&m.name) {
                m.ptx_only()
            } else {
                m
            }
        })
        .collect())
}

/// Counters for the report.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct GpuStats {
    /// Decode passes launched (those queued ahead included).
    pub passes: usize,
    pub graph_replays: usize,
    pub graph_captures: usize,
    pub eager_passes: usize,
    /// Passes queued ahead of the engine's step, those of them a step then used, and those it
    /// used for some of their rows only (a sequence had sampled end-of-sequence).
    pub ahead_passes: usize,
    pub ahead_adopted: usize,
    pub ahead_partial: usize,
}

/// What a pass returns: each row's sampled token, and the logits of the sampling rows.
type PassOutput = (Vec<Option<u32>>, Vec<Vec<f32>>);

/// One token row of a forward pass.
#[derive(Debug, Clone, Copy)]
struct Row {
    token: u32,
    pos: usize,
    slot: usize,
    sample: Option<SampleRequest>,
}

/// Per-pass inputs, activations and scratch: fixed buffers, so graphs can replay them.
struct PassBuffers {
    /// Tokens, positions, slots and sampling parameters of the rows, packed ([`inputs`]).
    inputs: CudaSlice<u64>,
    sampled: CudaSlice<i32>,
    h: CudaSlice<bf16>,
    ssq: CudaSlice<f32>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    logits: CudaSlice<f32>,
    attn_ml: CudaSlice<f32>,
    attn_o: CudaSlice<f32>,
    attn_counters: CudaSlice<u32>,
}

impl PassBuffers {
    /// Samples one token per row into `sampled` from the first `rows` rows of `logits`.
    fn sample(
        &mut self,
        kernels: &LoadedKernels,
        rows: usize,
        vocab: usize,
    ) -> Result<(), OpsError> {
        sample_tokens(
            kernels,
            &mut self.sampled,
            &self.logits,
            &LogitsShape {
                rows,
                vocab,
                row_stride: vocab,
            },
            &DeviceSamplingParams {
                temperature: dev(kernels, &inputs::temperature(&self.inputs)),
                top_k: dev(kernels, &inputs::top_k(&self.inputs)),
                top_p: dev(kernels, &inputs::top_p(&self.inputs)),
                seed: dev(kernels, &inputs::seed(&self.inputs)),
                counter: dev(kernels, &inputs::counter(&self.inputs)),
            },
        )
    }
}

pub struct GpuRunner {
    kernels: LoadedKernels,
    cfg: Qwen3Config,
    w: DeviceWeights,
    k_cache: Vec<CudaSlice<bf16>>,
    v_cache: Vec<CudaSlice<bf16>>,
    kv_blocks: usize,
    rope: CudaSlice<f32>,
    max_pos: usize,
    b: PassBuffers,
    pf: prefill::PrefillBuffers,
    block_table: CudaSlice<i32>,
    host_table: Vec<i32>,
    ld_bt: usize,
    slots: usize,
    graphs_on: bool,
    /// `GpuOptions::attention_pipelined`.
    attention_pipelined: Option<bool>,
    /// Whether decode attention may merge in clusters here, unpipelined and pipelined:
    /// `GpuOptions::attention_cluster` and `attention::cluster_fits`, asked once at set-up.
    cluster_ok: [bool; 2],
    /// Captured passes by row count and attention kind (pipelined, cluster).
    graphs: HashMap<(usize, bool, bool), CudaGraph>,
    /// Row counts and attention kinds that have run eagerly once (graphs capture after that).
    seen: [[bool; 4]; MAX_TOKENS + 1],
    stats: GpuStats,
    setup_s: f64,
    /// Page-locked staging of the pass inputs and of the sampled tokens read back, two of each
    /// used in turn (a pass queued ahead has its own while the one before it is read), and the
    /// events recorded after each turn's copies (the host waits for those, not the stream).
    staging: [PinnedHostSlice<u64>; 2],
    sampled_host: [PinnedHostSlice<i32>; 2],
    uploaded: [CudaEvent; 2],
    downloaded: [CudaEvent; 2],
    turn: usize,
    /// `GpuOptions::decode_ahead`.
    decode_ahead: bool,
    /// The pass queued ahead of the engine's next step.
    ahead: Option<ahead::AheadPass>,
    /// The decode step running and why ([`persistent::choose`]).
    step: StepChoice,
    /// The weights packed for the persistent step (where it runs and memory allowed).
    packed: Option<persistent::PackedModel>,
    /// `GpuOptions::persistent_stamps`, and the rows of the last persistent pass.
    persistent_stamps: bool,
    last_rows: usize,
    /// The persistent steps of each row count (index: rows), built on its first pass.
    persistent_steps: Vec<Option<Vec<aot_kernels::ops::persistent::PersistentStep<'static>>>>,
}

/// A GPU runner of any family, as the CLI and the bench hold it.
pub trait CudaRunner: Runner {
    fn kernels(&self) -> &LoadedKernels;
    fn stats(&self) -> GpuStats;
}

impl CudaRunner for GpuRunner {
    fn kernels(&self) -> &LoadedKernels {
        &self.kernels
    }

    fn stats(&self) -> GpuStats {
        self.stats
    }
}

impl CudaRunner for hybrid::HybridGpuRunner {
    fn kernels(&self) -> &LoadedKernels {
        hybrid::HybridGpuRunner::kernels(self)
    }

    fn stats(&self) -> GpuStats {
        hybrid::HybridGpuRunner::stats(self)
    }
}

/// The GPU runner of `config`'s family: [`GpuRunner`] for dense Qwen3, [`hybrid::HybridGpuRunner`]
/// for Qwen3.5/3.6 MoE.
pub fn open_runner(
    config: &ModelConfig,
    weights: &Weights,
    options: &GpuOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Box<dyn CudaRunner>, RunnerError> {
    Ok(match config {
        ModelConfig::Qwen3(_) => Box::new(GpuRunner::new(config, weights, options, progress)?),
        ModelConfig::Qwen35Moe(_) => Box::new(hybrid::HybridGpuRunner::new(
            config, weights, options, progress,
        )?),
    })
}

pub(crate) fn dev_err(what: &str) -> impl Fn(DriverError) -> RunnerError + '_ {
    move |e| RunnerError::Device(format!("{what}: {e}"))
}

/// Makes row `slot` of the device block table (`slots` rows of `ld_bt`, mirrored in `host`) name
/// `blocks` of a cache of `kv_blocks` blocks; uploads the row only if it changed.
pub(crate) fn set_block_row(
    kernels: &LoadedKernels,
    table: &mut CudaSlice<i32>,
    host: &mut [i32],
    (slots, ld_bt, kv_blocks): (usize, usize, usize),
    slot: usize,
    blocks: &[u32],
) -> Result<(), RunnerError> {
    if slot >= slots || blocks.len() > ld_bt {
        return Err(RunnerError::Plan(format!(
            "slot {slot} with {} blocks: the runner has {slots} slots of at most {ld_bt} blocks",
            blocks.len(),
        )));
    }
    if let Some(&bad) = blocks.iter().find(|&&b| b as usize >= kv_blocks) {
        return Err(RunnerError::Plan(format!(
            "block {bad} is past the cache's {kv_blocks} blocks"
        )));
    }
    let row: Vec<i32> = (0..ld_bt)
        .map(|j| blocks.get(j).map_or(-1, |&b| b as i32))
        .collect();
    let at = slot * ld_bt;
    if host[at..at + ld_bt] != row[..] {
        let mut view = table.slice_mut(at..at + ld_bt);
        kernels
            .stream()
            .memcpy_htod(&row, &mut view)
            .map_err(dev_err("block table"))?;
        host[at..at + ld_bt].copy_from_slice(&row);
    }
    Ok(())
}

pub(crate) fn ops_err(e: OpsError) -> RunnerError {
    RunnerError::Device(e.to_string())
}

impl GpuRunner {
    /// Loads the kernels (dispatcher, `options.policy`), uploads or generates the weights,
    /// sizes the KV cache and allocates every buffer.
    pub fn new(
        config: &ModelConfig,
        weights: &Weights,
        options: &GpuOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<GpuRunner, RunnerError> {
        let started = Instant::now();
        let cfg = config.as_qwen3().ok_or_else(|| {
            RunnerError::Device(format!(
                "the GPU runner serves dense Qwen3 (`qwen3`) only so far; `{}` runs on the CPU reference runner (--device cpu)",
                config.model_type()
            ))
        })?;
        let model = config.describe();
        // The `cuda` modules only: the runner launches nothing else, and the Triton modules
        // (CUDA 13 only) have no image on a 12.x driver, where the runner still runs. A fast path
        // unavailable here (the sm_90a GEMM off Hopper or under ptx-only) is left out; its
        // launcher then runs the portable kernel.
        let sources = with_ptx_modules(
            ModuleSource::registry_of_kind(ModuleKind::Cuda)
                .into_iter()
                .map(|m| m.with_toolchains(options.toolchain))
                .collect(),
            &options.ptx_modules,
        )?;
        let kernels = dispatch::open_device(0)
            .and_then(|d| dispatch::load_available(&d, options.policy, &sources))
            .map_err(|e| RunnerError::Device(e.to_string()))?;
        let s = kernels.stream().clone();
        let w = weights::upload(&kernels, cfg, weights, progress)?;
        // The decode step, and for the persistent one its packed weights (before the KV cache
        // takes what memory is left).
        let widest_k = cfg.hidden_size.max(cfg.intermediate_size).max(cfg.q_dim());
        let (step, packed) =
            persistent::choose_and_pack(&kernels, cfg, &w, options.step, widest_k)?;
        if let Some(reason) = &step.fallback {
            log::warn!("{reason}");
        }
        let zeros_f32 =
            |n: usize, what: &str| s.alloc_zeros::<f32>(n.max(1)).map_err(dev_err(what));
        let zeros_bf16 =
            |n: usize, what: &str| s.alloc_zeros::<bf16>(n.max(1)).map_err(dev_err(what));
        let zeros_i32 =
            |n: usize, what: &str| s.alloc_zeros::<i32>(n.max(1)).map_err(dev_err(what));
        let zeros_u32 =
            |n: usize, what: &str| s.alloc_zeros::<u32>(n.max(1)).map_err(dev_err(what));

        let (h, i, v, hd) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.head_dim,
        );
        let (ml, o, ac) = attn_scratch_needs(
            MAX_TOKENS,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            hd,
        );
        let b = PassBuffers {
            inputs: s
                .alloc_zeros::<u64>(inputs::WORDS)
                .map_err(dev_err("pass inputs"))?,
            sampled: zeros_i32(MAX_TOKENS, "sampled tokens")?,
            h: zeros_bf16(MAX_TOKENS * h, "hidden")?,
            ssq: zeros_f32(residual_groups(h) * MAX_TOKENS, "sums of squares")?,
            qkv: zeros_bf16(MAX_TOKENS * cfg.qkv_dim(), "qkv")?,
            attn: zeros_bf16(MAX_TOKENS * cfg.q_dim(), "attention out")?,
            act: zeros_bf16(MAX_TOKENS * i, "mlp activations")?,
            logits: zeros_f32(MAX_TOKENS * v, "logits")?,
            attn_ml: zeros_f32(ml, "attention workspace")?,
            attn_o: zeros_f32(o, "attention workspace")?,
            attn_counters: zeros_u32(ac, "attention counters")?,
        };
        let max_pos = options.max_context.min(cfg.max_position_embeddings).max(1);
        let rope = s
            .clone_htod(&cos_sin_cache(max_pos, hd, cfg.rope_theta))
            .map_err(dev_err("RoPE table"))?;
        let ld_bt = max_pos.div_ceil(KV_BLOCK_TOKENS);
        let slots = options.slots.max(1);
        let block_table = zeros_i32(slots * ld_bt, "block tables")?;
        let pf = prefill::PrefillBuffers::new(&kernels, cfg, options.prefill_tokens)?;

        // The KV cache: what the budget holds, but no more than every slot at full context.
        let (free, _) = kernels
            .context()
            .mem_get_info()
            .map_err(dev_err("reading free memory"))?;
        let kv_blocks = memory::gpu_kv_blocks(&model, options.kv_budget, free, slots * ld_bt)
            .map_err(RunnerError::Device)?;
        let per_layer = kv_blocks * cfg.num_key_value_heads * KV_BLOCK_TOKENS * hd;
        let mut k_cache = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v_cache = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k_cache.push(zeros_bf16(per_layer, "KV cache")?);
            v_cache.push(zeros_bf16(per_layer, "KV cache")?);
        }
        let ctx = kernels.context();
        let pinned = dev_err("page-locked staging");
        let staging = [
            device::pinned_host::<u64>(ctx, inputs::WORDS).map_err(&pinned)?,
            device::pinned_host::<u64>(ctx, inputs::WORDS).map_err(&pinned)?,
        ];
        let sampled_host = [
            device::pinned_host::<i32>(ctx, MAX_TOKENS).map_err(&pinned)?,
            device::pinned_host::<i32>(ctx, MAX_TOKENS).map_err(&pinned)?,
        ];
        let event = || ctx.new_event(None).map_err(dev_err("copy events"));
        let uploaded = [event()?, event()?];
        let downloaded = [event()?, event()?];
        s.synchronize().map_err(dev_err("allocating"))?;
        let group = cfg.num_attention_heads / cfg.num_key_value_heads.max(1);
        let cluster_ok = [false, true].map(|pipelined| {
            options.attention_cluster && attention::cluster_fits(&kernels, hd, group, pipelined)
        });
        Ok(GpuRunner {
            kernels,
            cfg: cfg.clone(),
            w,
            k_cache,
            v_cache,
            kv_blocks,
            rope,
            max_pos,
            b,
            pf,
            block_table,
            host_table: vec![-1; slots * ld_bt],
            ld_bt,
            slots,
            graphs_on: options.graphs,
            attention_pipelined: options.attention_pipelined,
            cluster_ok,
            graphs: HashMap::new(),
            seen: [[false; 4]; MAX_TOKENS + 1],
            stats: GpuStats::default(),
            setup_s: started.elapsed().as_secs_f64(),
            staging,
            sampled_host,
            uploaded,
            downloaded,
            turn: 0,
            // A dropped pass ahead would have advanced recurrent state for good (see [`ahead`]).
            decode_ahead: options.decode_ahead && !model.has_recurrent_state(),
            ahead: None,
            step,
            packed,
            persistent_stamps: options.persistent_stamps,
            last_rows: 0,
            persistent_steps: (0..=MAX_TOKENS).map(|_| None).collect(),
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
        set_block_row(
            &self.kernels,
            &mut self.block_table,
            &mut self.host_table,
            (self.slots, self.ld_bt, self.kv_blocks),
            slot,
            blocks,
        )
    }

    /// Copies `rows` (at most eight) into the device's pass inputs: packed into this turn's
    /// page-locked staging buffer (once its last copy has left), one copy. Returns the turn
    /// used; the next call takes the other.
    fn upload_rows(&mut self, rows: &[Row]) -> Result<usize, RunnerError> {
        let turn = self.turn;
        self.turn ^= 1;
        let err = dev_err("pass inputs");
        self.uploaded[turn].synchronize().map_err(&err)?;
        inputs::pack(rows, self.staging[turn].as_mut_slice().map_err(&err)?);
        let s = self.kernels.stream();
        s.memcpy_htod(&self.staging[turn], &mut self.b.inputs)
            .map_err(&err)?;
        self.uploaded[turn].record(s).map_err(&err)?;
        Ok(turn)
    }

    /// Queues one decode pass over `rows` (1..=8): the inputs (with `tokens_on_device`, the
    /// tokens are those the pass before sampled, row for row, copied on the device over the
    /// uploaded ones), the forward pass (a graph replay, or launches), the sampling, and the copy
    /// of the sampled tokens into the page-locked buffer of the returned turn.
    fn enqueue_pass(&mut self, rows: &[Row], tokens_on_device: bool) -> Result<usize, RunnerError> {
        let m = rows.len();
        for r in rows {
            if r.pos >= self.max_pos {
                return Err(RunnerError::Plan(format!(
                    "position {} is past the context of {}",
                    r.pos, self.max_pos
                )));
            }
        }
        let s = self.kernels.stream().clone();
        let turn = self.upload_rows(rows)?;
        if tokens_on_device {
            let mut tokens = inputs::tokens_mut(&mut self.b.inputs, m);
            s.memcpy_dtod(&self.b.sampled.slice(0..m), &mut tokens)
                .map_err(dev_err("feeding the sampled tokens"))?;
        }

        self.stats.passes += 1;
        // Attention's kind follows the work of this pass (the same bits either way); each kind
        // has its own graph per row count.
        let splits: Vec<usize> = rows.iter().map(|r| attn_splits(r.pos + 1).0).collect();
        let pipelined = self.attention_pipelined.unwrap_or_else(|| {
            attn_pipelined(
                self.cfg.head_dim,
                self.cfg.num_key_value_heads,
                splits.iter().sum(),
                self.kernels.sm_count(),
            )
        });
        // Splits merged in thread-block clusters where that pays and the image has the code; such
        // a graph (depth CLUSTER_SPLITS) serves every pass whose sequences fit a cluster.
        let max_splits = splits.iter().copied().max().unwrap_or(1);
        let cluster = self.cluster_ok[usize::from(pipelined)]
            && attn_cluster(
                self.cfg.num_key_value_heads,
                m,
                max_splits,
                self.kernels.sm_count(),
            );
        self.run_forward(m, pipelined, cluster, max_splits)?;
        let err = dev_err("reading sampled tokens");
        s.memcpy_dtoh(&self.b.sampled.slice(0..m), &mut self.sampled_host[turn])
            .map_err(&err)?;
        self.downloaded[turn].record(&s).map_err(&err)?;
        Ok(turn)
    }

    /// The block-table row of `slot` as the device holds it.
    fn table_row(&self, slot: usize) -> &[i32] {
        &self.host_table[slot * self.ld_bt..(slot + 1) * self.ld_bt]
    }

    /// Runs one pass over `rows` (1..=8) and returns each row's sampled token (rows without a
    /// sample request get `None`) and, with `want_logits`, the logits of the sampling rows. The
    /// pass queued ahead serves it where it computed exactly these rows; otherwise it is dropped
    /// and the pass queued now. With `continues` (each row goes on after this step, the
    /// scheduler's word), the likely next pass is queued before this one's tokens are waited for.
    fn pass(
        &mut self,
        rows: &[Row],
        want_logits: bool,
        continues: Option<&[bool]>,
    ) -> Result<PassOutput, RunnerError> {
        let adopted = self.ahead.take().and_then(|a| {
            let index = ahead::adopt(&a, rows, |slot| self.table_row(slot))?;
            Some((a, index))
        });
        let (turn, launched, index) = match adopted {
            Some((a, index)) => {
                self.stats.ahead_adopted += 1;
                self.stats.ahead_partial += usize::from(index.len() < a.rows.len());
                (a.turn, a.rows.len(), index)
            }
            None => (
                self.enqueue_pass(rows, false)?,
                rows.len(),
                (0..rows.len()).collect(),
            ),
        };
        // The next pass feeds on this one's tokens row for row: only where the device's pass
        // holds exactly these rows in this order.
        let whole = index.len() == launched && index.iter().enumerate().all(|(i, &j)| i == j);
        let mut next = None;
        if let (true, true, false, Some(continues)) =
            (self.decode_ahead, whole, want_logits, continues)
        {
            let rows_next =
                ahead::next_rows(rows, continues, self.max_pos, KV_BLOCK_TOKENS, |slot, b| {
                    self.table_row(slot).get(b).copied().unwrap_or(-1)
                });
            if let Some(rows_next) = rows_next {
                let tables = rows_next
                    .iter()
                    .map(|r| self.table_row(r.slot)[..=r.pos / KV_BLOCK_TOKENS].to_vec())
                    .collect();
                let turn_next = self.enqueue_pass(&rows_next, true)?;
                self.stats.ahead_passes += 1;
                next = Some(ahead::AheadPass {
                    rows: rows_next,
                    tables,
                    turn: turn_next,
                });
            }
        }

        // The one wait of a pass: its sampled tokens (the pass queued ahead runs meanwhile).
        let err = dev_err("reading sampled tokens");
        self.downloaded[turn].synchronize().map_err(&err)?;
        let sampled = self.sampled_host[turn].as_slice().map_err(&err)?[..launched].to_vec();
        if let Some(mut a) = next {
            for (r, &t) in a.rows.iter_mut().zip(&sampled) {
                r.token = t as u32;
            }
            self.ahead = Some(a);
        }
        let tokens: Vec<Option<u32>> = rows
            .iter()
            .zip(&index)
            .map(|(r, &j)| r.sample.map(|_| sampled[j] as u32))
            .collect();
        let mut out_logits = Vec::new();
        if want_logits {
            // Nothing was queued ahead: the logits are still this pass's.
            let s = self.kernels.stream().clone();
            let v = self.cfg.vocab_size;
            for (r, &j) in rows.iter().zip(&index) {
                if r.sample.is_some() {
                    let row = self.b.logits.slice(j * v..(j + 1) * v);
                    out_logits.push(s.clone_dtoh(&row).map_err(dev_err("reading logits"))?);
                }
            }
        }
        Ok((tokens, out_logits))
    }
}

impl Drop for GpuRunner {
    /// A pass queued ahead may still be running, copying into the page-locked buffers freed
    /// with the runner: wait for the stream first.
    fn drop(&mut self) {
        if let Err(e) = self.kernels.stream().synchronize() {
            log::warn!(
                "GPU runner: waiting for the last queued pass before freeing its buffers: {e}"
            );
        }
    }
}

impl Runner for GpuRunner {
    fn device(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn kv_blocks(&self) -> usize {
        self.kv_blocks
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
                recurrent: false,
            },
        )?;
        for seq in &plan.seqs {
            self.set_blocks(seq.slot, seq.blocks)?;
        }
        let mut out = StepOutput {
            tokens: vec![None; plan.seqs.len()],
            logits: vec![Vec::new(); plan.seqs.len()],
        };
        // Generated tokens of every request, eight rows a pass.
        let decode: Vec<usize> = (0..plan.seqs.len())
            .filter(|&j| !plan.seqs[j].prefill)
            .collect();
        // A pass queued ahead serves one pass of generated tokens at most; a plan of none or of
        // more than eight drops it here (before any other work is queued).
        if decode.is_empty() || decode.len() > MAX_TOKENS {
            self.ahead = None;
        }
        // The next pass is queued ahead only for a plan of generated tokens alone (no prompt
        // chunk queued behind it) whose every sequence goes on.
        let continues: Option<Vec<bool>> = (decode.len() == plan.seqs.len()
            && decode.len() <= MAX_TOKENS)
            .then(|| plan.seqs.iter().map(|s| s.continues).collect());
        for group in decode.chunks(MAX_TOKENS) {
            let rows: Vec<Row> = group
                .iter()
                .map(|&j| {
                    let sq = &plan.seqs[j];
                    Row {
                        token: sq.tokens[0],
                        pos: sq.start_pos,
                        slot: sq.slot,
                        sample: sq.sample,
                    }
                })
                .collect();
            let (tokens, logits) = self.pass(&rows, plan.want_logits, continues.as_deref())?;
            let mut logits = logits.into_iter();
            for (&j, t) in group.iter().zip(tokens) {
                out.tokens[j] = t;
                if plan.want_logits && t.is_some() {
                    out.logits[j] = logits.next().unwrap_or_default();
                }
            }
        }
        // Prompt chunks: the prefill path, every sequence's chunk packed into shared passes.
        let prompt: Vec<usize> = (0..plan.seqs.len())
            .filter(|&j| plan.seqs[j].prefill)
            .collect();
        let chunks: Vec<prefill::PromptChunk> = prompt
            .iter()
            .map(|&j| {
                let sq = &plan.seqs[j];
                prefill::PromptChunk {
                    slot: sq.slot,
                    tokens: sq.tokens,
                    start_pos: sq.start_pos,
                    sample: sq.sample,
                }
            })
            .collect();
        for (&j, (token, logits)) in prompt.iter().zip(self.prefill(&chunks, plan.want_logits)?) {
            out.tokens[j] = token;
            out.logits[j] = logits;
        }
        Ok(out)
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "device": DeviceKind::Cuda,
            "device_name": self.kernels.report().device_name,
            "sm_count": self.kernels.sm_count(),
            "dispatch": self.kernels.report(),
            "kv_blocks": self.kv_blocks,
            "kv_block_tokens": KV_BLOCK_TOKENS,
            "weights_bytes": self.w.bytes,
            "graphs": self.graphs_on,
            "step": self.step,
            "stats": self.stats,
            "setup_s": self.setup_s,
        })
    }

    fn pass_trace(&self) -> Option<Result<crate::runner::PassTrace, RunnerError>> {
        self.persistent_trace()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_modules_cut_the_named_modules_to_ptx_and_refuse_unknown_names() {
        let sources = ModuleSource::registry_of_kind(ModuleKind::Cuda);
        let name = sources[0].name.clone();
        let cut = with_ptx_modules(sources.clone(), std::slice::from_ref(&name)).unwrap();
        assert!(cut[0].images.iter().all(|i| i.target.virtual_arch));
        assert!(!cut[0].images.is_empty());
        assert_eq!(cut[1..].len(), sources[1..].len());
        for (a, b) in cut[1..].iter().zip(&sources[1..]) {
            assert_eq!(a.images.len(), b.images.len(), "{} untouched", a.name);
        }
        let err = with_ptx_modules(sources, &["gdn_nonesuch".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("gdn_nonesuch") && err.contains(&name), "{err}");
    }
}
