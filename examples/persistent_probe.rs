//! Issue 32's first measurement: what the persistent execution model buys on this GPU, before the
//! whole decode step moves to it. Streams every projection of a dense Qwen3 step (Qwen3-4B's shapes
//! by default: 36 layers of qkv, o, gate_up and down, then lm_head; about 8 GB of bf16 weights) as
//! a chain of GEMVs, each reading what the one before it wrote, in three ways:
//!
//! - `persistent`: one launch, one block per SM, counters between the ops, each block's weight
//!   stream running ahead of the waits (`aot_kernels::ops::persistent`);
//! - `persistent, 16-row tiles`: the same with the narrow ops (o, down) in 16-row tiles;
//! - `persistent, row-major weights`: the first on the weights as a model stores them (a slot
//!   one bulk copy per row) instead of packed ones (one copy a slot);
//! - `launches`: the same kernel launched once per op (the launch-per-op execution model);
//!
//! and reads the same number of bytes with the streaming reader of the bench (the limit). Prints
//! the median of `--runs` steps of each, in microseconds, GB/s and percent of the limit, at 1 and
//! 8 token rows, and checks that the persistent launch and the launches give equal bits.
//!
//!     cargo run --release --example persistent_probe -- [--layers 36] [--runs 20] [--blocks N]

#[path = "support/timing.rs"]
mod timing;

use std::time::Instant;

use aot_kernels::dispatch::{load_available, open_device, LoadedKernels, ModuleSource, Policy};
use aot_kernels::ops::init::fill_uniform_bf16;
use aot_kernels::ops::persistent::{
    pack_weights, schedule, GemvBinding, GemvNode, PackedWeights, PersistentStep, StepInput,
    StepOutput, StepWeights,
};
use aot_kernels::ops::{dev, dev_mut};
use cudarc::driver::CudaSlice;
use half::bf16;
use timing::time;

struct Args {
    layers: usize,
    runs: usize,
    blocks: Option<usize>,
    /// Launch without the programmatic attribute (to measure what it gives).
    no_pdl: bool,
    /// Where a stamped launch of each persistent schedule writes its table and timeline.
    trace: Option<std::path::PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        layers: 36,
        runs: 20,
        blocks: None,
        no_pdl: false,
        trace: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--no-pdl" {
            a.no_pdl = true;
            continue;
        }
        if flag == "--trace" {
            a.trace = Some(it.next().ok_or("--trace needs a folder")?.into());
            continue;
        }
        let mut value = || -> Result<usize, String> {
            let v = it.next().ok_or(format!("{flag} needs a value"))?;
            v.parse().map_err(|_| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--layers" => a.layers = value()?,
            "--runs" => a.runs = value()?,
            "--blocks" => a.blocks = Some(value()?),
            _ => {
                return Err(format!(
                "unknown argument `{flag}` (use --layers, --runs, --blocks, --no-pdl, --trace DIR)"
            ))
            }
        }
    }
    if a.layers == 0 || a.runs == 0 {
        return Err("--layers and --runs must be positive".into());
    }
    Ok(a)
}

/// Qwen3-4B's projections, layer by layer, then lm_head; `narrow_rows` for o and down.
fn qwen3_4b_chain(layers: usize, narrow_rows: usize) -> Vec<GemvNode> {
    let (h, q, kv, inter, vocab) = (2560, 4096, 1024, 9728, 151936);
    let mut ops: Vec<GemvNode> = Vec::new();
    let push = |ops: &mut Vec<GemvNode>, n, k, tile_rows| {
        let after = ops.len().checked_sub(1);
        ops.push(GemvNode {
            n,
            k,
            tile_rows,
            after,
        });
    };
    for _ in 0..layers {
        push(&mut ops, q + 2 * kv, h, 16);
        push(&mut ops, h, q, narrow_rows);
        push(&mut ops, 2 * inter, h, 16);
        push(&mut ops, h, inter, narrow_rows);
    }
    push(&mut ops, vocab, h, 16);
    ops
}

