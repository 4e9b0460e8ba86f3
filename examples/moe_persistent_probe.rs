//! Issue 30's feasibility measurement for a persistent MoE block at one token: would the
//! persistent step's machinery (`aot_kernels::ops::persistent`: one launch, a block an SM, each
//! block's weight stream running ahead through a shared-memory ring, counters between the ops)
//! stream the bytes of a Qwen3.5/3.6-35B-A3B MoE layer faster than today's Triton block?
//!
//! Per layer at one token the block reads the router (256 x 2048), the gate/up rows and down
//! columns of the 8 chosen experts and of the shared expert: 57.7 MB of bf16. Two ways, each over
//! `--layers` layers launched back to back (every layer its own weights, so that nothing is served
//! from L2):
//!
//! - `triton block`: `moe_forward` at one token on layers of all 256 experts (router with the
//!   routing folded in, `moe_gate_up`, `moe_down`, `moe_combine`: four launches a layer), the
//!   experts chosen by the router;
//! - `persistent`: one launch a layer of the router GEMV, the 9 gate_up GEMVs (SiLU-gated pairs)
//!   and the 9 down GEMVs, each down waiting for its gate_up, on weights packed for the ring and on
//!   row-major ones (a layer's weights stored as a model stores them: 2D tensor copies). The
//!   experts are fixed on the host here: the device-side routing (a route task, experts looked up
//!   by the stream) and the weighted sum are not part of it, so it times what a persistent block's
//!   GEMVs would take: a lower bound on the block.
//!
//! and reads the same number of bytes with the bench's streaming reader (the limit). Prints the
//! median of `--runs` passes, per layer in microseconds, GB/s and percent of the limit.
//!
//! The persistent launches run under several deals of the tiles to the blocks: single tiles (the
//! step's `schedule`) and runs of 2, 4 and 8 consecutive tiles of an op (`schedule_in_runs`), on
//! packed weights and (single tiles and runs of 4) on row-major ones; each gets one stamped launch
//! of its last layer, whose table says where the blocks' time goes.
//!
//!     cargo run --release --example moe_persistent_probe -- [--layers 16] [--runs 20]

#[path = "support/timing.rs"]
mod timing;

use aot_kernels::dispatch::{load_available, open_device, ModuleSource, Policy};
use aot_kernels::ops::init::fill_uniform_bf16;
use aot_kernels::ops::moe::{moe_forward, MoeLayer, MoeScratch, MoeShape};
use aot_kernels::ops::persistent::{
    pack_weights, schedule_in_runs, GemvBinding, GemvNode, PackedWeights, PersistentStep,
    StepInput, StepOutput, StepWeights,
};
use aot_kernels::ops::{dev, dev_mut};
use cudarc::driver::CudaSlice;
use half::bf16;
use timing::time;

/// Experts a token reads: the routed top-k and the shared expert.
const SLOTS: usize = 9;

struct Args {
    layers: usize,
    triton_layers: usize,
    runs: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        layers: 16,
        triton_layers: 6,
        runs: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let v: usize = v.parse().map_err(|_| format!("{flag} {v}: not a number"))?;
        match flag.as_str() {
            "--layers" => a.layers = v,
            "--triton-layers" => a.triton_layers = v,
            "--runs" => a.runs = v,
            _ => {
                return Err(format!(
                    "unknown argument `{flag}` (use --layers, --triton-layers, --runs)"
                ))
            }
        }
    }
    if a.layers == 0 || a.triton_layers == 0 || a.runs == 0 {
        return Err("--layers, --triton-layers and --runs must be positive".into());
    }
    Ok(a)
}

/// What op `j` of [`layer_ops`] is.
fn kind_of(j: usize) -> &'static str {
    match j {
        0 => "router",
        j if j <= SLOTS => "gate_up",
        _ => "down",
    }
}

/// One layer's ops: the router, then gate_up of each slot, then down of each slot after its
/// gate_up ([`kind_of`] names them).
fn layer_ops(shape: &MoeShape) -> Vec<GemvNode> {
    let (h, e, i) = (shape.hidden, shape.experts, shape.inter);
    let mut ops = vec![GemvNode {
        n: e,
        k: h,
        tile_rows: 16,
        after: None,
    }];
    ops.extend((0..SLOTS).map(|_| GemvNode {
        n: 2 * i,
        k: h,
        tile_rows: 16,
        after: None,
    }));
    ops.extend((0..SLOTS).map(|j| GemvNode {
        n: h,
        k: i,
        tile_rows: 16,
        after: Some(1 + j),
    }));
    ops
}

