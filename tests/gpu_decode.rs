//! The decode kernels (embedding, fused GEMV, paged decode attention) on a real GPU, against their
//! CPU references, on fresh random inputs at the Qwen3-4B shapes and at odd sizes.
//!
//! `#[ignore]`d: without a GPU they are listed as ignored, never passed; asked to run
//! (`--include-ignored`) without one they fail. Each test prints its input seed.
//! Checks: outputs within the stated tolerance of the float64 reference (attention: plus what its
//! bf16 probabilities allow, 2^-8 of the largest |v|); SASS (`auto`) and PTX
//! (`ptx-only`) bitwise equal; a token's result identical alone and in a batch of 8; launches
//! replayed from a CUDA graph equal to the eager ones (the attention merge counters reset).
//! Bandwidth of the Qwen3-4B projections is printed (measured with CUDA events; never asserted).

use aot_kernels::dispatch::{
    load_available, open_device, pdl_device, LoadedKernels, ModuleSource, OpenDevice, PdlMode,
    Policy,
};
use aot_kernels::ops::attention::{
    attention_decode, attention_decode_reference, attn_pipelined, attn_scratch_needs, attn_splits,
    qkv_head_reference, AttnDecode, AttnScratch, QkvShape, BLOCK_TOKENS, CLUSTER_SPLITS,
};
use aot_kernels::ops::compare::ulp_distance;
use aot_kernels::ops::embedding::{embedding, embedding_reference};
use aot_kernels::ops::gemv::{
    gemv, gemv_launch, gemv_reference, gemv_shape, gemv_with, norm_input_reference,
    norm_input_with_scales, residual_groups, residual_reference, silu_mul_reference, GemvInput,
    GemvOptions, GemvOutput, MAX_TOKENS, MODULE, TILE_ROWS,
};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn device() -> OpenDevice {
    open_device(0)
        .unwrap_or_else(|e| panic!("this GPU test needs a CUDA device and found none: {e}"))
}

fn kernels(d: &OpenDevice, policy: Policy) -> LoadedKernels {
    load_available(d, policy, &ModuleSource::registry()).unwrap()
}

fn rand_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

/// Fresh random inputs each run; `AOT_TEST_SEED=N` replays the inputs of a printed seed.
fn seed(test: &str) -> StdRng {
    let s: u64 = match std::env::var("AOT_TEST_SEED") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            panic!("AOT_TEST_SEED={v:?} is not a seed: give the number a test printed")
        }),
        Err(_) => rand::random(),
    };
    eprintln!("[{test}] input seed {s}");
    StdRng::seed_from_u64(s)
}

/// `got` is within `ulps` bf16 ulps of `want`, or within `abs` (for values that cancel to near 0,
/// where fp32 and float64 sums differ by more than an ulp of the tiny result).
fn check_bf16(what: &str, got: &[bf16], want: &[bf16], ulps: u32, abs: f32) {
    check_bf16_with(what, got, want, ulps, |_| abs);
}

/// One bf16 ulp at the magnitude of `x`.
fn bf16_ulp(x: f32) -> f32 {
    if x == 0.0 {
        return 0.0;
    }
    2f32.powi(x.abs().log2().floor() as i32 - 7)
}

/// Like [`check_bf16`] with a tolerance per element (e.g. an ulp of an operand that was rounded
/// before a cancelling add: a one-ulp flip there is many ulps of the small result).
fn check_bf16_with(what: &str, got: &[bf16], want: &[bf16], ulps: u32, abs: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0u32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let u = ulp_distance(g, w);
        if u > ulps && (g.to_f32() - w.to_f32()).abs() > abs(i) {
            panic!(
                "{what}[{i}]: got {g}, reference {w} ({u} ulp, abs tolerance {})",
                abs(i)
            );
        }
        if u > worst.0 {
            worst = (u, i);
        }
    }
    assert!(got.iter().any(|v| v.to_f32() != 0.0), "{what}: all zeros");
    eprintln!(
        "  {what}: {} values, max {} ulp (at {})",
        got.len(),
        worst.0,
        worst.1
    );
}

fn upload<T: cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).unwrap()
}

/// One GEMV case: weights, tokens and what to do with y.
#[derive(Clone, Copy, Debug)]
enum Epi {
    Bf16,
    F32,
    Residual,
    SiluMul,
}

struct GemvCase {
    name: &'static str,
    n: usize,
    k: usize,
    norm: bool,
    epi: Epi,
}

/// How far the sum of squares of some rows of a token's h may move because some of its elements
/// rounded to the neighbouring bf16: `sum |got^2 - want^2|` over `rows`.
fn rows_flip_bound(got_h: &[bf16], want_h: &[bf16], rows: std::ops::Range<usize>) -> f32 {
    rows.map(|r| (got_h[r].to_f32().powi(2) - want_h[r].to_f32().powi(2)).abs())
        .sum()
}

