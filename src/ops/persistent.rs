//! The persistent step (issue 32), first stage: one launch of one block per SM, each block walking
//! a fixed list of tasks, with the dependencies between tasks as counters in global memory and
//! each block's weight stream running ahead of them through a shared-memory ring
//! (kernels/persistent/persistent_step.cu says how).
//!
//! Three parts:
//! - [`schedule`], pure: a graph of GEMV ops (each reading what an earlier op wrote) cut into
//!   8- or 16-row tiles, dealt to blocks in order, with each op's counter and the count its readers
//!   wait for; [`Schedule::check`] proves that every wait is met by tasks that come before it.
//! - [`pack_weights`]: each weight repacked tile by tile so that every 16 KiB slot of the ring is one
//!   contiguous copy (one bulk copy on sm_90 and later);
//! - [`PersistentStep`]: the schedule and the op table in device memory, bound to the caller's
//!   buffers, launched as often as wanted ([`PersistentStep::launch`]); counters only grow, so no
//!   launch resets them.
//!
//! A tile's sum depends on its rows (8 or 16) and K only, never on the block that runs it or the
//! number of blocks: a schedule over 132, 20 or 16 blocks, or one launch per op, with the same tile
//! rows gives the same bits.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use half::bf16;

use super::launch::{check_aligned, check_view, dev, launch_params_pdl, to_i32, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "persistent";
pub const ENTRY: &str = "persistent_step";
/// The entry that packs a weight into the slots the step streams ([`pack_weights`]).
pub const ENTRY_PACK: &str = "persistent_pack_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY), (MODULE, ENTRY_PACK)];

/// Threads of a block: 256 math threads (`kThreads`) and the streaming warp.
const THREADS: u32 = 256 + 32;
/// Shared memory behind the ring and x: each warp's mma fragment (8 warps x 32 lanes x 4 floats).
const REDUCE_BYTES: usize = 8 * 32 * 4 * 4;
/// Bytes of one ring slot (`kStageBytes`): a stage of a tile is `rows x (8192 / rows)` weights.
pub const STAGE_BYTES: usize = 16384;
/// Ring slots: as many as the SM's shared memory admits, within these bounds.
pub const MAX_STAGES: usize = 12;
pub const MIN_STAGES: usize = 3;
/// Token rows of a GEMV op.
pub const MAX_TOKENS: usize = 8;

const KIND_GEMV_TILE: u32 = 1;
const LAYOUT_PACKED: i32 = 0;
const LAYOUT_ROW_MAJOR: i32 = 1;
const INPUT_PLAIN: i32 = 0;
const INPUT_NORM: i32 = 1;
const EPI_BF16: i32 = 0;
const EPI_F32: i32 = 1;
const EPI_RESIDUAL: i32 = 2;
const EPI_SILU_MUL: i32 = 3;
/// Words the kernel stamps at each run's first task ([`PersistentStep::enable_stamps`]).
pub const STAMP_WORDS: usize = 6;

/// One task as the kernel reads it (`Task` in the kernel, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    pub kind: u32,
    /// The counter to wait for (-1: none) and the count, per launch, that releases the task.
    pub wait_counter: i32,
    pub wait_count: u32,
    /// The counter this task adds one to when done (-1: none).
    pub signal_counter: i32,
    /// The op (index into the op table), its first output row and the tile's rows (8 or 16).
    pub op: u32,
    pub row0: u32,
    pub rows: u32,
    /// What the task adds to its counter when done: a block's consecutive tiles of one op (a run)
    /// share one wait and one copy of x at the first and one add of the run's length at the last;
    /// 0 on the others.
    pub signal_add: u32,
}

// SAFETY: plain 32-bit fields, laid out as the kernel's `Task`.
unsafe impl DeviceRepr for Task {}

/// An op of the graph the scheduler deals: `n x k` weights in tiles of `tile_rows` (8 or 16) rows,
/// run after all tiles of op `after` (an earlier op) are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvNode {
    pub n: usize,
    pub k: usize,
    pub tile_rows: usize,
    pub after: Option<usize>,
}

impl GemvNode {
    pub fn tiles(&self) -> usize {
        self.n.div_ceil(self.tile_rows)
    }
}

/// The scheduler's answer: block `b` runs `tasks[begin[b]..begin[b + 1]]` in order; op `j` signals
/// counter `j`, which one launch advances by `per_launch[j]` (its tile count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub blocks: usize,
    pub tasks: Vec<Task>,
    pub begin: Vec<u32>,
    pub per_launch: Vec<u32>,
}

/// Cuts `ops` into tiles and deals them to `blocks` blocks: tiles in op order, round robin, the
/// deal going on where the last op left off, so that every block gets its share of each op and
/// the ops' bytes even out over the blocks. Each op counts its tiles done on its own counter; a
/// tile of an op with `after` waits for that op's whole count.
pub fn schedule(ops: &[GemvNode], blocks: usize) -> Result<Schedule, OpsError> {
    schedule_in_runs(ops, blocks, 1)
}

