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

use super::launch::{check_aligned, check_view, launch_params_pdl, to_i32, DevRef, OpsError};
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
    let bad = |message: String| OpsError::Shape {
        op: "persistent::schedule",
        message,
    };
    if blocks == 0 {
        return Err(bad("0 blocks: a schedule needs at least one".into()));
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
            lists[next % blocks].push(Task {
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

/// One GEMV op's buffers: `w` its packed weights, `x` holds `m` rows of `k` every `ld_x`, `out` `m`
/// rows of `n` every `ld_out` (bf16).
///
/// `out` is written through a shared view: in a step one op's `out` is the `x` of the ops after it,
/// and the schedule, not the borrow checker, orders the write before the reads (the counters within
/// a launch, the stream between launches). No two ops may write the same memory.
pub struct GemvBinding<'a> {
    pub w: &'a PackedWeights,
    pub x: DevRef<'a, bf16>,
    pub out: DevRef<'a, bf16>,
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
pub struct PackedWeights {
    pub data: CudaSlice<bf16>,
    pub n: usize,
    pub k: usize,
    pub rows: usize,
}

/// Reference of the packing: `w` is `n x k` row-major.
pub fn pack_reference(w: &[bf16], n: usize, k: usize, rows: usize) -> Vec<bf16> {
    let kc = slot_cols(rows);
    let per_tile = k.div_ceil(kc);
    let mut out = vec![bf16::ZERO; packed_len(n, k, rows)];
    for (i, v) in out.iter_mut().enumerate() {
        let (slot, within) = (i / (STAGE_BYTES / 2), i % (STAGE_BYTES / 2));
        let (tile, stage) = (slot / per_tile, slot % per_tile);
        let (row, col) = (tile * rows + within / kc, stage * kc + within % kc);
        if row < n && col < k {
            *v = w[row * k + col];
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
    pad_: i32,
}

// SAFETY: plain fields, laid out as the kernel's `PackParams`.
unsafe impl DeviceRepr for PackParams {}

/// Packs `w` (`n x k` row-major bf16, `k` a multiple of 8) for `rows`-row tiles (8 or 16) into a
/// new buffer on the kernels' stream.
pub fn pack_weights(
    kernels: &LoadedKernels,
    w: DevRef<'_, bf16>,
    n: usize,
    k: usize,
    rows: usize,
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
        pad_: 0,
    };
    let pieces = len / 8;
    let cfg = LaunchConfig {
        grid_dim: (pieces.div_ceil(256).min(65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_params_pdl(kernels, op, MODULE, ENTRY_PACK, cfg, &p, false, None)?;
    Ok(PackedWeights { data, n, k, rows })
}

/// An op as the kernel reads it (`GemvOp`, 48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GemvOpRaw {
    w: u64,
    x: u64,
    out: u64,
    n: i32,
    k: i32,
    m: i32,
    ld_x: i32,
    ld_out: i32,
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
    epoch: u32,
    stages: i32,
    x_vectors: i32,
    pad_: i32,
}

// SAFETY: plain fields, laid out as the kernel's `StepParams`.
unsafe impl DeviceRepr for StepParams {}

/// A schedule bound to its buffers, in device memory; `'a` keeps the buffers borrowed for as long
/// as the step can launch.
pub struct PersistentStep<'a> {
    blocks: usize,
    stages: usize,
    x_bytes: usize,
    tasks: CudaSlice<Task>,
    begin: CudaSlice<u32>,
    ops: CudaSlice<GemvOpRaw>,
    counters: CudaSlice<u32>,
    per_launch: CudaSlice<u32>,
    epoch: u32,
    _buffers: PhantomData<&'a mut ()>,
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
        for (j, (node, b)) in ops.iter().zip(&bindings).enumerate() {
            let what = |s: &str| format!("op {j} {s}");
            if b.m == 0 || b.m > MAX_TOKENS || b.ld_x < node.k || b.ld_out < node.n {
                return Err(bad(format!(
                    "op {j}: m {} (1..={MAX_TOKENS}), ld_x {} (>= k {}), ld_out {} (>= n {})",
                    b.m, b.ld_x, node.k, b.ld_out, node.n
                )));
            }
            if (b.w.n, b.w.k, b.w.rows) != (node.n, node.k, node.tile_rows) {
                return Err(bad(format!(
                    "op {j}: weights packed as {} x {} in {}-row tiles for an op of {} x {} in {}-row tiles",
                    b.w.n, b.w.k, b.w.rows, node.n, node.k, node.tile_rows
                )));
            }
            check_view(op, &what("x"), b.x.len(), &[(b.m - 1) * b.ld_x + node.k])?;
            check_view(
                op,
                &what("out"),
                b.out.len(),
                &[(b.m - 1) * b.ld_out + node.n],
            )?;
            check_aligned(op, "x", b.x.addr(), 16)?;
            if !b.ld_x.is_multiple_of(8) {
                return Err(bad(format!(
                    "op {j}: ld_x {} must be a multiple of 8",
                    b.ld_x
                )));
            }
            raw.push(GemvOpRaw {
                w: addr(kernels, &b.w.data),
                x: b.x.addr(),
                out: b.out.addr(),
                n: to_i32(op, "n", node.n)?,
                k: to_i32(op, "k", node.k)?,
                m: b.m as i32,
                ld_x: to_i32(op, "ld_x", b.ld_x)?,
                ld_out: to_i32(op, "ld_out", b.ld_out)?,
                pad_: 0,
            });
        }
        let mut written: Vec<(u64, u64, usize)> = bindings
            .iter()
            .enumerate()
            .map(|(j, b)| (b.out.addr(), b.out.addr() + 2 * b.out.len() as u64, j))
            .collect();
        written.sort();
        if let Some(w) = written.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(bad(format!(
                "ops {} and {} write overlapping memory: give each op its own `out`",
                w[0].2, w[1].2
            )));
        }
        // Each task's x ([m][k] bf16) sits behind the ring, then the warps' fragments.
        let x_bytes = ops
            .iter()
            .zip(&bindings)
            .map(|(node, b)| b.m * node.k * 2)
            .max()
            .unwrap_or(0)
            + REDUCE_BYTES;
        let stages = ring_stages(kernels, x_bytes)?;
        let stream = kernels.stream();
        let driver = |source| OpsError::Driver { op, source };
        Ok(PersistentStep {
            blocks: schedule.blocks,
            stages,
            x_bytes,
            tasks: stream.clone_htod(&schedule.tasks).map_err(driver)?,
            begin: stream.clone_htod(&schedule.begin).map_err(driver)?,
            ops: stream.clone_htod(&raw).map_err(driver)?,
            counters: stream.alloc_zeros::<u32>(ops.len()).map_err(driver)?,
            per_launch: stream.clone_htod(&schedule.per_launch).map_err(driver)?,
            epoch: 0,
            _buffers: PhantomData,
        })
    }

    /// Ring slots each block streams through.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// One launch of the whole schedule on the kernels' stream.
    pub fn launch(&mut self, kernels: &LoadedKernels) -> Result<(), OpsError> {
        let op = "persistent_step";
        let smem = self.stages * STAGE_BYTES + self.x_bytes;
        let p = StepParams {
            tasks: addr(kernels, &self.tasks),
            begin: addr(kernels, &self.begin),
            ops: addr(kernels, &self.ops),
            counters: addr(kernels, &self.counters),
            per_launch: addr(kernels, &self.per_launch),
            epoch: self.epoch,
            stages: self.stages as i32,
            x_vectors: ((self.x_bytes - REDUCE_BYTES) / 16) as i32,
            pad_: 0,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        launch_params_pdl(kernels, op, MODULE, ENTRY, cfg, &p, false, None)?;
        self.epoch = self.epoch.wrapping_add(1);
        Ok(())
    }
}

fn addr<T>(kernels: &LoadedKernels, s: &CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    s.device_ptr(kernels.stream()).0
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
    fn the_packing_puts_each_slot_together_and_pads_with_zeros() {
        let (n, k, rows) = (20, 1040, 16);
        let w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(1.0 + i as f32)).collect();
        let packed = pack_reference(&w, n, k, rows);
        // 2 tiles x 3 slots (1040 columns in slots of 512) of 16 x 512.
        assert_eq!(packed.len(), 2 * 3 * 16 * 512);
        let at = |tile: usize, stage: usize, r: usize, c: usize| {
            packed[((tile * 3 + stage) * 16 + r) * 512 + c]
        };
        assert_eq!(at(0, 0, 0, 0), w[0]);
        assert_eq!(at(0, 1, 3, 7), w[3 * k + 512 + 7]);
        assert_eq!(at(1, 2, 3, 15), w[19 * k + 1024 + 15]);
        assert_eq!(at(1, 2, 3, 16), bf16::ZERO, "past k");
        assert_eq!(at(1, 0, 4, 0), bf16::ZERO, "past n");
        assert_eq!(packed.iter().filter(|v| **v != bf16::ZERO).count(), n * k);
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
