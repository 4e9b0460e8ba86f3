//! The persistent step (issue 32) on a real GPU: a chain of GEMV ops, each reading what the one
//! before it wrote, run as one launch with counters between the ops, against the float64
//! reference of every op (on the GPU's own input to it), from SASS and from PTX; and the same bits
//! over every block count (all SMs, Thor's 20, 16, 1), one launch per op, and launch after launch
//! (the counters only grow).
//!
//! `#[ignore]`d (they need a CUDA GPU): run them with `--ignored` on the GPU machine.

mod gpu_common;

use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::dev;
use aot_kernels::ops::persistent::{
    pack_reference, pack_weights, schedule, GemvBinding, GemvNode, PackedWeights, PersistentStep,
};
use cudarc::driver::CudaSlice;
use gpu_common::{device, load_both_paths, random_bf16, seed};
use half::bf16;

/// A two-layer chain of Qwen-like projections at a small width: qkv-like, o-like (8-row tiles),
/// gate_up-like, down-like (8-row tiles); each op reads the first `k` outputs of the op before.
fn chain(hidden: usize) -> Vec<GemvNode> {
    let shapes = [
        (3 * hidden, hidden, 16),
        (hidden, 2 * hidden, 8),
        (4 * hidden, hidden, 16),
        (hidden, 2 * hidden, 8),
    ];
    let mut ops = Vec::new();
    for _layer in 0..2 {
        for &(n, k, tile_rows) in &shapes {
            let after = ops.len().checked_sub(1);
            ops.push(GemvNode {
                n,
                k,
                tile_rows,
                after,
            });
        }
    }
    ops
}

struct Buffers {
    x0: CudaSlice<bf16>,
    w: Vec<PackedWeights>,
    out: Vec<CudaSlice<bf16>>,
    host_w: Vec<Vec<bf16>>,
    host_x0: Vec<bf16>,
}

fn buffers(
    kernels: &LoadedKernels,
    ops: &[GemvNode],
    m: usize,
    rng: &mut impl rand::Rng,
) -> Buffers {
    let stream = kernels.stream();
    let host_x0 = random_bf16(rng, m * ops[0].k, 1.0);
    let host_w: Vec<Vec<bf16>> = ops
        .iter()
        .map(|op| random_bf16(rng, op.n * op.k, (3.0 / op.k as f32).sqrt()))
        .collect();
    Buffers {
        x0: stream.clone_htod(&host_x0).unwrap(),
        w: host_w
            .iter()
            .zip(ops)
            .map(|(w, op)| {
                let d = stream.clone_htod(w).unwrap();
                let packed =
                    pack_weights(kernels, dev(kernels, &d), op.n, op.k, op.tile_rows).unwrap();
                assert!(
                    stream.clone_dtoh(&packed.data).unwrap()
                        == pack_reference(w, op.n, op.k, op.tile_rows),
                    "the packed weights of a {} x {} op differ from pack_reference",
                    op.n,
                    op.k
                );
                packed
            })
            .collect(),
        out: ops
            .iter()
            .map(|op| stream.alloc_zeros::<bf16>(m * op.n).unwrap())
            .collect(),
        host_w,
        host_x0,
    }
}