/// [`schedule`] dealing `run` consecutive tiles of an op to a block at a time (an op's first and
/// last deals may be shorter: the deal goes on where the last op left off). A block's tiles of one
/// op are consecutive in its list either way, and make one run (one counter wait and one copy of
/// x); dealt singly, an op with fewer tiles than blocks gives each block one tile, a run of one,
/// where deals of `run` give fewer blocks runs of `run`. For steps of many small ops (a MoE layer's
/// experts at one token); the bytes even out less finely over the blocks.
pub fn schedule_in_runs(ops: &[GemvNode], blocks: usize, run: usize) -> Result<Schedule, OpsError> {
    let bad = |message: String| OpsError::Shape {
        op: "persistent::schedule",
        message,
    };
    if blocks == 0 {
        return Err(bad("0 blocks: a schedule needs at least one".into()));
    }
    if run == 0 {
        return Err(bad(
            "runs of 0 tiles: deal at least one tile at a time".into()
        ));
    }
    for (j, op) in ops.iter().enumerate() {
        if op.n == 0 || op.k == 0 || !op.k.is_multiple_of(8) {
            return Err(bad(format!(
                "op {j}: {} x {}: need n > 0 and k a positive multiple of 8 (16-byte copies)",
                op.n, op.k
            )));
        }
        if ![8, 16].contains(&op.tile_rows) {
            return Err(bad(format!(
                "op {j}: tiles of {} rows: the kernel takes 8 or 16",
                op.tile_rows
            )));
        }
        if op.after.is_some_and(|a| a >= j) {
            return Err(bad(format!(
                "op {j} runs after op {}: an op may only wait for an earlier one",
                op.after.unwrap_or_default()
            )));
        }
    }
    let mut lists: Vec<Vec<Task>> = vec![Vec::new(); blocks];
    let mut next = 0usize;
    for (j, op) in ops.iter().enumerate() {
        let (wait_counter, wait_count) = match op.after {
            Some(a) => (a as i32, ops[a].tiles() as u32),
            None => (-1, 0),
        };
        for tile in 0..op.tiles() {
            lists[(next / run) % blocks].push(Task {
                kind: KIND_GEMV_TILE,
                wait_counter,
                wait_count,
                signal_counter: j as i32,
                op: j as u32,
                row0: (tile * op.tile_rows) as u32,
                rows: op.tile_rows as u32,
                signal_add: 0,
            });
            next += 1;
        }
    }
    let mut begin = vec![0u32];
    let mut tasks = Vec::with_capacity(next);
    for mut list in lists {
        // The last tile of each run of one op adds the run's length.
        let mut run = 0;
        for i in 0..list.len() {
            run += 1;
            if list.get(i + 1).is_none_or(|next| next.op != list[i].op) {
                list[i].signal_add = run;
                run = 0;
            }
        }
        tasks.extend(list);
        begin.push(tasks.len() as u32);
    }
    Ok(Schedule {
        blocks,
        tasks,
        begin,
        per_launch: ops.iter().map(|op| op.tiles() as u32).collect(),
    })
}

