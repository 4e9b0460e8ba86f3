//! The persistent step (issue 32) on a real GPU: a chain of GEMV ops, each reading what the one
//! before it wrote, run as one launch with counters between the ops, against the float64
//! reference of every op (on the GPU's own input to it), from SASS and from PTX; and the same bits
//! over every block count (all SMs, Thor's 20, 16, 1), one launch per op, and launch after launch
//! (the counters only grow), with the weights packed or row-major; and a decoder layer's ops
//! (residual adds, RMSNorm inputs, the gate/up pair with SiLU, fp32 logits) against their
//! references, with the same bits over every block count and launch after launch.
//!
//! `#[ignore]`d (they need a CUDA GPU): run them with `--ignored` on the GPU machine.

mod gpu_common;

use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::dev;
use aot_kernels::ops::persistent::{
    pack_reference, pack_weights, schedule, GemvBinding, GemvNode, PackedWeights, PersistentStep,
    StepInput, StepOutput, StepWeights,
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
    /// The same weights row-major.
    w_rows: Vec<CudaSlice<bf16>>,
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
        w_rows: host_w
            .iter()
            .map(|w| stream.clone_htod(w).unwrap())
            .collect(),
        w: host_w
            .iter()
            .zip(ops)
            .map(|(w, op)| {
                let d = stream.clone_htod(w).unwrap();
                let packed =
                    pack_weights(kernels, dev(kernels, &d), op.n, op.k, op.tile_rows, false)
                        .unwrap();
                assert!(
                    stream.clone_dtoh(&packed.data).unwrap()
                        == pack_reference(w, op.n, op.k, op.tile_rows, false),
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
/// order), on the packed weights or (`rows`) the row-major ones, and returns every op's output.
#[allow(clippy::too_many_arguments)]
fn run(
    kernels: &LoadedKernels,
    ops: &[GemvNode],
    b: &mut Buffers,
    m: usize,
    blocks: usize,
    launches: usize,
    per_op: bool,
    rows: bool,
) -> Vec<Vec<bf16>> {
    fn weights<'a>(
        kernels: &'a LoadedKernels,
        b: &'a Buffers,
        j: usize,
        rows: bool,
    ) -> StepWeights<'a> {
        if rows {
            StepWeights::RowMajor(dev(kernels, &b.w_rows[j]))
        } else {
            StepWeights::Packed(&b.w[j])
        }
    }
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
                w: weights(kernels, b, j, rows),
                x,
                input: StepInput::Plain,
                out: StepOutput::Bf16(dev(kernels, &b.out[j])),
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
                w: weights(kernels, b, j, rows),
                x: if j == 0 {
                    dev(kernels, &b.x0)
                } else {
                    dev(kernels, &b.out[j - 1])
                },
                input: StepInput::Plain,
                out: StepOutput::Bf16(dev(kernels, &b.out[j])),
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
            let base = run(&kernels, &ops, &mut b, m, sms, 1, false, false);
            let what = format!("{path} hidden {hidden} m {m} {sms} blocks");
            check_against_reference(&ops, &b, &base, m, &what);
            for (blocks, launches, per_op, rows) in [
                (sms, 3, false, false),
                (20.min(sms), 1, false, false),
                (16.min(sms), 2, false, false),
                (1, 1, false, false),
                (sms, 1, true, false),
                (20.min(sms), 1, true, false),
                (sms, 2, false, true),
                (20.min(sms), 1, false, true),
                (16.min(sms), 1, true, true),
            ] {
                let got = run(&kernels, &ops, &mut b, m, blocks, launches, per_op, rows);
                assert!(
                    got == base,
                    "{what}: {blocks} blocks, {launches} launch(es), per op {per_op}, row-major {rows}: bits differ from one launch over all SMs on packed weights"
                );
            }
            eprintln!("  {what}: equal bits over 20 / 16 / 1 blocks, repeated launches, one launch per op, packed and row-major weights");
        }
    }
}