/// Runs `ops` over `blocks` blocks `launches` times (or, with `per_op`, one launch per op in
/// order) and returns every op's output.
fn run(
    kernels: &LoadedKernels,
    ops: &[GemvNode],
    b: &mut Buffers,
    m: usize,
    blocks: usize,
    launches: usize,
    per_op: bool,
) -> Vec<Vec<bf16>> {
    let stream = kernels.stream().clone();
    for o in &mut b.out {
        stream.memset_zeros(o).unwrap();
    }
    if per_op {
        for j in 0..ops.len() {
            let node = GemvNode {
                after: None,
                ..ops[j]
            };
            let s = schedule(&[node], blocks).unwrap();
            let (x, ld_x) = if j == 0 {
                (dev(kernels, &b.x0), ops[0].k)
            } else {
                (dev(kernels, &b.out[j - 1]), ops[j - 1].n)
            };
            let binding = GemvBinding {
                w: &b.w[j],
                x,
                out: dev(kernels, &b.out[j]),
                m,
                ld_x,
                ld_out: ops[j].n,
            };
            let mut step = PersistentStep::new(kernels, &[node], &s, vec![binding]).unwrap();
            for _ in 0..launches {
                step.launch(kernels).unwrap();
            }
        }
    } else {
        let s = schedule(ops, blocks).unwrap();
        let bindings = (0..ops.len())
            .map(|j| GemvBinding {
                w: &b.w[j],
                x: if j == 0 {
                    dev(kernels, &b.x0)
                } else {
                    dev(kernels, &b.out[j - 1])
                },
                out: dev(kernels, &b.out[j]),
                m,
                ld_x: if j == 0 { ops[0].k } else { ops[j - 1].n },
                ld_out: ops[j].n,
            })
            .collect();
        let mut step = PersistentStep::new(kernels, ops, &s, bindings).unwrap();
        for _ in 0..launches {
            step.launch(kernels).unwrap();
        }
    }
    b.out
        .iter()
        .map(|o| stream.clone_dtoh(o).unwrap())
        .collect()
}

/// Every op's output within the fp32-sum-then-round bound of the float64 reference computed on the
/// GPU's own input to that op.
fn check_against_reference(
    ops: &[GemvNode],
    b: &Buffers,
    outs: &[Vec<bf16>],
    m: usize,
    what: &str,
) {
    for (j, op) in ops.iter().enumerate() {
        let (x, ld_x) = if j == 0 {
            (&b.host_x0, op.k)
        } else {
            (&outs[j - 1], ops[j - 1].n)
        };
        let w = &b.host_w[j];
        let mut worst = 0.0f64;
        for t in 0..m {
            for r in 0..op.n {
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for i in 0..op.k {
                    let term =
                        f64::from(w[r * op.k + i].to_f32()) * f64::from(x[t * ld_x + i].to_f32());
                    sum += term;
                    mag += term.abs();
                }
                let got = f64::from(outs[j][t * op.n + r].to_f32());
                // fp32 sums of k terms, then one bf16 rounding (half an ulp of 2^-8 relative).
                let bound = op.k as f64 * 2f64.powi(-23) * mag
                    + (sum.abs() + op.k as f64 * 2f64.powi(-23) * mag) * 2f64.powi(-8);
                let err = (got - sum).abs();
                assert!(
                    err <= bound,
                    "{what}: op {j} token {t} row {r}: {got} vs reference {sum} (bound {bound})"
                );
                worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
            }
        }
        eprintln!(
            "  {what}: op {j} ({}x{}): error at most {worst:.3} of its bound",
            op.n, op.k
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_a_persistent_gemv_chain_matches_the_reference_and_its_bits_hold_over_every_schedule() {
    let d = device();
    let mut rng = seed("gpu_persistent_chain");
    for (path, kernels) in load_both_paths(&d) {
        let sms = kernels.sm_count();
        for (hidden, m) in [(256usize, 1usize), (512, 3), (384, 8)] {
            let ops = chain(hidden);
            let mut b = buffers(&kernels, &ops, m, &mut rng);
            let base = run(&kernels, &ops, &mut b, m, sms, 1, false);
            let what = format!("{path} hidden {hidden} m {m} {sms} blocks");
            check_against_reference(&ops, &b, &base, m, &what);
            for (blocks, launches, per_op) in [
                (sms, 3, false),
                (20.min(sms), 1, false),
                (16.min(sms), 2, false),
                (1, 1, false),
                (sms, 1, true),
                (20.min(sms), 1, true),
            ] {
                let got = run(&kernels, &ops, &mut b, m, blocks, launches, per_op);
                assert!(
                    got == base,
                    "{what}: {blocks} blocks, {launches} launch(es), per op {per_op}: bits differ from one launch over all SMs"
                );
            }
            eprintln!("  {what}: equal bits over 20 / 16 / 1 blocks, repeated launches and one launch per op");
        }
    }
}