fn run() -> Result<(), String> {
    let a = args()?;
    let started = Instant::now();
    let d = open_device(0).map_err(|e| format!("no GPU: {e}"))?;
    let kernels =
        load_available(&d, Policy::Auto, &ModuleSource::registry()).map_err(|e| e.to_string())?;
    let s = kernels.stream().clone();
    let sms = kernels.sm_count();
    let blocks = a.blocks.unwrap_or(sms);
    let ops = qwen3_4b_chain(a.layers, 8);
    let weight_bytes: usize = ops.iter().map(|o| o.n * o.k * 2).sum();
    println!(
        "capability {} ({sms} SMs), {} ops over {} layers + lm_head, {:.2} GB of weights, {blocks} blocks",
        kernels.device().capability,
        ops.len(),
        a.layers,
        weight_bytes as f64 / 1e9
    );
    let e = |e: aot_kernels::ops::OpsError| e.to_string();
    let d_err = |e: cudarc::driver::DriverError| e.to_string();
    // Each weight made row-major (kept: the row-major schedule streams it as it is), then packed
    // for the tile rows of both packed schedules below (the narrow ops in 8- and 16-row tiles).
    let mut rows: Vec<CudaSlice<bf16>> = Vec::with_capacity(ops.len());
    let mut w8: Vec<PackedWeights> = Vec::with_capacity(ops.len());
    let mut w16: Vec<Option<PackedWeights>> = Vec::with_capacity(ops.len());
    for (j, op) in ops.iter().enumerate() {
        let mut buf = s.alloc_zeros::<bf16>(op.n * op.k).map_err(d_err)?;
        let scale = (3.0 / op.k as f32).sqrt();
        fill_uniform_bf16(
            &kernels,
            dev_mut(&kernels, &mut buf),
            op.n * op.k,
            7,
            j as u64,
            scale,
            0.0,
        )
        .map_err(e)?;
        w8.push(
            pack_weights(
                &kernels,
                dev(&kernels, &buf),
                op.n,
                op.k,
                op.tile_rows,
                false,
            )
            .map_err(e)?,
        );
        w16.push(if op.tile_rows == 16 {
            None
        } else {
            Some(pack_weights(&kernels, dev(&kernels, &buf), op.n, op.k, 16, false).map_err(e)?)
        });
        rows.push(buf);
    }
    // The limit: the streaming readers over the same number of bytes, the faster of the two.
    let limit_gbs = timing::limit_gbs(&kernels, weight_bytes, a.runs)?;
    for m in [1usize, 8] {
        let x0 = {
            let mut x = s.alloc_zeros::<bf16>(m * ops[0].k).map_err(d_err)?;
            fill_uniform_bf16(
                &kernels,
                dev_mut(&kernels, &mut x),
                m * ops[0].k,
                9,
                0,
                1.0,
                0.0,
            )
            .map_err(e)?;
            x
        };
        let outs: Vec<CudaSlice<bf16>> = ops
            .iter()
            .map(|o| s.alloc_zeros::<bf16>(m * o.n))
            .collect::<Result<_, _>>()
            .map_err(d_err)?;
        // narrow: the narrow ops' tile rows (8 or 16) on packed weights; 0: 8-row tiles on the
        // row-major weights.
        let bind = |j: usize, narrow: usize| GemvBinding {
            w: match narrow {
                0 => StepWeights::RowMajor(dev(&kernels, &rows[j])),
                16 => StepWeights::Packed(w16[j].as_ref().unwrap_or(&w8[j])),
                _ => StepWeights::Packed(&w8[j]),
            },
            x: if j == 0 {
                dev(&kernels, &x0)
            } else {
                dev(&kernels, &outs[j - 1])
            },
            input: StepInput::Plain,
            out: StepOutput::Bf16(dev(&kernels, &outs[j])),
            m,
            ld_x: if j == 0 { ops[0].k } else { ops[j - 1].n },
            ld_out: ops[j].n,
        };
        let report = |name: &str, ms: f64| {
            let gbs = weight_bytes as f64 / (ms * 1e-3) / 1e9;
            println!(
                "m {m}: {name:<34} {:>8.1} us  {gbs:>5.0} GB/s  {:>5.1}% of the limit",
                ms * 1e3,
                100.0 * gbs / limit_gbs
            );
        };
        let mut results = Vec::new();
        for (name, narrow) in [
            ("persistent (8-row narrow tiles)", 8),
            ("persistent (16-row tiles)", 16),
            ("persistent (row-major weights)", 0),
        ] {
            let chain: Vec<GemvNode> = qwen3_4b_chain(a.layers, narrow.max(8));
            let sched = schedule(&chain, blocks).map_err(e)?;
            let mut step = PersistentStep::new(
                &kernels,
                &chain,
                &sched,
                (0..chain.len()).map(|j| bind(j, narrow)).collect(),
            )
            .map_err(e)?;
            step.set_programmatic(!a.no_pdl);
            let ms = time(&kernels, a.runs, || step.launch(&kernels).map_err(e))?;
            report(name, ms);
            if let Some(dir) = &a.trace {
                let tag = match narrow {
                    0 => "row-major",
                    16 => "packed-16",
                    _ => "packed-8",
                };
                trace(&kernels, &mut step, dir, &format!("m{m}-{tag}"), name)?;
            }
            results.push(
                outs.last()
                    .map(|o| s.clone_dtoh(o))
                    .transpose()
                    .map_err(d_err)?,
            );
        }
        let mut steps = Vec::new();
        for (j, op) in ops.iter().enumerate() {
            let node = GemvNode { after: None, ..*op };
            let sched = schedule(&[node], sms).map_err(e)?;
            let mut st =
                PersistentStep::new(&kernels, &[node], &sched, vec![bind(j, 8)]).map_err(e)?;
            st.set_programmatic(!a.no_pdl);
            steps.push(st);
        }
        let ms = timing::time_launches(&kernels, a.runs, &mut steps)?;
        report(&format!("launches ({} of them)", ops.len()), ms);
        let per_op = outs
            .last()
            .map(|o| s.clone_dtoh(o))
            .transpose()
            .map_err(d_err)?;
        // The launches use the first schedule's tiles (8-row narrow ones); tile rows are part of
        // the sum order, so only that one must give their bits.
        let equal = results[0] == per_op && results[2] == per_op;
        println!(
            "m {m}: lm_head output of the persistent launches (8-row narrow tiles, packed and row-major) and of the launches: {}",
            if equal { "equal bits" } else { "DIFFERENT" }
        );
        if !equal {
            return Err("the persistent step and the launches disagree".into());
        }
    }
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The probe's op kinds: qkv, o, gate_up and down by layer, then lm_head.
fn kind_of(ops: usize) -> impl Fn(usize) -> String {
    move |op| {
        if op + 1 == ops {
            "lm_head".into()
        } else {
            ["qkv", "o", "gate_up", "down"][op % 4].into()
        }
    }
}

/// One stamped launch of `step`: its table on stdout, its timeline as `<dir>/<file>.svg`.
fn trace(
    kernels: &LoadedKernels,
    step: &mut PersistentStep<'_>,
    dir: &std::path::Path,
    file: &str,
    name: &str,
) -> Result<(), String> {
    use aot_kernels::ops::persistent_trace::{kind_times, table, timeline_svg};
    let runs = timing::stamped_launch(kernels, step)?;
    let kinds = kind_of(step.schedule().per_launch.len());
    println!(
        "trace of {name} ({file}):\n{}",
        table(&kind_times(&runs, &kinds))
    );
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{file}.svg"));
    std::fs::write(
        &path,
        timeline_svg(
            &[runs],
            &kinds,
            &format!("persistent_probe: {name}, {file}"),
        ),
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

fn main() {
    if let Err(e) = run() {
        eprintln!("persistent_probe: {e}");
        std::process::exit(1);
    }
}