/// A decoder layer's four kinds of op in one launch, each on buffers of its own so that every
/// input survives for the reference:
///   0 o-like     r1 = bf16(r1 + bf16(W0 a))                      (residual, 8-row tiles)
///   1 gate_up    act = silu_mul(W1 rmsnorm(r1, n1, offset))      (norm input, gate/up pairs)
///   2 down       r2 = bf16(r2 + bf16(W2 act))                    (residual)
///   3 lm_head    logits = W3 rmsnorm(r2, n3, offset)             (norm input, fp32 out)
struct Layer {
    hidden: usize,
    inter: usize,
    vocab: usize,
    host_w: Vec<Vec<bf16>>,
    w: Vec<CudaSlice<bf16>>,
    packed: Vec<PackedWeights>,
    host_norm: [Vec<bf16>; 2],
    norm: [CudaSlice<bf16>; 2],
    host_a: Vec<bf16>,
    a: CudaSlice<bf16>,
    host_r: [Vec<bf16>; 2],
    r: [CudaSlice<bf16>; 2],
    act: CudaSlice<bf16>,
    logits: CudaSlice<f32>,
}

fn layer_ops(l: &Layer) -> Vec<GemvNode> {
    let (h, i, v) = (l.hidden, l.inter, l.vocab);
    vec![
        GemvNode {
            n: h,
            k: 2 * h,
            tile_rows: 8,
            after: None,
        },
        GemvNode {
            n: 2 * i,
            k: h,
            tile_rows: 16,
            after: Some(0),
        },
        GemvNode {
            n: h,
            k: i,
            tile_rows: 16,
            after: Some(1),
        },
        GemvNode {
            n: v,
            k: h,
            tile_rows: 16,
            after: Some(2),
        },
    ]
}

fn layer(
    kernels: &LoadedKernels,
    (hidden, inter, vocab): (usize, usize, usize),
    m: usize,
    rng: &mut impl rand::Rng,
) -> Layer {
    let stream = kernels.stream();
    let shapes = [
        (hidden, 2 * hidden),
        (2 * inter, hidden),
        (hidden, inter),
        (vocab, hidden),
    ];
    let host_w: Vec<Vec<bf16>> = shapes
        .iter()
        .map(|&(n, k)| random_bf16(rng, n * k, (3.0 / k as f32).sqrt()))
        .collect();
    let w: Vec<CudaSlice<bf16>> = host_w
        .iter()
        .map(|w| stream.clone_htod(w).unwrap())
        .collect();
    let packed = shapes
        .iter()
        .enumerate()
        .map(|(j, &(n, k))| {
            let (rows, paired) = ([8, 16, 16, 16][j], j == 1);
            let p = pack_weights(kernels, dev(kernels, &w[j]), n, k, rows, paired).unwrap();
            assert!(
                stream.clone_dtoh(&p.data).unwrap()
                    == pack_reference(&host_w[j], n, k, rows, paired),
                "op {j}: the packed weights (paired {paired}) differ from pack_reference"
            );
            p
        })
        .collect();
    let host_norm = [random_bf16(rng, hidden, 1.0), random_bf16(rng, hidden, 1.0)];
    let host_a = random_bf16(rng, m * 2 * hidden, 1.0);
    let host_r = [
        random_bf16(rng, m * hidden, 1.0),
        random_bf16(rng, m * hidden, 1.0),
    ];
    Layer {
        hidden,
        inter,
        vocab,
        norm: [
            stream.clone_htod(&host_norm[0]).unwrap(),
            stream.clone_htod(&host_norm[1]).unwrap(),
        ],
        host_norm,
        a: stream.clone_htod(&host_a).unwrap(),
        host_a,
        r: [
            stream.clone_htod(&host_r[0]).unwrap(),
            stream.clone_htod(&host_r[1]).unwrap(),
        ],
        host_r,
        act: stream.alloc_zeros::<bf16>(m * inter).unwrap(),
        logits: stream.alloc_zeros::<f32>(m * vocab).unwrap(),
        host_w,
        w,
        packed,
    }
}

/// What one launch of the layer left: r1, act, r2 and the logits.
type LayerOut = (Vec<bf16>, Vec<bf16>, Vec<bf16>, Vec<f32>);