fn run() -> Result<(), String> {
    let a = args()?;
    let d = open_device(0).map_err(|e| format!("no GPU: {e}"))?;
    let kernels =
        load_available(&d, Policy::Auto, &ModuleSource::registry()).map_err(|e| e.to_string())?;
    let s = kernels.stream().clone();
    let sms = kernels.sm_count();
    let shape = MoeShape::QWEN3_5_A3B;
    let (h, e, i) = (shape.hidden, shape.experts, shape.inter);
    let ops = layer_ops(&shape);
    let layer_bytes: usize = ops.iter().map(|o| o.n * o.k * 2).sum();
    println!(
        "capability {} ({sms} SMs); a layer at one token reads {:.1} MB (router, {} experts' gate_up and down)",
        kernels.device().capability,
        layer_bytes as f64 / 1e6,
        SLOTS
    );
    let err = |e: aot_kernels::ops::OpsError| e.to_string();
    let d_err = |e: cudarc::driver::DriverError| e.to_string();
    let mut seed = 0u64;
    let mut random = |n: usize, k: usize| -> Result<CudaSlice<bf16>, String> {
        let mut buf = s.alloc_zeros::<bf16>(n * k).map_err(d_err)?;
        seed += 1;
        let scale = (3.0 / k as f32).sqrt();
        fill_uniform_bf16(
            &kernels,
            dev_mut(&kernels, &mut buf),
            n * k,
            11,
            seed,
            scale,
            0.0,
        )
        .map_err(err)?;
        Ok(buf)
    };

    // The limit: the streaming readers over the persistent pass's bytes, the faster of the two.
    let total = layer_bytes * a.layers;
    let limit_gbs = timing::limit_gbs(&kernels, total, a.runs)?;
    let report = |name: &str, ms: f64, layers: usize, bytes: usize| {
        let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{name:<38} {:>7.2} us a layer  {gbs:>5.0} GB/s  {:>5.1}% of the limit",
            ms * 1e3 / layers as f64,
            100.0 * gbs / limit_gbs
        );
    };

    // The Triton block on whole layers (256 experts each), one token.
    {
        let x = random(1, h)?;
        let layers: Vec<[CudaSlice<bf16>; 6]> = (0..a.triton_layers)
            .map(|_| {
                Ok([
                    random(e, h)?,
                    random(1, h)?,
                    random(e * 2 * i, h)?,
                    random(e * h, i)?,
                    random(2 * i, h)?,
                    random(h, i)?,
                ])
            })
            .collect::<Result<_, String>>()?;
        let mut scratch = MoeScratch::new(&s, &shape, 1).map_err(err)?;
        let mut out = s.alloc_zeros::<bf16>(h).map_err(d_err)?;
        let ms = time(&kernels, a.runs, || {
            for w in &layers {
                let layer = MoeLayer {
                    router: &w[0],
                    shared_gate: &w[1],
                    gate_up: &w[2],
                    down: &w[3],
                    shared_gate_up: &w[4],
                    shared_down: &w[5],
                };
                moe_forward(&kernels, &shape, &layer, &x, 1, &mut scratch, &mut out)
                    .map_err(err)?;
            }
            Ok(())
        })?;
        // Its bytes: the persistent layer's (router, the 8 chosen and the shared expert) and the
        // shared gate.
        let bytes = layer_bytes + 2 * h;
        report(
            "triton block (4 launches a layer)",
            ms,
            a.triton_layers,
            bytes * a.triton_layers,
        );
    }

    // The persistent launches: every layer its own router and 9 experts.
    let x = random(1, h)?;
    let weights: Vec<Vec<CudaSlice<bf16>>> = (0..a.layers)
        .map(|_| ops.iter().map(|o| random(o.n, o.k)).collect())
        .collect::<Result<_, String>>()?;
    let packed: Vec<Vec<PackedWeights>> = weights
        .iter()
        .map(|layer| {
            layer
                .iter()
                .zip(&ops)
                .enumerate()
                .map(|(j, (w, o))| {
                    let paired = kind_of(j) == "gate_up";
                    pack_weights(&kernels, dev(&kernels, w), o.n, o.k, o.tile_rows, paired)
                        .map_err(err)
                })
                .collect()
        })
        .collect::<Result<_, String>>()?;
    let logits = s.alloc_zeros::<f32>(e).map_err(d_err)?;
    let hs: Vec<CudaSlice<bf16>> = (0..SLOTS)
        .map(|_| s.alloc_zeros::<bf16>(i))
        .collect::<Result<_, _>>()
        .map_err(d_err)?;
    let ys: Vec<CudaSlice<bf16>> = (0..SLOTS)
        .map(|_| s.alloc_zeros::<bf16>(h))
        .collect::<Result<_, _>>()
        .map_err(d_err)?;
    let tiles = |kind: &str| -> usize {
        ops.iter()
            .enumerate()
            .filter(|(j, _)| kind_of(*j) == kind)
            .map(|(_, o)| o.tiles())
            .sum()
    };
    let mut results = Vec::new();
    // (packed, tiles dealt to a block at a time): single tiles make every tile of this step a run
    // of its own (19 small ops over 132 blocks); runs share one counter wait and copy of x. The
    // row-major weights at runs of 4 are what an engine would stream (256 experts a layer leave no
    // room for a packed copy).
    for (is_packed, run) in [
        (true, 1),
        (false, 1),
        (true, 2),
        (true, 4),
        (false, 4),
        (true, 8),
    ] {
        let name = format!(
            "persistent, {}, runs of {run}",
            if is_packed { "packed" } else { "row-major" }
        );
        let sched = schedule_in_runs(&ops, sms, run).map_err(err)?;
        sched.check()?;

        let mut steps = Vec::with_capacity(a.layers);
        for l in 0..a.layers {
            let w = |j: usize| {
                if is_packed {
                    StepWeights::Packed(&packed[l][j])
                } else {
                    StepWeights::RowMajor(dev(&kernels, &weights[l][j]))
                }
            };
            let mut binds = vec![GemvBinding {
                w: w(0),
                x: dev(&kernels, &x),
                input: StepInput::Plain,
                out: StepOutput::F32(dev(&kernels, &logits)),
                m: 1,
                ld_x: h,
                ld_out: e,
            }];
            for (j, hj) in hs.iter().enumerate() {
                binds.push(GemvBinding {
                    w: w(1 + j),
                    x: dev(&kernels, &x),
                    input: StepInput::Plain,
                    out: StepOutput::SiluMul(dev(&kernels, hj)),
                    m: 1,
                    ld_x: h,
                    ld_out: i,
                });
            }
            for (j, (hj, yj)) in hs.iter().zip(&ys).enumerate() {
                binds.push(GemvBinding {
                    w: w(1 + SLOTS + j),
                    x: dev(&kernels, hj),
                    input: StepInput::Plain,
                    out: StepOutput::Bf16(dev(&kernels, yj)),
                    m: 1,
                    ld_x: i,
                    ld_out: h,
                });
            }
            steps.push(PersistentStep::new(&kernels, &ops, &sched, binds).map_err(err)?);
        }
        let ms = timing::time_launches(&kernels, a.runs, &mut steps)?;
        report(&name, ms, a.layers, total);
        // One stamped launch of the last layer: where a block's time goes, per op kind.
        if let Some(last) = steps.last_mut() {
            use aot_kernels::ops::persistent_trace::{kind_times, table};
            let runs = timing::stamped_launch(&kernels, last)?;
            println!(
                "stamped launch ({name}; {} router, {} gate_up and {} down tiles of {} tasks over {sms} blocks):\n{}",
                tiles("router"),
                tiles("gate_up"),
                tiles("down"),
                sched.tasks.len(),
                table(&kind_times(&runs, &|j| kind_of(j).to_string()))
            );
        }
        let mut got = s
            .clone_dtoh(&logits)
            .map_err(d_err)?
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>();
        for y in &ys {
            got.extend(
                s.clone_dtoh(y)
                    .map_err(d_err)?
                    .iter()
                    .map(|v| u32::from(v.to_bits())),
            );
        }
        results.push(got);
    }
    let equal = results.iter().all(|r| *r == results[0]);
    println!(
        "the last layer's logits and down outputs, every schedule and layout: {}",
        if equal { "equal bits" } else { "DIFFERENT" }
    );
    if !equal {
        return Err("the schedules or layouts disagree".into());
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("moe_persistent_probe: {e}");
        std::process::exit(1);
    }
}