impl Schedule {
    /// Proves the schedule cannot deadlock when all its blocks are resident: ranks every task by
    /// its op's position (the order the deal followed), and checks that each block's list never
    /// goes down in rank and that every wait names an earlier op whose tiles add exactly the
    /// count waited for. Then every wait is met by tasks that no block reaches after it.
    pub fn check(&self) -> Result<(), String> {
        if self.begin.len() != self.blocks + 1
            || self.begin.last() != Some(&(self.tasks.len() as u32))
        {
            return Err(format!(
                "{} block offsets for {} blocks and {} tasks",
                self.begin.len(),
                self.blocks,
                self.tasks.len()
            ));
        }
        let mut signals = vec![0u32; self.per_launch.len()];
        for t in &self.tasks {
            let c = usize::try_from(t.signal_counter)
                .map_err(|_| "a task signals no counter".to_string())?;
            let n = signals.len();
            *signals
                .get_mut(c)
                .ok_or(format!("task signals counter {c} of {n}"))? += t.signal_add;
        }
        if signals != self.per_launch {
            return Err(format!(
                "the tasks add {signals:?} to the counters, the schedule says {:?}",
                self.per_launch
            ));
        }
        for b in 0..self.blocks {
            let list = &self.tasks[self.begin[b] as usize..self.begin[b + 1] as usize];
            if list.windows(2).any(|w| w[1].op < w[0].op) {
                return Err(format!("block {b} runs an op before an earlier one"));
            }
            // Each run of one op signals once, at its last tile, with its length: a tile of a
            // later op never waits on a count that a tile after it in the same block would add.
            let mut run = 0;
            for (i, t) in list.iter().enumerate() {
                run += 1;
                let last = list.get(i + 1).is_none_or(|next| next.op != t.op);
                let want = if last { run } else { 0 };
                if t.signal_add != want || t.signal_counter != t.op as i32 {
                    return Err(format!(
                        "block {b}: a tile of op {} adds {} to counter {} (its run wants {want} on counter {})",
                        t.op, t.signal_add, t.signal_counter, t.op
                    ));
                }
                if last {
                    run = 0;
                }
            }
            for t in list {
                if t.wait_counter < 0 {
                    continue;
                }
                let c = t.wait_counter as usize;
                if c >= t.op as usize || self.per_launch.get(c) != Some(&t.wait_count) {
                    return Err(format!(
                        "a tile of op {} waits for {} on counter {c}, which one launch advances by {:?}",
                        t.op,
                        t.wait_count,
                        self.per_launch.get(c)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where an op's weights come from: packed for the step ([`pack_weights`]: a ring slot is one
/// contiguous copy), or the row-major `n x k` tensor itself (a slot is one copy per row; no second
/// copy of the model in memory).
#[derive(Clone, Copy)]
pub enum StepWeights<'a> {
    Packed(&'a PackedWeights),
    RowMajor(DevRef<'a, bf16>),
}

/// What an op multiplies: `x` itself, or its RMSNorm, built by each block that runs a tile of the
/// op: per token row `bf16((w + offset) * bf16(x * rsqrt(mean(x^2) + eps)))`, the sum of squares
/// over the bf16 `x`.
#[derive(Clone, Copy)]
pub enum StepInput<'a> {
    Plain,
    Norm {
        weight: DevRef<'a, bf16>,
        eps: f32,
        weight_offset: f32,
    },
}

/// Where an op's result goes (`y` the fp32 sum of a row), `m` rows every `ld_out`:
/// - `Bf16`: `bf16(y)`; `F32`: `y`;
/// - `Residual`: `out = bf16(out + bf16(y))`, the residual stream updated in place;
/// - `SiluMul`: the op's `n` rows are gate rows `0..n/2` and up rows `n/2..n` of one weight, dealt
///   in 16-row tiles of 8 gate and the 8 matching up rows; output `j < n/2` is
///   `bf16(bf16(silu(bf16(gate_j))) * bf16(up_j))`.
///
/// The launch-per-op GEMV's epilogues (`ops::gemv`), roundings included.
#[derive(Clone, Copy)]
pub enum StepOutput<'a> {
    Bf16(DevRef<'a, bf16>),
    F32(DevRef<'a, f32>),
    Residual(DevRef<'a, bf16>),
    SiluMul(DevRef<'a, bf16>),
}

impl StepOutput<'_> {
    /// Address, bytes and the columns a row holds (`n`, or `n / 2` for `SiluMul`).
    fn span(&self, n: usize) -> (u64, usize, usize) {
        match self {
            StepOutput::Bf16(o) | StepOutput::Residual(o) => (o.addr(), 2 * o.len(), n),
            StepOutput::SiluMul(o) => (o.addr(), 2 * o.len(), n / 2),
            StepOutput::F32(o) => (o.addr(), 4 * o.len(), n),
        }
    }

    fn len(&self) -> usize {
        match self {
            StepOutput::Bf16(o) | StepOutput::Residual(o) | StepOutput::SiluMul(o) => o.len(),
            StepOutput::F32(o) => o.len(),
        }
    }

    fn epilogue(&self) -> i32 {
        match self {
            StepOutput::Bf16(_) => EPI_BF16,
            StepOutput::F32(_) => EPI_F32,
            StepOutput::Residual(_) => EPI_RESIDUAL,
            StepOutput::SiluMul(_) => EPI_SILU_MUL,
        }
    }
}

/// One GEMV op's buffers: `x` holds `m` rows of `k` every `ld_x`, `out` `m` rows every `ld_out`.
///
/// Activations are shared views: in a step one op's `out` is the `x` of the ops after it (and a
/// residual stream is written by several), and the schedule, not the borrow checker, orders the
/// accesses (the counters within a launch, the stream between launches): [`PersistentStep::new`]
/// refuses two ops that touch the same memory, one of them writing, unless one runs after the
/// other.
pub struct GemvBinding<'a> {
    pub w: StepWeights<'a>,
    pub x: DevRef<'a, bf16>,
    pub input: StepInput<'a>,
    pub out: StepOutput<'a>,
    pub m: usize,
    pub ld_x: usize,
    pub ld_out: usize,
}

/// Columns of K one slot of a `rows`-row tile holds.
pub fn slot_cols(rows: usize) -> usize {
    STAGE_BYTES / 2 / rows
}

/// Elements of `n x k` weights packed in `rows`-row tiles: whole slots, padded with zeros.
pub fn packed_len(n: usize, k: usize, rows: usize) -> usize {
    n.div_ceil(rows) * k.div_ceil(slot_cols(rows)) * (STAGE_BYTES / 2)
}

/// Weights in the layout the step streams: tile by tile, each tile's `[rows][kc]` slots in K order,
/// so that a slot is one contiguous 16 KiB copy ([`pack_weights`]; [`pack_reference`] on the CPU).
/// `paired`: the tiles of a [`StepOutput::SiluMul`] op (8 gate rows, then the matching 8 up rows).
pub struct PackedWeights {
    pub data: CudaSlice<bf16>,
    pub n: usize,
    pub k: usize,
    pub rows: usize,
    pub paired: bool,
}

/// The weight row that row `r` of the tile at `row0` holds, `None` past the weights: `row0 + r`,
/// or with `pair` (the up rows' offset of a [`StepOutput::SiluMul`] op) gate row `j` for the first
/// half of the tile and up row `pair + j` for the second, `j = row0 / 2 + r % (rows / 2)`.
pub fn source_row(n: usize, pair: usize, rows: usize, row0: usize, r: usize) -> Option<usize> {
    if pair == 0 {
        return (row0 + r < n).then_some(row0 + r);
    }
    let half = rows / 2;
    let j = row0 / 2 + r % half;
    (j < pair).then_some(if r < half { j } else { pair + j })
}

/// Rows and columns of the boxes a slot is made of (`kBoxRows`, `kBoxCols`): the shape of one
/// 2D tensor copy.
pub const BOX_ROWS: usize = 8;
pub const BOX_COLS: usize = 256;

/// Where element `e` of a slot of a `rows`-row tile sits in the tile: (row, column) within the
/// slot. A slot is boxes of `BOX_ROWS x BOX_COLS`, box (cb, rg) (columns `cb * BOX_COLS ..`, rows
/// `rg * BOX_ROWS ..`) at index `cb * rows / BOX_ROWS + rg`, each row-major.
pub fn slot_element(e: usize, rows: usize) -> (usize, usize) {
    let (box_, within) = (e / (BOX_ROWS * BOX_COLS), e % (BOX_ROWS * BOX_COLS));
    let groups = rows / BOX_ROWS;
    let (cb, rg) = (box_ / groups, box_ % groups);
    (
        rg * BOX_ROWS + within / BOX_COLS,
        cb * BOX_COLS + within % BOX_COLS,
    )
}

/// Reference of the packing: `w` is `n x k` row-major; `paired` as [`PackedWeights::paired`].
pub fn pack_reference(w: &[bf16], n: usize, k: usize, rows: usize, paired: bool) -> Vec<bf16> {
    let kc = slot_cols(rows);
    let per_tile = k.div_ceil(kc);
    let pair = if paired { n / 2 } else { 0 };
    let mut out = vec![bf16::ZERO; packed_len(n, k, rows)];
    for (i, v) in out.iter_mut().enumerate() {
        let (slot, within) = (i / (STAGE_BYTES / 2), i % (STAGE_BYTES / 2));
        let (tile, stage) = (slot / per_tile, slot % per_tile);
        let (r, c) = slot_element(within, rows);
        let col = stage * kc + c;
        if let Some(row) = source_row(n, pair, rows, tile * rows, r) {
            if col < k {
                *v = w[row * k + col];
            }
        }
    }
    out
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PackParams {
    src: u64,
    dst: u64,
    n: i32,
    k: i32,
    rows: i32,
    pair: i32,
}

// SAFETY: plain fields, laid out as the kernel's `PackParams`.
unsafe impl DeviceRepr for PackParams {}

/// Packs `w` (`n x k` row-major bf16, `k` a multiple of 8) for `rows`-row tiles (8 or 16;
/// `paired`: 16, `n` even) into a new buffer on the kernels' stream.
pub fn pack_weights(
    kernels: &LoadedKernels,
    w: DevRef<'_, bf16>,
    n: usize,
    k: usize,
    rows: usize,
    paired: bool,
) -> Result<PackedWeights, OpsError> {
    let op = "persistent_pack";
    if n == 0 || k == 0 || !k.is_multiple_of(8) || ![8, 16].contains(&rows) {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "{n} x {k} in {rows}-row tiles: need n > 0, k a positive multiple of 8, rows 8 or 16"
            ),
        });
    }
    if paired && (rows != 16 || !n.is_multiple_of(2)) {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "gate and up rows paired in {rows}-row tiles of {n} rows: pairs need 16-row tiles and an even n"
            ),
        });
    }
    check_view(op, "w", w.len(), &[n, k])?;
    check_aligned(op, "w", w.addr(), 16)?;
    let len = packed_len(n, k, rows);
    let data = kernels
        .stream()
        .alloc_zeros::<bf16>(len)
        .map_err(|source| OpsError::Driver { op, source })?;
    let p = PackParams {
        src: w.addr(),
        dst: addr(kernels, &data),
        n: to_i32(op, "n", n)?,
        k: to_i32(op, "k", k)?,
        rows: rows as i32,
        pair: if paired { (n / 2) as i32 } else { 0 },
    };
    let pieces = len / 8;
    let cfg = LaunchConfig {
        grid_dim: (pieces.div_ceil(256).min(65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_params_pdl(kernels, op, MODULE, ENTRY_PACK, cfg, &p, false, None)?;
    Ok(PackedWeights {
        data,
        n,
        k,
        rows,
        paired,
    })
}

/// An op as the kernel reads it (`GemvOp`, 88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GemvOpRaw {
    w: u64,
    x: u64,
    out: u64,
    norm_w: u64,
    tmap: u64,
    n: i32,
    k: i32,
    m: i32,
    ld_x: i32,
    ld_out: i32,
    layout: i32,
    input: i32,
    epilogue: i32,
    pair: i32,
    eps: f32,
    w_offset: f32,
    pad_: i32,
}

// SAFETY: plain fields, laid out as the kernel's `GemvOp`.
unsafe impl DeviceRepr for GemvOpRaw {}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepParams {
    tasks: u64,
    begin: u64,
    ops: u64,
    counters: u64,
    per_launch: u64,
    launches: u64,
    stamps: u64,
    stages: i32,
    x_vectors: i32,
}

// SAFETY: plain fields, laid out as the kernel's `StepParams`.
unsafe impl DeviceRepr for StepParams {}

/// A schedule bound to its buffers, in device memory; `'a` keeps the buffers borrowed for as long
/// as the step can launch ([`PersistentStep::new_unbound`] leaves that to its caller).
pub struct PersistentStep<'a> {
    blocks: usize,
    stages: usize,
    x_bytes: usize,
    tasks: CudaSlice<Task>,
    /// The host's copy of the schedule (the stamps' key).
    schedule: Schedule,
    begin: CudaSlice<u32>,
    ops: CudaSlice<GemvOpRaw>,
    counters: CudaSlice<u32>,
    per_launch: CudaSlice<u32>,
    launches: CudaSlice<u64>,
    /// The row-major ops' tensor maps (16 words each), which the op table points into.
    _tmaps: Option<CudaSlice<u64>>,
    stamps: Option<CudaSlice<u64>>,
    programmatic: bool,
    /// Whether this image may launch programmatically at all.
    programmatic_ok: bool,
    _buffers: PhantomData<&'a mut ()>,
}

/// Shared memory a block needs beside its ring for tasks whose largest x holds `x_elements` bf16
/// values (`m * k`): that x, then the warps' fragments.
fn task_bytes(x_elements: usize) -> usize {
    2 * x_elements + REDUCE_BYTES
}

/// Whether the loaded step streams its weights with the Tensor Memory Accelerator (its image was
/// built for sm_90 or later: one bulk copy a packed slot, four 2D box copies a row-major one)
/// rather than with the math threads' `cp.async` (the compute_80 PTX that `ptx-only` loads, or an
/// image for an older GPU: a copy per 16-byte piece, which row-major weights make slow).
pub fn tensor_copies(kernels: &LoadedKernels) -> bool {
    kernels.loaded_target(MODULE).is_some_and(|t| t.sm >= 90)
}

/// Ring slots a step whose largest x is `m` rows of `k` would stream through on this GPU, or why
/// it does not fit (the check [`PersistentStep::new`] makes, for a caller choosing its step first).
pub fn stages_for(kernels: &LoadedKernels, m: usize, k: usize) -> Result<usize, OpsError> {
    ring_stages(kernels, task_bytes(m * k))
}

/// Ring slots that fit one block an SM beside the kernel's static shared memory and `x_bytes` of
/// task input and reduction space on this GPU (the most, up to [`MAX_STAGES`]), or why none do.
pub fn ring_stages(kernels: &LoadedKernels, x_bytes: usize) -> Result<usize, OpsError> {
    (MIN_STAGES..=MAX_STAGES)
        .rev()
        .find(|&s| kernels.blocks_fit_smem(MODULE, ENTRY, s * STAGE_BYTES + x_bytes, 1))
        .ok_or_else(|| OpsError::Shape {
            op: "persistent_step",
            message: format!(
                "a ring of {MIN_STAGES} slots of {STAGE_BYTES} bytes and {x_bytes} bytes of task \
                 input do not fit a block's shared memory on this GPU (or module `{MODULE}` is not \
                 loaded): run the launch-per-op step"
            ),
        })
}

/// Whether op `later` runs after every tile of op `earlier` is done: `earlier` is on the chain of
/// `after`s that leads to `later`.
fn runs_after(ops: &[GemvNode], earlier: usize, later: usize) -> bool {
    let mut at = ops[later].after;
    while let Some(a) = at {
        if a == earlier {
            return true;
        }
        at = ops[a].after;
    }
    false
}

/// What one binding reads and writes: `(start, end)` byte ranges.
fn ranges(b: &GemvBinding<'_>) -> (Vec<(u64, u64)>, (u64, u64)) {
    let mut reads = vec![(b.x.addr(), b.x.addr() + 2 * b.x.len() as u64)];
    let (out, bytes, _) = b.out.span(0);
    if matches!(b.out, StepOutput::Residual(_)) {
        reads.push((out, out + bytes as u64));
    }
    (reads, (out, out + bytes as u64))
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl<'a> PersistentStep<'a> {
    /// Checks every binding against its op and the schedule against itself, and copies both to the
    /// device. `bindings[j]` are the buffers of `ops[j]`; a reader's `x` is typically the `out` of
    /// the op it runs after (the kernel reads it at L2, after the wait).
    pub fn new(
        kernels: &LoadedKernels,
        ops: &[GemvNode],
        schedule: &Schedule,
        bindings: Vec<GemvBinding<'a>>,
    ) -> Result<Self, OpsError> {
        build(kernels, ops, schedule, &bindings)
    }

    /// [`PersistentStep::new`] without the borrow: for an engine that keeps the step beside the
    /// buffers it binds (a decode step built once per row count, as a CUDA graph is).
    ///
    /// # Safety
    /// Every buffer in `bindings` must stay allocated, at the same address, for as long as the
    /// step can launch, and nothing may access them while a launch runs except as the stream
    /// orders it.
    pub unsafe fn new_unbound(
        kernels: &LoadedKernels,
        ops: &[GemvNode],
        schedule: &Schedule,
        bindings: Vec<GemvBinding<'_>>,
    ) -> Result<PersistentStep<'static>, OpsError> {
        build(kernels, ops, schedule, &bindings)
    }

    /// Ring slots each block streams through.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// Blocks the step launches (one an SM).
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Launches programmatically (the default where the image is sm_90+ code: the blocks start
    /// streaming weights while the previous kernel ends) or not (`false`: to measure what it gives).
    pub fn set_programmatic(&mut self, on: bool) {
        self.programmatic = on && self.programmatic_ok;
    }

    /// The schedule the step runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Makes every later launch stamp its runs (a diagnostic: [`PersistentStep::read_stamps`]).
    pub fn enable_stamps(&mut self, kernels: &LoadedKernels) -> Result<(), OpsError> {
        let words = self.schedule.tasks.len().max(1) * STAMP_WORDS;
        self.stamps = Some(
            kernels
                .stream()
                .alloc_zeros::<u64>(words)
                .map_err(|source| OpsError::Driver {
                    op: "persistent_step",
                    source,
                })?,
        );
        Ok(())
    }

    /// The stamps of the last stamped launch (synchronizes the stream): one per run of one op in
    /// a block, in block order.
    pub fn read_stamps(&self, kernels: &LoadedKernels) -> Result<Vec<RunStamp>, OpsError> {
        let op = "persistent_step";
        let Some(stamps) = &self.stamps else {
            return Err(OpsError::Shape {
                op,
                message: "no stamps: call enable_stamps before the launch".into(),
            });
        };
        let words = kernels
            .stream()
            .clone_dtoh(stamps)
            .map_err(|source| OpsError::Driver { op, source })?;
        Ok(runs_of(&self.schedule, &words))
    }

    /// One launch of the whole schedule on the kernels' stream. Where the image allows (sm_90 and
    /// later), a programmatic launch: the blocks start streaming weights while the previous
    /// kernel ends. A CUDA graph may capture it (the epoch is counted on the device).
    pub fn launch(&mut self, kernels: &LoadedKernels) -> Result<(), OpsError> {
        let op = "persistent_step";
        let smem = self.stages * STAGE_BYTES + self.x_bytes;
        let p = StepParams {
            tasks: addr(kernels, &self.tasks),
            begin: addr(kernels, &self.begin),
            ops: addr(kernels, &self.ops),
            counters: addr(kernels, &self.counters),
            per_launch: addr(kernels, &self.per_launch),
            launches: addr(kernels, &self.launches),
            stamps: self.stamps.as_ref().map_or(0, |s| addr(kernels, s)),
            stages: self.stages as i32,
            x_vectors: ((self.x_bytes - REDUCE_BYTES) / 16) as i32,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        launch_params_pdl(kernels, op, MODULE, ENTRY, cfg, &p, self.programmatic, None)
    }
}

fn build<'b>(
    kernels: &LoadedKernels,
    ops: &[GemvNode],
    schedule: &Schedule,
    bindings: &[GemvBinding<'_>],
) -> Result<PersistentStep<'b>, OpsError> {
    let op = "persistent_step";
    let bad = |message: String| OpsError::Shape { op, message };
    schedule
        .check()
        .map_err(|e| bad(format!("the schedule: {e}")))?;
    if bindings.len() != ops.len() || schedule.per_launch.len() != ops.len() {
        return Err(bad(format!(
            "{} ops, {} bindings, a schedule of {} ops",
            ops.len(),
            bindings.len(),
            schedule.per_launch.len()
        )));
    }
    if schedule.blocks > kernels.sm_count() {
        return Err(bad(format!(
            "{} blocks on {} SMs: every block must be resident at once (one an SM)",
            schedule.blocks,
            kernels.sm_count()
        )));
    }
    let mut raw = Vec::with_capacity(ops.len());
    // Each row-major op's tensor map (boxes of BOX_ROWS x BOX_COLS), uploaded below; the op table
    // gets their addresses then.
    let mut tmaps: Vec<(usize, [u64; 16])> = Vec::new();
    for (j, (node, b)) in ops.iter().zip(bindings).enumerate() {
        let what = |s: &str| format!("op {j} {s}");
        let (_, _, out_cols) = b.out.span(node.n);
        if b.m == 0 || b.m > MAX_TOKENS || b.ld_x < node.k || b.ld_out < out_cols {
            return Err(bad(format!(
                "op {j}: m {} (1..={MAX_TOKENS}), ld_x {} (>= k {}), ld_out {} (>= {out_cols})",
                b.m, b.ld_x, node.k, b.ld_out
            )));
        }
        let paired = matches!(b.out, StepOutput::SiluMul(_));
        if paired && (node.tile_rows != 16 || !node.n.is_multiple_of(2)) {
            return Err(bad(format!(
                "op {j}: a SiluMul op pairs gate and up rows in 16-row tiles of an even n; it has \
                 {} rows in {}-row tiles",
                node.n, node.tile_rows
            )));
        }
        let (w, layout) = match b.w {
            StepWeights::Packed(p) => {
                if (p.n, p.k, p.rows, p.paired) != (node.n, node.k, node.tile_rows, paired) {
                    return Err(bad(format!(
                        "op {j}: weights packed as {} x {} in {}-row tiles (paired {}) for an op \
                         of {} x {} in {}-row tiles (paired {paired})",
                        p.n, p.k, p.rows, p.paired, node.n, node.k, node.tile_rows
                    )));
                }
                (addr(kernels, &p.data), LAYOUT_PACKED)
            }
            StepWeights::RowMajor(w) => {
                check_view(op, &what("w"), w.len(), &[node.n, node.k])?;
                check_aligned(op, "w", w.addr(), 16)?;
                let map = crate::dispatch::driver::tensor_map_2d_bf16(
                    w.addr(),
                    node.n,
                    node.k,
                    BOX_ROWS,
                    BOX_COLS,
                )
                .map_err(|source| OpsError::Driver { op, source })?;
                tmaps.push((j, map));
                (w.addr(), LAYOUT_ROW_MAJOR)
            }
        };
        let (input, norm_w, eps, w_offset) = match b.input {
            StepInput::Plain => (INPUT_PLAIN, 0, 0.0, 0.0),
            StepInput::Norm {
                weight,
                eps,
                weight_offset,
            } => {
                check_view(op, &what("norm weight"), weight.len(), &[node.k])?;
                check_aligned(op, "norm weight", weight.addr(), 16)?;
                (INPUT_NORM, weight.addr(), eps, weight_offset)
            }
        };
        check_view(op, &what("x"), b.x.len(), &[(b.m - 1) * b.ld_x + node.k])?;
        check_view(
            op,
            &what("out"),
            b.out.len(),
            &[(b.m - 1) * b.ld_out + out_cols],
        )?;
        check_aligned(op, "x", b.x.addr(), 16)?;
        if !b.ld_x.is_multiple_of(8) {
            return Err(bad(format!(
                "op {j}: ld_x {} must be a multiple of 8",
                b.ld_x
            )));
        }
        raw.push(GemvOpRaw {
            w,
            x: b.x.addr(),
            out: b.out.span(node.n).0,
            norm_w,
            tmap: 0,
            n: to_i32(op, "n", node.n)?,
            k: to_i32(op, "k", node.k)?,
            m: b.m as i32,
            ld_x: to_i32(op, "ld_x", b.ld_x)?,
            ld_out: to_i32(op, "ld_out", b.ld_out)?,
            layout,
            input,
            epilogue: b.out.epilogue(),
            pair: if paired {
                to_i32(op, "n", node.n / 2)?
            } else {
                0
            },
            eps,
            w_offset,
            pad_: 0,
        });
    }
    // Two ops touching the same memory, one writing, must be ordered by the chain of waits.
    for (j, bj) in bindings.iter().enumerate() {
        let (reads_j, write_j) = ranges(bj);
        for (i, bi) in bindings[..j].iter().enumerate() {
            let (reads_i, write_i) = ranges(bi);
            let hazard = overlap(write_i, write_j)
                || reads_i.iter().any(|r| overlap(*r, write_j))
                || reads_j.iter().any(|r| overlap(*r, write_i));
            if hazard && !runs_after(ops, i, j) {
                return Err(bad(format!(
                    "ops {i} and {j} touch the same memory, one writing, and op {j} does not run \
                     after op {i}: give each its own buffer, or make op {j} wait for op {i}"
                )));
            }
        }
    }
    let x_bytes = task_bytes(
        ops.iter()
            .zip(bindings)
            .map(|(node, b)| b.m * node.k)
            .max()
            .unwrap_or(0),
    );
    let stages = ring_stages(kernels, x_bytes)?;
    let stream = kernels.stream();
    let driver = |source| OpsError::Driver { op, source };
    let tmap_buf = if tmaps.is_empty() {
        None
    } else {
        let words: Vec<u64> = tmaps.iter().flat_map(|(_, m)| *m).collect();
        let buf = stream.clone_htod(&words).map_err(driver)?;
        let base = addr(kernels, &buf);
        for (i, (j, _)) in tmaps.iter().enumerate() {
            raw[*j].tmap = base + (i * 128) as u64;
        }
        Some(buf)
    };
    Ok(PersistentStep {
        blocks: schedule.blocks,
        stages,
        x_bytes,
        tasks: stream.clone_htod(&schedule.tasks).map_err(driver)?,
        schedule: schedule.clone(),
        begin: stream.clone_htod(&schedule.begin).map_err(driver)?,
        ops: stream.clone_htod(&raw).map_err(driver)?,
        counters: stream.alloc_zeros::<u32>(ops.len()).map_err(driver)?,
        per_launch: stream.clone_htod(&schedule.per_launch).map_err(driver)?,
        launches: stream.alloc_zeros::<u64>(1).map_err(driver)?,
        _tmaps: tmap_buf,
        stamps: None,
        programmatic: kernels.programmatic_launch(MODULE),
        programmatic_ok: kernels.programmatic_launch(MODULE),
        _buffers: PhantomData,
    })
}

/// One run of one op in a block, as the stamps tell it (nanoseconds of %globaltimer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStamp {
    pub block: usize,
    pub op: usize,
    /// Tiles in the run.
    pub tiles: usize,
    /// Before the counter wait, after it, once x was in shared memory, at the run's end.
    pub start: u64,
    pub waited: u64,
    pub ready: u64,
    pub end: u64,
    /// Time the run's math waited for weight slots (within ready..end).
    pub weight_wait: u64,
}

/// The runs of `schedule` with their stamps (`STAMP_WORDS` words a task, written at each run's
/// first task), in block order.
pub fn runs_of(schedule: &Schedule, words: &[u64]) -> Vec<RunStamp> {
    let mut runs = Vec::new();
    for b in 0..schedule.blocks {
        let (lo, hi) = (schedule.begin[b] as usize, schedule.begin[b + 1] as usize);
        let mut i = lo;
        while i < hi {
            let op = schedule.tasks[i].op;
            let mut j = i;
            while j < hi && schedule.tasks[j].op == op {
                j += 1;
            }
            let w = |k: usize| words.get(i * STAMP_WORDS + k).copied().unwrap_or(0);
            runs.push(RunStamp {
                block: b,
                op: op as usize,
                tiles: j - i,
                start: w(0),
                waited: w(1),
                ready: w(2),
                end: w(3),
                weight_wait: w(4),
            });
            i = j;
        }
    }
    runs
}

fn addr<T>(kernels: &LoadedKernels, s: &CudaSlice<T>) -> u64 {
    dev(kernels, s).addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain() -> Vec<GemvNode> {
        vec![
            GemvNode {
                n: 96,
                k: 64,
                tile_rows: 16,
                after: None,
            },
            GemvNode {
                n: 40,
                k: 96,
                tile_rows: 8,
                after: Some(0),
            },
            GemvNode {
                n: 200,
                k: 40,
                tile_rows: 16,
                after: Some(1),
            },
        ]
    }

    #[test]
    fn every_tile_is_dealt_once_in_op_order_and_the_schedule_checks() {
        for blocks in [1, 2, 5, 16, 20, 132] {
            let s = schedule(&chain(), blocks).unwrap();
            s.check().unwrap();
            assert_eq!(s.per_launch, vec![6, 5, 13]);
            assert_eq!(s.tasks.len(), 24);
            let mut seen: Vec<(u32, u32)> = s.tasks.iter().map(|t| (t.op, t.row0)).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 24, "a tile dealt twice at {blocks} blocks");
            // Round robin: block loads differ by at most one tile.
            let sizes: Vec<u32> = s.begin.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn a_wait_counts_all_tiles_of_the_op_it_follows() {
        let s = schedule(&chain(), 4).unwrap();
        for t in &s.tasks {
            match t.op {
                0 => assert_eq!(t.wait_counter, -1),
                1 => assert_eq!((t.wait_counter, t.wait_count), (0, 6)),
                _ => assert_eq!((t.wait_counter, t.wait_count), (1, 5)),
            }
            assert_eq!(t.signal_counter, t.op as i32);
        }
    }

    #[test]
    fn a_run_of_one_op_in_a_block_signals_once_with_its_length() {
        // 6, 5 and 13 tiles dealt round robin over 2 blocks: block 0 gets tiles 0, 2, 4 of op 0,
        // then (the deal going on at tile 6) 0, 2, 4 of op 1, then (at 11) 1, 3, .., 11 of op 2.
        let s = schedule(&chain(), 2).unwrap();
        let block0 = &s.tasks[..s.begin[1] as usize];
        let adds: Vec<(u32, u32)> = block0.iter().map(|t| (t.op, t.signal_add)).collect();
        let mut want = vec![(0, 0), (0, 0), (0, 3), (1, 0), (1, 0), (1, 3)];
        want.extend([(2, 0); 5]);
        want.push((2, 6));
        assert_eq!(adds, want);
        for block in s.begin.windows(2) {
            let list = &s.tasks[block[0] as usize..block[1] as usize];
            let total: u32 = list.iter().map(|t| t.signal_add).sum();
            assert_eq!(total as usize, list.len(), "every tile counted once");
            for w in list.windows(2) {
                if w[0].op == w[1].op {
                    assert_eq!(w[0].signal_add, 0, "only a run's last tile signals");
                }
            }
        }
    }

    #[test]
    fn the_deal_goes_on_where_the_last_op_left_off() {
        // 6 tiles of op 0 over 4 blocks end at block 1; op 1 starts at block 2.
        let s = schedule(&chain(), 4).unwrap();
        let block_of = |op: u32, row0: u32| {
            let i = s
                .tasks
                .iter()
                .position(|t| t.op == op && t.row0 == row0)
                .unwrap() as u32;
            s.begin
                .windows(2)
                .position(|w| w[0] <= i && i < w[1])
                .unwrap()
        };
        assert_eq!(block_of(0, 0), 0);
        assert_eq!(block_of(0, 80), 1);
        assert_eq!(block_of(1, 0), 2);
    }

    #[test]
    fn the_packing_puts_each_slot_together_in_boxes_and_pads_with_zeros() {
        let (n, k, rows) = (20, 1040, 16);
        let w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(1.0 + i as f32)).collect();
        let packed = pack_reference(&w, n, k, rows, false);
        // 2 tiles x 3 slots (1040 columns in slots of 512) of 16 x 512, each slot 2 x 2 boxes of
        // 8 x 256: box (cb, rg) at cb * 2 + rg.
        assert_eq!(packed.len(), 2 * 3 * 16 * 512);
        let at = |tile: usize, stage: usize, r: usize, c: usize| {
            let (cb, rg) = (c / 256, r / 8);
            packed[(tile * 3 + stage) * 8192 + (cb * 2 + rg) * 2048 + (r % 8) * 256 + c % 256]
        };
        assert_eq!(at(0, 0, 0, 0), w[0]);
        assert_eq!(at(0, 1, 3, 7), w[3 * k + 512 + 7]);
        assert_eq!(at(0, 1, 11, 300), w[11 * k + 512 + 300]);
        assert_eq!(at(1, 2, 3, 15), w[19 * k + 1024 + 15]);
        assert_eq!(at(1, 2, 3, 16), bf16::ZERO, "past k");
        assert_eq!(at(1, 0, 4, 0), bf16::ZERO, "past n");
        assert_eq!(packed.iter().filter(|v| **v != bf16::ZERO).count(), n * k);
        // Every element of a slot has one place.
        for r in [8, 16] {
            let mut seen: Vec<(usize, usize)> = (0..8192).map(|e| slot_element(e, r)).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 8192);
            assert!(seen.iter().all(|&(row, col)| row < r && col < slot_cols(r)));
        }
    }

    #[test]
    fn a_paired_tile_holds_eight_gate_rows_then_their_up_rows() {
        // n = 2 * 12 rows: gate rows 0..12, up rows 12..24; tiles of 8 gate + 8 up rows.
        let (n, k) = (24, 64);
        let w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(1.0 + i as f32)).collect();
        let packed = pack_reference(&w, n, k, 16, true);
        let at = |tile: usize, r: usize, c: usize| {
            packed[tile * 8192 + (r / 8) * 2048 + (r % 8) * 256 + c]
        };
        assert_eq!(at(0, 0, 5), w[5]);
        assert_eq!(at(0, 8, 5), w[12 * k + 5], "row 8 of tile 0: up row 0");
        assert_eq!(at(1, 3, 0), w[11 * k], "tile 1 row 3: gate row 11");
        assert_eq!(at(1, 4, 0), bf16::ZERO, "gate row 12 is past the gate rows");
        assert_eq!(at(1, 11, 1), w[23 * k + 1], "tile 1 row 11: up row 11");
        assert_eq!(source_row(n, 12, 16, 16, 12), None);
    }

    #[test]
    fn bad_graphs_are_named() {
        let mut ops = chain();
        ops[1].after = Some(2);
        let e = schedule(&ops, 4).unwrap_err().to_string();
        assert!(e.contains("op 1 runs after op 2"), "{e}");
        let mut ops = chain();
        ops[0].tile_rows = 32;
        assert!(schedule(&ops, 4)
            .unwrap_err()
            .to_string()
            .contains("8 or 16"));
        let mut ops = chain();
        ops[2].k = 41;
        assert!(schedule(&ops, 4)
            .unwrap_err()
            .to_string()
            .contains("multiple of 8"));
        assert!(schedule(&chain(), 0).is_err());
    }

    #[test]
    fn a_deal_in_runs_gives_runs_of_that_length_and_passes_the_check() {
        let total: usize = chain().iter().map(GemvNode::tiles).sum();
        for run in [1, 2, 3, 4] {
            // As many blocks as tiles: no block is dealt twice in one op, so each of its runs is
            // one deal: at most `run` tiles, and exactly `run` inside an op of 2 * run tiles.
            let s = schedule_in_runs(&chain(), total, run).unwrap();
            s.check().unwrap();
            let mut runs = Vec::new();
            for b in 0..total {
                let list = &s.tasks[s.begin[b] as usize..s.begin[b + 1] as usize];
                runs.extend(
                    list.iter()
                        .filter(|t| t.signal_add > 0)
                        .map(|t| t.signal_add),
                );
            }
            assert_eq!(runs.iter().sum::<u32>() as usize, total);
            assert!(
                runs.iter().all(|&r| r as usize <= run),
                "runs of {run}: {runs:?}"
            );
            assert!(runs.contains(&(run as u32)), "runs of {run}: {runs:?}");
            // Fewer blocks than deals: the check still proves it.
            for blocks in [1, 2, 3, 7] {
                schedule_in_runs(&chain(), blocks, run)
                    .unwrap()
                    .check()
                    .unwrap();
            }
        }
        assert_eq!(
            schedule_in_runs(&chain(), 5, 1).unwrap(),
            schedule(&chain(), 5).unwrap()
        );
        assert!(schedule_in_runs(&chain(), 4, 0).is_err());
    }

    #[test]
    fn the_check_catches_a_broken_schedule() {
        let mut s = schedule(&chain(), 3).unwrap();
        s.tasks[0].wait_count = 1;
        s.tasks[0].wait_counter = 2;
        assert!(s.check().is_err());
        let mut s = schedule(&chain(), 3).unwrap();
        let last = s.tasks.len() - 1;
        s.tasks.swap(0, last.min(s.begin[1] as usize - 1));
        assert!(s.check().is_err(), "a block list out of op order");
        let mut s = schedule(&chain(), 3).unwrap();
        s.per_launch[2] += 1;
        assert!(s.check().is_err());
        // A run's add moved to its first tile: the totals hold, the check still refuses it.
        let mut s = schedule(&chain(), 1).unwrap();
        let (first, last) = (0, 5);
        s.tasks[first].signal_add = s.tasks[last].signal_add;
        s.tasks[last].signal_add = 0;
        assert!(s.check().unwrap_err().contains("its run wants"));
    }
}