/// Resets the residual streams, then `launches` launches over `blocks` blocks (the residual
/// streams reset again before each, so every launch computes the same thing).
fn run_layer(
    kernels: &LoadedKernels,
    l: &mut Layer,
    m: usize,
    blocks: usize,
    launches: usize,
    rows: bool,
    offset: f32,
) -> LayerOut {
    let stream = kernels.stream().clone();
    let ops = layer_ops(l);
    let s = schedule(&ops, blocks).unwrap();
    let (h, i, v) = (l.hidden, l.inter, l.vocab);
    let mut step = {
        let w = |j: usize| {
            if rows {
                StepWeights::RowMajor(dev(kernels, &l.w[j]))
            } else {
                StepWeights::Packed(&l.packed[j])
            }
        };
        let norm = |q: usize| StepInput::Norm {
            weight: dev(kernels, &l.norm[q]),
            eps: 1e-6,
            weight_offset: offset,
        };
        let bindings = vec![
            GemvBinding {
                w: w(0),
                x: dev(kernels, &l.a),
                input: StepInput::Plain,
                out: StepOutput::Residual(dev(kernels, &l.r[0])),
                m,
                ld_x: 2 * h,
                ld_out: h,
            },
            GemvBinding {
                w: w(1),
                x: dev(kernels, &l.r[0]),
                input: norm(0),
                out: StepOutput::SiluMul(dev(kernels, &l.act)),
                m,
                ld_x: h,
                ld_out: i,
            },
            GemvBinding {
                w: w(2),
                x: dev(kernels, &l.act),
                input: StepInput::Plain,
                out: StepOutput::Residual(dev(kernels, &l.r[1])),
                m,
                ld_x: i,
                ld_out: h,
            },
            GemvBinding {
                w: w(3),
                x: dev(kernels, &l.r[1]),
                input: norm(1),
                out: StepOutput::F32(dev(kernels, &l.logits)),
                m,
                ld_x: h,
                ld_out: v,
            },
        ];
        // SAFETY: every bound buffer is a field of `l`, alive and untouched until the step is
        // dropped at the end of this function; the resets below are ordered on the same stream.
        unsafe { PersistentStep::new_unbound(kernels, &ops, &s, bindings).unwrap() }
    };
    for _ in 0..launches {
        stream.memcpy_htod(&l.host_r[0], &mut l.r[0]).unwrap();
        stream.memcpy_htod(&l.host_r[1], &mut l.r[1]).unwrap();
        step.launch(kernels).unwrap();
    }
    (
        stream.clone_dtoh(&l.r[0]).unwrap(),
        stream.clone_dtoh(&l.act).unwrap(),
        stream.clone_dtoh(&l.r[1]).unwrap(),
        stream.clone_dtoh(&l.logits).unwrap(),
    )
}

/// `sum_i w[r][i] * x[i]` in float64 and the sum of the terms' magnitudes.
fn dot(w: &[bf16], x: &[f64], r: usize) -> (f64, f64) {
    let k = x.len();
    let (mut sum, mut mag) = (0.0, 0.0);
    for (i, xi) in x.iter().enumerate() {
        let term = f64::from(w[r * k + i].to_f32()) * xi;
        sum += term;
        mag += term.abs();
    }
    (sum, mag)
}

/// The fp32 sum's bound over `k` terms of magnitude `mag`, plus (`norm_in`) an ulp of bf16 on every
/// x element (the RMSNorm's two roundings, whose fp32 scale may round otherwise than float64's).
fn sum_bound(k: usize, mag: f64, norm_in: bool) -> f64 {
    k as f64 * 2f64.powi(-23) * mag + if norm_in { 2f64.powi(-8) * mag } else { 0.0 }
}

fn rmsnorm64(x: &[bf16], w: &[bf16], offset: f32) -> Vec<f64> {
    let xf: Vec<f64> = x.iter().map(|v| f64::from(v.to_f32())).collect();
    let ms = xf.iter().map(|v| v * v).sum::<f64>() / xf.len() as f64;
    let scale = 1.0 / (ms + 1e-6).sqrt();
    xf.iter()
        .zip(w)
        .map(|(v, w)| (f64::from(w.to_f32()) + f64::from(offset)) * v * scale)
        .collect()
}