/// Runs one case for `m` tokens on `k` kernels; returns the outputs (bf16 bits or f32 bits as u32).
/// With the norm prologue, each row's sum of squares goes in as the engine's producers leave it:
/// one partial sum per 16 elements (`[groups][8]`), which the kernel adds up itself.
#[allow(clippy::too_many_arguments)]
fn run_gemv(
    kr: &LoadedKernels,
    c: &GemvCase,
    m: usize,
    w: &[bf16],
    x: &[bf16],
    nw: &[bf16],
    h0: &[bf16],
    overlap: bool,
) -> Vec<u32> {
    let options = GemvOptions::overlap_previous(overlap);
    let s = kr.stream();
    let dw = upload(s, w);
    let dx = upload(s, x);
    let groups = c.k.div_ceil(TILE_ROWS);
    let mut ssq_groups = vec![0.0f32; groups * MAX_TOKENS];
    for (t, row) in x.chunks(c.k).take(m).enumerate() {
        for (g, part) in row.chunks(TILE_ROWS).enumerate() {
            ssq_groups[g * MAX_TOKENS + t] = part.iter().map(|v| v.to_f32() * v.to_f32()).sum();
        }
    }
    let dssq = upload(s, &ssq_groups);
    let dnw = upload(s, nw);
    let input = if c.norm {
        GemvInput::Norm {
            h: dev(kr, &dx),
            ld_h: c.k,
            ssq: dev(kr, &dssq),
            ssq_groups: groups,
            weight: dev(kr, &dnw),
            eps: 1e-6,
            weight_offset: 0.0,
        }
    } else {
        GemvInput::Plain {
            x: dev(kr, &dx),
            ld_x: c.k,
        }
    };
    let out = match c.epi {
        Epi::Bf16 => {
            let mut o = s.alloc_zeros::<bf16>(m * c.n).unwrap();
            gemv_with(
                kr,
                dev(kr, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::Bf16 {
                    out: dev_mut(kr, &mut o),
                    ld_out: c.n,
                },
                options,
            )
            .unwrap();
            s.clone_dtoh(&o)
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as u32)
                .collect()
        }
        Epi::F32 => {
            let mut o = s.alloc_zeros::<f32>(m * c.n).unwrap();
            gemv_with(
                kr,
                dev(kr, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::F32 {
                    out: dev_mut(kr, &mut o),
                    ld_out: c.n,
                },
                options,
            )
            .unwrap();
            s.clone_dtoh(&o)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        }
        Epi::Residual => {
            let mut h = upload(s, &h0[..m * c.n]);
            let mut so = s
                .alloc_zeros::<f32>(residual_groups(c.n) * MAX_TOKENS)
                .unwrap();
            gemv_with(
                kr,
                dev(kr, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::Residual {
                    h: dev_mut(kr, &mut h),
                    ld_h: c.n,
                    ssq_out: dev_mut(kr, &mut so),
                },
                options,
            )
            .unwrap();
            let mut v: Vec<u32> = s
                .clone_dtoh(&h)
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as u32)
                .collect();
            v.extend(s.clone_dtoh(&so).unwrap().iter().map(|f| f.to_bits()));
            v
        }
        Epi::SiluMul => {
            let inter = c.n / 2;
            let mut o = s.alloc_zeros::<bf16>(m * inter).unwrap();
            gemv_with(
                kr,
                dev(kr, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::SiluMul {
                    out: dev_mut(kr, &mut o),
                    ld_out: inter,
                    intermediate: inter,
                },
                options,
            )
            .unwrap();
            s.clone_dtoh(&o)
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as u32)
                .collect()
        }
    };
    out
}

/// The norm prologue builds `bf16((w + offset) * bf16(h * scale))` from its own f32 sum of the
/// per-16 partial sums of squares and `rsqrtf`: within about 2e-6 (relative) of the exact scale
/// the reference uses (f32 partial sums of 16 squares and a sum of up to a few hundred of them:
/// ~30 f32 ulps of the sum, half that in the scale, plus rsqrtf's 2^-22). An element of
/// `h * scale` that lies that close to a bf16 rounding boundary may round either way. Per output,
/// the most such flips can move it: the sum over those elements of |weight| x the gap between the
/// two roundings, found by rounding with the scale made 1e-5 smaller and larger (five times the
/// estimate). Zero for all but about one element in a hundred, so a wrong kernel still fails by
/// orders of magnitude. (A band of 1e-6 around a scale from a sequential f32 sum of all k squares,
/// itself up to ~1e-5 off, let lm_head-like outputs miss by 1.1e-3 against a bound of 1e-3.)
#[allow(clippy::too_many_arguments)]
fn norm_flip_bound(
    w: &[bf16],
    n: usize,
    k: usize,
    x: &[bf16],
    ssq: &[f32],
    nw: &[bf16],
    eps: f32,
    offset: f32,
    m: usize,
) -> Vec<f64> {
    let input = |factor: f64| -> Vec<bf16> {
        let scales: Vec<f64> = ssq[..m]
            .iter()
            .map(|&s| factor / (f64::from(s) / k as f64 + f64::from(eps)).sqrt())
            .collect();
        norm_input_with_scales(&x[..m * k], k, &scales, nw, offset)
    };
    let (lo, hi) = (input(1.0 - 1e-5), input(1.0 + 1e-5));
    let mut bound = vec![0.0f64; m * n];
    for r in 0..m {
        for j in 0..k {
            let gap = f64::from((hi[r * k + j].to_f32() - lo[r * k + j].to_f32()).abs());
            if gap > 0.0 {
                for (i, b) in bound[r * n..(r + 1) * n].iter_mut().enumerate() {
                    *b += f64::from(w[i * k + j].to_f32().abs()) * gap;
                }
            }
        }
    }
    bound
}

fn bf16s(v: &[u32]) -> Vec<bf16> {
    v.iter().map(|&b| bf16::from_bits(b as u16)).collect()
}

/// Whether an overlapped launch of this shape takes a staged entry here (as `gemv_with` decides).
fn takes_staged(k: &LoadedKernels, n: usize, kk: usize, m: usize, norm: bool) -> bool {
    gemv_launch(k, n, kk, m, norm, GemvOptions::overlap_previous(true)).staged
}

/// A chain as the decode step runs it, each launch reading what the one before wrote: a plain
/// GEMV (9728 -> 4096) writes x; an overlapped one (o_proj-like, 4096 -> 2560) reads it after its
/// wait and adds into h with new sums of squares; an overlapped norm one (qkv-like, 2560 -> 6144)
/// normalises that h. x, h and the sums start as garbage, so a read before the producer ends would
/// show. The overlapped chain must equal the plain one bit for bit, five times over.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_overlapped_gemvs_read_what_the_kernel_before_wrote() {
    let mut rng = seed("gemv-overlap");
    let d = device();
    let k = kernels(&d, Policy::Auto);
    let s = k.stream();
    let (k1, n1, n2, n3, m) = (9728usize, 4096usize, 2560usize, 6144usize, 8usize);
    let w1 = upload(s, &rand_bf16(&mut rng, n1 * k1, (3.0 / k1 as f32).sqrt()));
    let w2 = upload(s, &rand_bf16(&mut rng, n2 * n1, (3.0 / n1 as f32).sqrt()));
    let w3 = upload(s, &rand_bf16(&mut rng, n3 * n2, (3.0 / n2 as f32).sqrt()));
    let nw = upload(s, &rand_bf16(&mut rng, n2, 1.0));
    let x0 = upload(s, &rand_bf16(&mut rng, m * k1, 1.5));
    let h_init = rand_bf16(&mut rng, m * n2, 2.0);
    let garbage_x = rand_bf16(&mut rng, m * n1, 7.0);
    let garbage_ssq: Vec<f32> = (0..residual_groups(n2) * MAX_TOKENS)
        .map(|i| 1.0 + i as f32)
        .collect();
    let staged = takes_staged(&k, n2, n1, m, false) && takes_staged(&k, n3, n2, m, true);
    eprintln!(
        "  overlap {} (capability {}.{}): staged launches {staged}",
        k.overlap_launch(MODULE),
        d.spec.capability.major,
        d.spec.capability.minor
    );
    if pdl_device(&d.spec) && PdlMode::from_env().unwrap() != PdlMode::Off {
        assert!(
            staged,
            "an sm_90+ GPU under auto must take the staged entries here"
        );
    }
    let run = |overlap: bool| -> (Vec<u16>, Vec<u16>) {
        let options = GemvOptions::overlap_previous(overlap);
        let mut x = upload(s, &garbage_x);
        let mut h = upload(s, &h_init);
        let mut ssq = upload(s, &garbage_ssq);
        let mut out = s.alloc_zeros::<bf16>(m * n3).unwrap();
        let input0 = GemvInput::Plain {
            x: dev(&k, &x0),
            ld_x: k1,
        };
        gemv(
            &k,
            dev(&k, &w1),
            n1,
            k1,
            m,
            &input0,
            GemvOutput::Bf16 {
                out: dev_mut(&k, &mut x),
                ld_out: n1,
            },
        )
        .unwrap();
        let input1 = GemvInput::Plain {
            x: dev(&k, &x),
            ld_x: n1,
        };
        let output1 = GemvOutput::Residual {
            h: dev_mut(&k, &mut h),
            ld_h: n2,
            ssq_out: dev_mut(&k, &mut ssq),
        };
        gemv_with(&k, dev(&k, &w2), n2, n1, m, &input1, output1, options).unwrap();
        let input2 = GemvInput::Norm {
            h: dev(&k, &h),
            ld_h: n2,
            ssq: dev(&k, &ssq),
            ssq_groups: residual_groups(n2),
            weight: dev(&k, &nw),
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let output2 = GemvOutput::Bf16 {
            out: dev_mut(&k, &mut out),
            ld_out: n3,
        };
        gemv_with(&k, dev(&k, &w3), n3, n2, m, &input2, output2, options).unwrap();
        let bits = |v: Vec<bf16>| v.iter().map(|b| b.to_bits()).collect::<Vec<u16>>();
        (
            bits(s.clone_dtoh(&h).unwrap()),
            bits(s.clone_dtoh(&out).unwrap()),
        )
    };
    let (want_h, want_out) = run(false);
    assert!(
        want_out.iter().any(|&b| b != 0),
        "the plain chain wrote nothing"
    );
    // The plain chain itself against the reference of its first two links (h from x0): the
    // residual sum of a correct x, not of the garbage.
    let x_ref: Vec<bf16> = gemv_reference(
        &s.clone_dtoh(&w1).unwrap(),
        n1,
        k1,
        &s.clone_dtoh(&x0).unwrap(),
        m,
    )
    .iter()
    .map(|&v| bf16::from_f64(v))
    .collect();
    let y_ref = gemv_reference(&s.clone_dtoh(&w2).unwrap(), n2, n1, &x_ref, m);
    let (h_ref, _) = residual_reference(&y_ref, &h_init, n2, m);
    let near = want_h
        .iter()
        .zip(&h_ref)
        .filter(|(&g, w)| {
            (bf16::from_bits(g).to_f32() - w.to_f32()).abs() <= 0.05 + 0.02 * w.to_f32().abs()
        })
        .count();
    assert!(
        near * 100 >= 99 * want_h.len(),
        "plain chain's h: {near} of {} near the reference",
        want_h.len()
    );
    for round in 0..5 {
        let (h, out) = run(true);
        assert_eq!(
            h, want_h,
            "round {round}: the overlapped o_proj-like launch differs"
        );
        assert_eq!(
            out, want_out,
            "round {round}: the overlapped qkv-like launch differs"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_epilogues_match_reference_batch_independent_sass_equals_ptx() {
    let mut rng = seed("gemv");
    let d = device();
    let sass = kernels(&d, Policy::Auto);
    let ptx = kernels(&d, Policy::PtxOnly);
    // Narrow launches whose blocks take two tiles at once (four warps a tile) on any GPU: 3 x SMs
    // + 1 tiles over 2 x SMs blocks, so blocks 0..=SMs have a pair and the rest one tile, with K
    // of 7 and of 4 chunks (slices of 2, 2, 2, 1 and some warps without one).
    let pair_tiles = 3 * sass.sm_count() + 1;
    let mut cases = vec![
        GemvCase {
            name: "narrow pairs, 3 x SMs + 1 tiles x 200, residual",
            n: pair_tiles * 16,
            k: 200,
            norm: false,
            epi: Epi::Residual,
        },
        GemvCase {
            name: "narrow pairs, 3 x SMs + 1 tiles x 104, norm f32",
            n: pair_tiles * 16 - 5,
            k: 104,
            norm: true,
            epi: Epi::F32,
        },
    ];
    let pair_shape = gemv_shape(cases[0].n, sass.sm_count());
    assert!(
        pair_shape.narrow && pair_shape.blocks < pair_tiles,
        "the pair cases must be narrow with fewer blocks than tiles: {pair_shape:?}"
    );
    cases.extend([
        GemvCase {
            name: "o_proj 2560x4096 bf16",
            n: 2560,
            k: 4096,
            norm: false,
            epi: Epi::Bf16,
        },
        GemvCase {
            name: "odd 200x72 bf16",
            n: 200,
            k: 72,
            norm: false,
            epi: Epi::Bf16,
        },
        GemvCase {
            // 384 tiles: more than two blocks an SM on an H200, so narrow blocks loop over tiles.
            name: "qkv 6144x2560 norm bf16",
            n: 6144,
            k: 2560,
            norm: true,
            epi: Epi::Bf16,
        },
        GemvCase {
            // Narrow with 768 chunks of 8 in the norm prologue: two passes of 512 (a thread's
            // chunks tid and tid + 256 of every row, then the next 512).
            name: "narrow 1024x6144 norm bf16",
            n: 1024,
            k: 6144,
            norm: true,
            epi: Epi::Bf16,
        },
        GemvCase {
            name: "lm_head-like 32768x2560 norm f32",
            n: 32768,
            k: 2560,
            norm: true,
            epi: Epi::F32,
        },
        GemvCase {
            name: "down 2560x9728 residual",
            n: 2560,
            k: 9728,
            norm: false,
            epi: Epi::Residual,
        },
        GemvCase {
            name: "odd 328x200 residual",
            n: 328,
            k: 200,
            norm: false,
            epi: Epi::Residual,
        },
        GemvCase {
            name: "gate_up 19456x2560 norm silu",
            n: 19456,
            k: 2560,
            norm: true,
            epi: Epi::SiluMul,
        },
        GemvCase {
            name: "odd gate_up 1728x320 norm silu",
            n: 1728,
            k: 320,
            norm: true,
            epi: Epi::SiluMul,
        },
        GemvCase {
            // MLP width 184: not a multiple of 16, the last gate/up group is partial.
            name: "fixture gate_up 368x120 norm silu",
            n: 368,
            k: 120,
            norm: true,
            epi: Epi::SiluMul,
        },
    ]);
    // Whether overlapped launches stage here: on Hopper and later, whose auto images are sm_90+.
    let capability = d.spec.capability;
    assert_eq!(
        sass.overlap_launch(MODULE),
        pdl_device(&d.spec) && PdlMode::from_env().unwrap() != PdlMode::Off,
        "overlap on an sm_{}{} GPU",
        capability.major,
        capability.minor
    );
    assert!(
        !ptx.overlap_launch(MODULE),
        "the compute_80 PTX has no griddepcontrol.wait"
    );
    let mut staged_runs = 0;
    // Wide norm launches take the all-rows prologue from NORM_ALL_ROWS_MIN (4) rows: 3 and 4 sit
    // either side, and the alone-versus-batched check below compares the two prologues' bits.
    for c in &cases {
        for m in [1usize, 3, 4, 8] {
            let w = rand_bf16(&mut rng, c.n * c.k, (3.0 / c.k as f32).sqrt());
            let x = rand_bf16(&mut rng, m * c.k, 1.5);
            let nw = rand_bf16(&mut rng, c.k, 1.0);
            // The reference's sums of squares are exact (float64, rounded once); the kernel adds
            // per-16 f32 partial sums (see `run_gemv`), a few f32 ulps away (`norm_flip_bound`).
            let ssq: Vec<f32> = x
                .chunks(c.k)
                .map(|r| r.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum::<f64>() as f32)
                .collect();
            let h0 = rand_bf16(&mut rng, m * c.n, 2.0);
            let got = run_gemv(&sass, c, m, &w, &x, &nw, &h0, false);
            let got_ptx = run_gemv(&ptx, c, m, &w, &x, &nw, &h0, false);
            // Overlapped (the staged narrow entries, launched programmatically where the image
            // allows: an sm_90+ GPU under auto): the same sums in the same order, the same bits.
            let staged = run_gemv(&sass, c, m, &w, &x, &nw, &h0, true);
            assert_eq!(
                got, staged,
                "{} m={m}: the overlapped launch differs",
                c.name
            );
            if takes_staged(&sass, c.n, c.k, m, c.norm) {
                staged_runs += 1;
            }
            assert_eq!(got, got_ptx, "{} m={m}: SASS and PTX differ", c.name);

            let xin = if c.norm {
                norm_input_reference(&x, c.k, &ssq, &nw, 1e-6, 0.0)
            } else {
                x.clone()
            };
            let y = gemv_reference(&w, c.n, c.k, &xin, m);
            // fp32 accumulation against float64: relative error ~1e-6 of sum |w x| (about 1 for these scales).
            let abs = 2e-3;
            let label = format!("{} m={m}", c.name);
            // With the norm prologue: what the inputs that may round either way can move each
            // output (see `norm_flip_bound`).
            let flips = if c.norm {
                norm_flip_bound(&w, c.n, c.k, &x, &ssq, &nw, 1e-6, 0.0, m)
            } else {
                vec![0.0; m * c.n]
            };
            match c.epi {
                Epi::Bf16 => check_bf16_with(
                    &label,
                    &bf16s(&got),
                    &y.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
                    1,
                    |i| abs + flips[i] as f32,
                ),
                Epi::F32 => {
                    // fp32 accumulation: 1e-3, plus the input flips.
                    let (mut worst, mut flip_sum) = (0.0f64, 0.0f64);
                    for (i, (&g, &r)) in got.iter().zip(&y).enumerate() {
                        let err = (f64::from(f32::from_bits(g)) - r).abs();
                        assert!(
                            err < 1e-3 + flips[i],
                            "{label}[{i}]: {err:.3e}, input flips allow {:.3e}",
                            flips[i]
                        );
                        worst = worst.max(err);
                        flip_sum += flips[i];
                    }
                    eprintln!(
                        "  {label}: max |f32 - f64| = {worst:.2e} (input flips allow {:.2e} on average)",
                        flip_sum / got.len() as f64
                    );
                }
                Epi::Residual => {
                    let (want_h, want_ssq) = residual_reference(&y, &h0, c.n, m);
                    // bf16(bf16(y) + h): a one-ulp flip in rounding y, then the sum's own rounding
                    // going the other way: up to an ulp of y plus an ulp of the result.
                    check_bf16_with(&label, &bf16s(&got[..m * c.n]), &want_h, 1, |i| {
                        abs.max(bf16_ulp(y[i] as f32) + bf16_ulp(want_h[i].to_f32()))
                    });
                    // The sums of squares are of the h the kernel wrote: exact in float64 from its
                    // output, against the kernel's fp32 sum of 16 squares. (Against the reference's
                    // h they may differ by far more: one h that rounds the other way by an ulp moves
                    // its square by 2 |h| ulp, 0.25 at |h| = 4; on the H200 that failed the old
                    // bound of 1e-3 relative + 0.05 with seed 10888643568556379875.)
                    let got_h = bf16s(&got[..m * c.n]);
                    for g in 0..residual_groups(c.n) {
                        for t in 0..m {
                            let got_s = f32::from_bits(got[m * c.n + g * MAX_TOKENS + t]);
                            let rows = g * TILE_ROWS..((g + 1) * TILE_ROWS).min(c.n);
                            let exact: f64 = rows
                                .clone()
                                .map(|r| f64::from(got_h[t * c.n + r].to_f32()).powi(2))
                                .sum();
                            assert!(
                                (f64::from(got_s) - exact).abs() <= 1e-5 * exact + 1e-6,
                                "{label}: ssq[{g}][{t}] {got_s} vs {exact} from its own h"
                            );
                            // And near the reference's (the h check above bounds the flips).
                            let want_s = want_ssq[g * MAX_TOKENS + t];
                            let flips: f32 =
                                rows_flip_bound(&got_h[t * c.n..], &want_h[t * c.n..], rows);
                            assert!(
                                (got_s - want_s).abs() <= 1e-3 * want_s.abs() + flips,
                                "{label}: ssq[{g}][{t}] {got_s} vs reference {want_s} (h flips allow {flips})"
                            );
                        }
                    }
                }
                // bf16(bf16(silu(bf16(gate))) * bf16(up)): a flip in rounding gate moves the
                // activation by up to two of its ulps, a flip in up by one, and the product is
                // rounded once more: up to about four ulps of the result.
                Epi::SiluMul => check_bf16(
                    &label,
                    &bf16s(&got),
                    &silu_mul_reference(&y, c.n / 2, m),
                    4,
                    abs,
                ),
            }
            // Token j's result alone equals its result in the batch (residual output: h rows only).
            if m > 1 {
                let j = m - 1;
                let alone = run_gemv(&sass, c, 1, &w, &x[j * c.k..], &nw, &h0[j * c.n..], false);
                let width = match c.epi {
                    Epi::SiluMul => c.n / 2,
                    _ => c.n,
                };
                assert_eq!(
                    &alone[..width],
                    &got[j * width..(j + 1) * width],
                    "{label}: token {j} alone differs from batched"
                );
            }
        }
    }
    if sass.overlap_launch(MODULE) {
        eprintln!("  {staged_runs} launches took the staged entries");
        assert!(staged_runs > 0, "no case took the staged entries");
    }
}

struct AttnDevice {
    m: usize,
    qkv: CudaSlice<bf16>,
    q_norm: CudaSlice<bf16>,
    k_norm: CudaSlice<bf16>,
    cos_sin: CudaSlice<f32>,
    table: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    kc: CudaSlice<bf16>,
    vc: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    ws_ml: CudaSlice<f32>,
    ws_o: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

/// Inputs of one fused decode-attention launch: `m` rows, row r at position `pos[r]` of its own
/// slot, whose earlier positions hold random keys and values in a shuffled block table.
struct AttnInputs {
    q_heads: usize,
    kv_heads: usize,
    hd: usize,
    pos: Vec<usize>,
    ld_bt: usize,
    ids: Vec<i32>,
    slots: Vec<i32>,
    kc: Vec<bf16>,
    vc: Vec<bf16>,
    qkv: Vec<bf16>,
    q_norm: Vec<bf16>,
    k_norm: Vec<bf16>,
    cos_sin: Vec<f32>,
    max_pos: usize,
}

impl AttnInputs {
    fn new(rng: &mut StdRng, q_heads: usize, kv_heads: usize, hd: usize, pos: Vec<usize>) -> Self {
        let m = pos.len();
        let ld_bt = pos
            .iter()
            .map(|p| (p + 1).div_ceil(BLOCK_TOKENS))
            .max()
            .unwrap()
            + 1;
        let blocks = m * ld_bt;
        let block_elems = kv_heads * BLOCK_TOKENS * hd;
        let mut ids: Vec<i32> = (0..blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.gen_range(0..=i));
        }
        let max_pos = ld_bt * BLOCK_TOKENS;
        let mut inp = AttnInputs {
            q_heads,
            kv_heads,
            hd,
            ld_bt,
            ids,
            slots: (0..m as i32).rev().collect(),
            kc: rand_bf16(rng, blocks * block_elems, 1.0),
            vc: rand_bf16(rng, blocks * block_elems, 1.0),
            qkv: rand_bf16(rng, m * (q_heads + 2 * kv_heads) * hd, 2.0),
            q_norm: rand_bf16(rng, hd, 1.2),
            k_norm: rand_bf16(rng, hd, 1.2),
            cos_sin: cos_sin_cache(max_pos, hd, 1e6),
            max_pos,
            pos,
        };
        // Cache positions past a row's new token hold +inf: the kernel must never let them into
        // a score or a product (a 16-token block past its last token is masked and zero-filled;
        // 0 x inf would be NaN). Checked bit for bit below, since inf == inf.
        for r in 0..m {
            for t in inp.pos[r] + 1..ld_bt * BLOCK_TOKENS {
                for kv in 0..kv_heads {
                    let at = inp.at(r, t, kv);
                    inp.kc[at..at + hd].fill(bf16::INFINITY);
                    inp.vc[at..at + hd].fill(bf16::INFINITY);
                }
            }
        }
        inp
    }

    /// Device buffers for rows `rows` (a subset, in that order).
    fn upload(&self, kr: &LoadedKernels, rows: &[usize]) -> AttnDevice {
        let s = kr.stream();
        let w = (self.q_heads + 2 * self.kv_heads) * self.hd;
        let m = rows.len();
        let qkv: Vec<bf16> = rows
            .iter()
            .flat_map(|&r| self.qkv[r * w..(r + 1) * w].to_vec())
            .collect();
        let slots: Vec<i32> = rows.iter().map(|&r| self.slots[r]).collect();
        let pos: Vec<i32> = rows.iter().map(|&r| self.pos[r] as i32).collect();
        let (a, b, c) = attn_scratch_needs(m, self.q_heads, self.kv_heads, self.hd);
        AttnDevice {
            m,
            qkv: upload(s, &qkv),
            q_norm: upload(s, &self.q_norm),
            k_norm: upload(s, &self.k_norm),
            cos_sin: upload(s, &self.cos_sin),
            table: upload(s, &self.ids),
            slots: upload(s, &slots),
            pos: upload(s, &pos),
            kc: upload(s, &self.kc),
            vc: upload(s, &self.vc),
            out: s.alloc_zeros::<bf16>(m * self.q_heads * self.hd).unwrap(),
            ws_ml: s.alloc_zeros::<f32>(a).unwrap(),
            ws_o: s.alloc_zeros::<f32>(b).unwrap(),
            counters: s.alloc_zeros::<u32>(c).unwrap(),
        }
    }

    fn launch(
        &self,
        kr: &LoadedKernels,
        d: &mut AttnDevice,
        grid: usize,
        pipelined: bool,
        cluster: bool,
        overlap_previous: bool,
    ) {
        attention_decode(
            kr,
            AttnDecode {
                qkv: dev(kr, &d.qkv),
                ld_qkv: (self.q_heads + 2 * self.kv_heads) * self.hd,
                q_norm: dev(kr, &d.q_norm),
                k_norm: dev(kr, &d.k_norm),
                eps: 1e-6,
                weight_offset: 0.0,
                cos_sin: dev(kr, &d.cos_sin),
                max_pos: self.max_pos,
                k_cache: dev_mut(kr, &mut d.kc),
                v_cache: dev_mut(kr, &mut d.vc),
                block_table: dev(kr, &d.table),
                ld_bt: self.ld_bt,
                slot_of_row: dev(kr, &d.slots),
                positions: dev(kr, &d.pos),
                out: dev_mut(kr, &mut d.out),
                m: d.m,
                q_heads: self.q_heads,
                kv_heads: self.kv_heads,
                head_dim: self.hd,
                grid_splits: grid,
                pipelined,
                cluster,
                overlap_previous,
            },
            &mut AttnScratch {
                ws_ml: dev_mut(kr, &mut d.ws_ml),
                ws_o: dev_mut(kr, &mut d.ws_o),
                counters: dev_mut(kr, &mut d.counters),
            },
        )
        .unwrap();
    }

    /// Runs rows `rows` once, through the pipelined entry or not; returns (out, k cache, v cache).
    fn run(
        &self,
        kr: &LoadedKernels,
        rows: &[usize],
        grid: usize,
        pipelined: bool,
    ) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        self.run_with(kr, rows, grid, pipelined, false)
    }

    /// [`Self::run`], the splits merged in clusters or not.
    fn run_with(
        &self,
        kr: &LoadedKernels,
        rows: &[usize],
        grid: usize,
        pipelined: bool,
        cluster: bool,
    ) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        let s = kr.stream();
        let mut d = self.upload(kr, rows);
        // Programmatic where the image allows it, the cache read before the wait, as the engine
        // launches it (after a copy here, so nothing overlaps).
        self.launch(kr, &mut d, grid, pipelined, cluster, true);
        assert!(
            s.clone_dtoh(&d.counters).unwrap().iter().all(|&c| c == 0),
            "merge counters left non-zero"
        );
        (
            s.clone_dtoh(&d.out).unwrap(),
            s.clone_dtoh(&d.kc).unwrap(),
            s.clone_dtoh(&d.vc).unwrap(),
        )
    }

    /// Where position `p` of row `r` lives in a cache.
    fn at(&self, r: usize, p: usize, kv: usize) -> usize {
        let blk = self.ids[self.slots[r] as usize * self.ld_bt + p / BLOCK_TOKENS] as usize;
        ((blk * self.kv_heads + kv) * BLOCK_TOKENS + p % BLOCK_TOKENS) * self.hd
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_decode_attention_with_qk_norm_rope_and_cache_write_matches_reference() {
    let mut rng = seed("attention");
    let d = device();
    let sass = kernels(&d, Policy::Auto);
    let ptx = kernels(&d, Policy::PtxOnly);
    let mut clusters_checked = 0;
    for (q_heads, kv_heads, hd, ctxs) in [
        (
            32usize,
            8usize,
            128usize,
            vec![1usize, 15, 16, 17, 100, 1024, 1100, 4097],
        ),
        (16, 2, 256, vec![5, 64, 65, 777, 2048, 3, 300, 1]),
        (4, 2, 64, vec![33, 1, 2000, 48, 16, 7, 130, 513]),
        (8, 8, 64, vec![600]),
        // Every other entry (decode_entry): fixed groups 2, 4, 8 at each head dimension and the
        // any-group kernel with group 3 (128, 256; at 64 the 8/8 case above runs it with group
        // 1), with one and several splits (splits are ctx / 128 rounded down: each row below has a
        // context of at least 256, so the last block's merge runs for every entry).
        (16, 8, 128, vec![1, 130, 700]),
        (16, 2, 128, vec![300, 17]),
        (6, 2, 128, vec![300, 5]),
        (8, 2, 64, vec![290, 40]),
        (16, 2, 64, vec![257, 1]),
        (4, 2, 256, vec![300, 64]),
        (8, 2, 256, vec![400]),
        (3, 1, 256, vec![390, 2]),
    ] {
        let pos: Vec<usize> = ctxs.iter().map(|c| c - 1).collect();
        let inp = AttnInputs::new(&mut rng, q_heads, kv_heads, hd, pos.clone());
        let m = pos.len();
        let grid = ctxs.iter().map(|&c| attn_splits(c).0).max().unwrap();
        let all: Vec<usize> = (0..m).collect();
        let (out, kc, vc) = inp.run(&sass, &all, grid, true);
        let (out_ptx, kc_ptx, vc_ptx) = inp.run(&ptx, &all, grid, true);
        assert_eq!(
            (&out, &kc, &vc),
            (&out_ptx, &kc_ptx, &vc_ptx),
            "SASS and PTX differ"
        );
        // The rows whose splits fit a cluster, merged in clusters (sm_90+ code: the SASS path on
        // this GPU): the same bits as the workspace merge, pipelined (and at 256 its one kind).
        let fit: Vec<usize> = (0..m)
            .filter(|&r| attn_splits(ctxs[r]).0 <= CLUSTER_SPLITS)
            .collect();
        // (`cluster_fits`: sm_90+ code, a 9.0+ GPU, and the driver places such a cluster.)
        let fits = aot_kernels::ops::attention::cluster_fits(&sass, hd, q_heads / kv_heads, true);
        if fits && !fit.is_empty() {
            let plain = inp.run(&sass, &fit, grid.min(CLUSTER_SPLITS), true);
            let clustered = inp.run_with(&sass, &fit, CLUSTER_SPLITS, true, true);
            assert_eq!(
                clustered, plain,
                "{q_heads}/{kv_heads}x{hd} rows {fit:?}: the cluster merge differs"
            );
            clusters_checked += fit.len();
        }
        // The entries without the pipeline (head dimensions 64 and 128; 256 has one kind) must
        // give the same bits: the same sums in the same order, only the loads move.
        for (kr, path) in [(&sass, "SASS"), (&ptx, "PTX")] {
            assert_eq!(
                inp.run(kr, &all, grid, false),
                (out.clone(), kc.clone(), vc.clone()),
                "{q_heads}/{kv_heads}x{hd} {path}: pipelined and not differ"
            );
        }
        let shape = QkvShape {
            q_heads,
            kv_heads,
            head_dim: hd,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let w = (q_heads + 2 * kv_heads) * hd;
        for (r, &p) in pos.iter().enumerate() {
            let raw = |head: usize| -> Vec<f64> {
                inp.qkv[r * w + head * hd..r * w + (head + 1) * hd]
                    .iter()
                    .map(|v| f64::from(v.to_f32()))
                    .collect()
            };
            let cs = &inp.cos_sin[p * hd..(p + 1) * hd];
            let label = format!(
                "{q_heads}/{kv_heads}x{hd} pos {p} ({} splits)",
                attn_splits(p + 1).0
            );
            // The new key and value in the cache; everything else in the cache untouched.
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for t in 0..=p {
                for kv in 0..kv_heads {
                    let at = inp.at(r, t, kv);
                    if t == p {
                        let want_k =
                            qkv_head_reference(&raw(q_heads + kv), Some(&inp.k_norm), cs, &shape);
                        let want_v =
                            qkv_head_reference(&raw(q_heads + kv_heads + kv), None, cs, &shape);
                        check_bf16(
                            &format!("{label} new key"),
                            &kc[at..at + hd],
                            &want_k,
                            2,
                            2e-2,
                        );
                        assert_eq!(&vc[at..at + hd], &want_v[..], "{label}: new value");
                        keys.extend(want_k);
                        values.extend(want_v);
                    } else {
                        assert_eq!(
                            &kc[at..at + hd],
                            &inp.kc[at..at + hd],
                            "{label}: key {t} changed"
                        );
                        keys.extend_from_slice(&inp.kc[at..at + hd]);
                        values.extend_from_slice(&inp.vc[at..at + hd]);
                    }
                }
            }
            let q: Vec<bf16> = (0..q_heads)
                .flat_map(|h| qkv_head_reference(&raw(h), Some(&inp.q_norm), cs, &shape))
                .collect();
            let want = attention_decode_reference(&q, &keys, &values, p + 1, q_heads, kv_heads, hd);
            // The kernel multiplies V by the probabilities rounded to bf16 (round to nearest with an
            // 8-bit significand: relative error at most 2^-8 each) and divides by the sum of the
            // unrounded ones, so an output may move by up to 2^-8 x the largest |v| of its KV head
            // beyond the fp32-vs-float64 slack.
            let v_max: Vec<f32> = (0..kv_heads)
                .map(|kv| {
                    (0..=p)
                        .flat_map(|t| &values[(t * kv_heads + kv) * hd..][..hd])
                        .map(|v| v.to_f32().abs())
                        .fold(0.0f32, f32::max)
                })
                .collect();
            let group = q_heads / kv_heads;
            check_bf16_with(
                &label,
                &out[r * q_heads * hd..(r + 1) * q_heads * hd],
                &want,
                2,
                |i| 2e-3 + v_max[i / hd / group] * 2f32.powi(-8),
            );
            if m > 1 {
                let (alone, _, _) = inp.run(&sass, &[r], attn_splits(p + 1).0, true);
                assert_eq!(
                    alone,
                    out[r * q_heads * hd..(r + 1) * q_heads * hd],
                    "{label}: alone differs from batched"
                );
            }
        }
    }
    // The compute_80 PTX has no cluster code: ptx-only never takes the cluster entries.
    assert!(!ptx.cluster_launch(aot_kernels::ops::attention::MODULE));
    // A GPU of 64 SMs or more with clusters (the H200: GPCs of 16 or more SMs) places clusters of
    // 8: there the merge must have been checked.
    if sass.cluster_launch(aot_kernels::ops::attention::MODULE) && sass.sm_count() >= 64 {
        assert!(clusters_checked > 0, "no row took the cluster merge");
    }
    eprintln!("cluster merge equal to the workspace merge on {clusters_checked} rows");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_embedding_gathers_rows_and_sums_squares() {
    let mut rng = seed("embedding");
    let d = device();
    let kr = kernels(&d, Policy::Auto);
    let s = kr.stream();
    let (vocab, hidden) = (1000, 2560);
    let table = rand_bf16(&mut rng, vocab * hidden, 1.0);
    let tokens: Vec<u32> = (0..5).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let (dt, dtok) = (
        upload(s, &table),
        upload(s, &tokens.iter().map(|&t| t as i32).collect::<Vec<_>>()),
    );
    let mut out = s.alloc_zeros::<bf16>(5 * hidden).unwrap();
    let mut ssq = s.alloc_zeros::<f32>(5).unwrap();
    embedding(
        &kr,
        dev_mut(&kr, &mut out),
        hidden,
        Some(dev_mut(&kr, &mut ssq)),
        dev(&kr, &dt),
        vocab,
        hidden,
        dev(&kr, &dtok),
        5,
    )
    .unwrap();
    let (want, want_ssq) = embedding_reference(&table, hidden, &tokens);
    assert_eq!(s.clone_dtoh(&out).unwrap(), want, "rows are copied exactly");
    for (g, w) in s.clone_dtoh(&ssq).unwrap().iter().zip(&want_ssq) {
        assert!((g - w).abs() <= 1e-4 * w, "{g} vs {w}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_graph_replay_equals_eager_and_bandwidth() {
    let mut rng = seed("gemv_graph");
    let d = device();
    let kr = kernels(&d, Policy::Auto);
    let s = kr.stream();
    // down_proj shape (narrow: the warps of a block split K).
    let (n, k, m) = (2560usize, 9728usize, 4usize);
    let w = upload(s, &rand_bf16(&mut rng, n * k, 0.02));
    let x = upload(s, &rand_bf16(&mut rng, m * k, 1.0));
    let mut out = s.alloc_zeros::<bf16>(m * n).unwrap();
    let launch = |out: &mut CudaSlice<bf16>| {
        gemv(
            &kr,
            dev(&kr, &w),
            n,
            k,
            m,
            &GemvInput::Plain {
                x: dev(&kr, &x),
                ld_x: k,
            },
            GemvOutput::Bf16 {
                out: dev_mut(&kr, out),
                ld_out: n,
            },
        )
        .unwrap();
    };
    launch(&mut out);
    let eager = s.clone_dtoh(&out).unwrap();
    s.memset_zeros(&mut out).unwrap();
    s.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    launch(&mut out);
    let graph = s
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .unwrap();
    for _ in 0..3 {
        graph.launch().unwrap();
        assert_eq!(
            s.clone_dtoh(&out).unwrap(),
            eager,
            "graph replay differs from the eager launch"
        );
    }

    // Bandwidth of the Qwen3-4B decode projections (printed only).
    for (name, n, k, norm) in [
        ("qkv 6144x2560", 6144usize, 2560usize, true),
        ("o_proj 2560x4096", 2560, 4096, false),
        ("gate_up 19456x2560", 19456, 2560, true),
        ("down 2560x9728", 2560, 9728, false),
        ("lm_head 151936x2560", 151_936, 2560, true),
    ] {
        let w = upload(s, &rand_bf16(&mut rng, n * k, 0.02));
        let x = upload(s, &rand_bf16(&mut rng, 8 * k, 1.0));
        let ssq = upload(s, &[k as f32; 8]);
        let nw = upload(s, &vec![bf16::ONE; k]);
        let mut out = s.alloc_zeros::<bf16>(8 * n).unwrap();
        for m in [1usize, 8] {
            let input = if norm {
                GemvInput::Norm {
                    h: dev(&kr, &x),
                    ld_h: k,
                    ssq: dev(&kr, &ssq),
                    ssq_groups: 1,
                    weight: dev(&kr, &nw),
                    eps: 1e-6,
                    weight_offset: 0.0,
                }
            } else {
                GemvInput::Plain {
                    x: dev(&kr, &x),
                    ld_x: k,
                }
            };
            let iters = 50;
            let start = aot_kernels::device::timing_event(kr.context()).unwrap();
            let stop = aot_kernels::device::timing_event(kr.context()).unwrap();
            for i in 0..iters + 5 {
                if i == 5 {
                    start.record(s).unwrap();
                }
                gemv(
                    &kr,
                    dev(&kr, &w),
                    n,
                    k,
                    m,
                    &input,
                    GemvOutput::Bf16 {
                        out: dev_mut(&kr, &mut out),
                        ld_out: n,
                    },
                )
                .unwrap();
            }
            stop.record(s).unwrap();
            stop.synchronize().unwrap();
            let ms = start.elapsed_ms(&stop).unwrap() / iters as f32;
            let gbs = (n * k * 2) as f64 / (f64::from(ms) * 1e-3) / 1e9;
            eprintln!(
                "  bandwidth {name} m={m}: {:.1} us, {gbs:.0} GB/s",
                ms * 1000.0
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_stream_read_reads_every_word() {
    // Both readers, every policy: a word, a tail, fewer bulk chunks (16 KiB) than blocks, some
    // chunks plus a tail that is not a whole chunk, 16 MiB, and nine chunks a block and a tail
    // (each block's ring of four slots then taken more than twice over, every parity used). The
    // bulk reader folds its last block's tail with loads, and under ptx-only (compute_80 PTX)
    // folds everything with loads.
    use aot_kernels::ops::stream_read::{stream_read, xor_reference, Reader};
    let mut rng = seed("stream_read");
    let d = device();
    for policy in [Policy::Auto, Policy::PtxOnly] {
        let kr = kernels(&d, policy);
        let s = kr.stream();
        for reader in Reader::ALL {
            let blocks = reader.blocks(kr.sm_count());
            let ring_reuse = 4096 * Reader::Bulk.blocks(kr.sm_count()) * 9 + 12;
            for words in [
                4usize,
                4 * 1001,
                4096 * 7 + 12,
                4096 * 1000 + 4 * 77,
                1 << 22,
                ring_reuse,
            ] {
                let data: Vec<u32> = (0..words).map(|_| rng.gen()).collect();
                let dd = upload(s, &data);
                let mut out = s.alloc_zeros::<u32>(blocks).unwrap();
                stream_read(&kr, reader, dev(&kr, &dd), dev_mut(&kr, &mut out)).unwrap();
                let got = s.clone_dtoh(&out).unwrap().iter().fold(0, |a, &b| a ^ b);
                assert_eq!(
                    got,
                    xor_reference(&data),
                    "{policy} {reader:?}: {words} words"
                );
            }
            let dd = upload(s, &[1u32, 2, 3]);
            let mut out = s.alloc_zeros::<u32>(blocks).unwrap();
            let err = stream_read(&kr, reader, dev(&kr, &dd), dev_mut(&kr, &mut out))
                .unwrap_err()
                .to_string();
            assert!(err.contains("multiple of 4"), "{err}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_timings() {
    // Qwen3-4B attention (32/8 heads of 128) over contexts of 300 and 1024 tokens, 1 and 8 rows;
    // printed only (microseconds per launch, and the KV bytes read over that time).
    let mut rng = seed("attention_timings");
    let d = device();
    let kr = kernels(&d, Policy::Auto);
    let s = kr.stream();
    let (q_heads, kv_heads, hd) = (32usize, 8usize, 128usize);
    for (m, ctx, pipelined) in [1usize, 8]
        .into_iter()
        .flat_map(|m| [300usize, 1024].map(|ctx| (m, ctx)))
        .flat_map(|(m, ctx)| [true, false].map(|p| (m, ctx, p)))
    {
        let inp = AttnInputs::new(&mut rng, q_heads, kv_heads, hd, vec![ctx - 1; m]);
        let grid = attn_splits(ctx).0;
        let rows: Vec<usize> = (0..m).collect();
        let mut dv = inp.upload(&kr, &rows);
        // Not overlapped: back to back, each launch would overlap the one before it and the
        // figures would not be one launch's.
        let mut launch = |_: &mut ()| inp.launch(&kr, &mut dv, grid, pipelined, false, false);
        let mut out = ();
        for _ in 0..5 {
            launch(&mut out);
        }
        let iters = 50;
        let (start, stop) = (
            aot_kernels::device::timing_event(kr.context()).unwrap(),
            aot_kernels::device::timing_event(kr.context()).unwrap(),
        );
        start.record(s).unwrap();
        for _ in 0..iters {
            launch(&mut out);
        }
        stop.record(s).unwrap();
        stop.synchronize().unwrap();
        let us = start.elapsed_ms(&stop).unwrap() * 1000.0 / iters as f32;
        let bytes = (m * ctx * kv_heads * hd * 2 * 2) as f64;
        eprintln!(
            "  attention m={m} ctx={ctx} ({grid} splits, pipelined {pipelined}, attn_pipelined says {}): {us:.1} us, {:.0} GB/s of KV",
            attn_pipelined(hd, kv_heads, m * grid, d.sm_count),
            bytes / (f64::from(us) * 1e-6) / 1e9
        );
    }
}