fn check_layer(l: &Layer, m: usize, got: &LayerOut, offset: f32, what: &str) {
    let (h, i, v) = (l.hidden, l.inter, l.vocab);
    let (r1, act, r2, logits) = got;
    let ulp = 2f64.powi(-8);
    let mut worst = [0.0f64; 4];
    let mut note = |op: usize, err: f64, bound: f64, msg: &dyn Fn() -> String| {
        assert!(err <= bound, "{what}: {}", msg());
        worst[op] = worst[op].max(err / bound.max(f64::MIN_POSITIVE));
    };
    for t in 0..m {
        // op 0: residual over the plain input.
        let a: Vec<f64> = l.host_a[t * 2 * h..(t + 1) * 2 * h]
            .iter()
            .map(|v| f64::from(v.to_f32()))
            .collect();
        for r in 0..h {
            let (y, mag) = dot(&l.host_w[0], &a, r);
            let want = y + f64::from(l.host_r[0][t * h + r].to_f32());
            let got = f64::from(r1[t * h + r].to_f32());
            let bound = sum_bound(2 * h, mag, false) + (y.abs() + want.abs()) * ulp;
            note(0, (got - want).abs(), bound, &|| {
                format!("r1 token {t} row {r}: {got} vs {want}")
            });
        }
        // op 1: the norm of the GPU's r1, gate and up rows, SiLU.
        let xn = rmsnorm64(&r1[t * h..(t + 1) * h], &l.host_norm[0], offset);
        for j in 0..i {
            let (g, gmag) = dot(&l.host_w[1], &xn, j);
            let (u, umag) = dot(&l.host_w[1], &xn, i + j);
            let (eg, eu) = (
                sum_bound(h, gmag, true) + g.abs() * ulp,
                sum_bound(h, umag, true) + u.abs() * ulp,
            );
            let silu = g / (1.0 + (-g).exp());
            let want = silu * u;
            let got = f64::from(act[t * i + j].to_f32());
            let bound =
                1.1 * eg * (u.abs() + eu) + silu.abs() * eu + 2.0 * want.abs() * ulp + 1e-30;
            note(1, (got - want).abs(), bound, &|| {
                format!("act token {t} col {j}: {got} vs {want}")
            });
        }
        // op 2: residual over the GPU's act.
        let x: Vec<f64> = act[t * i..(t + 1) * i]
            .iter()
            .map(|v| f64::from(v.to_f32()))
            .collect();
        for r in 0..h {
            let (y, mag) = dot(&l.host_w[2], &x, r);
            let want = y + f64::from(l.host_r[1][t * h + r].to_f32());
            let got = f64::from(r2[t * h + r].to_f32());
            let bound = sum_bound(i, mag, false) + (y.abs() + want.abs()) * ulp;
            note(2, (got - want).abs(), bound, &|| {
                format!("r2 token {t} row {r}: {got} vs {want}")
            });
        }
        // op 3: fp32 logits over the norm of the GPU's r2.
        let xn = rmsnorm64(&r2[t * h..(t + 1) * h], &l.host_norm[1], offset);
        for r in 0..v {
            let (want, mag) = dot(&l.host_w[3], &xn, r);
            let got = f64::from(logits[t * v + r]);
            note(
                3,
                (got - want).abs(),
                sum_bound(h, mag, true) + 1e-30,
                &|| format!("logit token {t} row {r}: {got} vs {want}"),
            );
        }
    }
    eprintln!(
        "  {what}: residual / gate_up+silu / residual / norm+f32 at most {:.3} / {:.3} / {:.3} / {:.3} of their bounds",
        worst[0], worst[1], worst[2], worst[3]
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_a_decoder_layers_ops_match_their_references_and_their_bits_hold_over_every_schedule() {
    let d = device();
    let mut rng = seed("gpu_persistent_layer");
    for (path, kernels) in load_both_paths(&d) {
        let sms = kernels.sm_count();
        for (dims, m, offset) in [
            ((256usize, 320usize, 1000usize), 1usize, 0.0f32),
            ((384, 200, 517), 5, 1.0),
            ((256, 264, 300), 8, 0.0),
        ] {
            let mut l = layer(&kernels, dims, m, &mut rng);
            let base = run_layer(&kernels, &mut l, m, sms, 1, false, offset);
            let what = format!("{path} {dims:?} m {m} offset {offset}");
            check_layer(&l, m, &base, offset, &what);
            for (blocks, launches, rows) in [
                (sms, 3, false),
                (20.min(sms), 2, false),
                (16.min(sms), 1, false),
                (sms, 2, true),
                (20.min(sms), 1, true),
                (16.min(sms), 2, true),
                (1, 1, true),
            ] {
                let got = run_layer(&kernels, &mut l, m, blocks, launches, rows, offset);
                assert!(
                    got.0 == base.0 && got.1 == base.1 && got.2 == base.2 && got.3 == base.3,
                    "{what}: {blocks} blocks, {launches} launch(es), row-major {rows}: bits differ from one launch over all SMs on packed weights"
                );
            }
            eprintln!("  {what}: equal bits over 20 / 16 / 1 blocks, launch after launch, packed and row-major");
        }
    }
}
