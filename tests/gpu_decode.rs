//! The decode kernels (embedding, fused GEMV, paged decode attention) on a real GPU, against their
//! CPU references, on fresh random inputs at the Qwen3-4B shapes and at odd sizes.
//!
//! `#[ignore]`d: without a GPU they are listed as ignored, never passed; asked to run
//! (`--include-ignored`) without one they fail. Each test prints its input seed.
//! One claim a test: outputs within the stated tolerance of the float64 reference (attention: plus
//! what its bf16 probabilities allow, 2^-8 of the largest |v|); SASS (`auto`) and PTX
//! (`ptx-only`) bitwise equal; a token's result identical alone and in a batch of 8; launches
//! replayed from a CUDA graph equal to the eager ones (the attention merge counters reset).
//! Bandwidth of the Qwen3-4B projections is printed (measured with CUDA events; never asserted).

mod gpu_common;

use aot_kernels::dispatch::{pdl_device, LoadedKernels, OpenDevice, PdlMode, Policy};
use aot_kernels::ops::attention::{
    attention_decode, attention_decode_reference, attn_pipelined, attn_scratch_needs, attn_splits,
    cluster_fits, qkv_head_reference, AttnDecode, AttnScratch, QkvShape, BLOCK_TOKENS,
    CLUSTER_SPLITS,
};
use aot_kernels::ops::compare::ulp_distance;
use aot_kernels::ops::embedding::{embedding, embedding_reference};
use aot_kernels::ops::gemv::{
    gemv, gemv_launch, gemv_reference, gemv_shape, gemv_with, norm_input_reference,
    norm_input_with_scales, residual_groups, residual_reference, silu_mul_reference, GemvInput,
    GemvOptions, GemvOutput, GemvPart, OutputNorm, MAX_TOKENS, MODULE, TILE_ROWS,
};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut};
use cudarc::driver::{CudaSlice, CudaStream};
use gpu_common::{device, load, load_auto, random_bf16, seed};
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::Arc;

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

/// The weight of the norm a residual-norm case applies (as `(1 + w)`): fixed values of both signs
/// around zero, as zero-centred norms hold.
fn out_norm_weight(n: usize) -> Vec<bf16> {
    (0..n)
        .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0))
        .collect()
}
const OUT_NORM_EPS: f32 = 1e-6;

fn upload<T: cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).unwrap()
}

/// One GEMV case: weights, tokens and what to do with y.
#[derive(Clone, Copy, Debug)]
enum Epi {
    Bf16,
    F32,
    Residual,
    /// Residual, then the RMSNorm of the new h by the launch's last block: outputs `[normed | h |
    /// ssq]`.
    ResidualNorm,
    SiluMul,
    /// Bf16 into one output per part (these widths); gathered back into `[m][n]`.
    Parts(&'static [usize]),
}

#[derive(Clone, Copy)]
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

/// Runs one case for `m` tokens on `kernels`; returns the outputs (bf16 bits or f32 bits as u32).
/// With the norm prologue, each row's sum of squares goes in as the engine's producers leave it:
/// one partial sum per 16 elements (`[groups][8]`), which the kernel adds up itself.
#[allow(clippy::too_many_arguments)]
fn run_gemv(
    kernels: &LoadedKernels,
    c: &GemvCase,
    m: usize,
    w: &[bf16],
    x: &[bf16],
    nw: &[bf16],
    h0: &[bf16],
    overlap: bool,
) -> Vec<u32> {
    let options = GemvOptions::overlap_previous(overlap);
    let s = kernels.stream();
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
            h: dev(kernels, &dx),
            ld_h: c.k,
            ssq: dev(kernels, &dssq),
            ssq_groups: groups,
            weight: dev(kernels, &dnw),
            eps: 1e-6,
            weight_offset: 0.0,
        }
    } else {
        GemvInput::Plain {
            x: dev(kernels, &dx),
            ld_x: c.k,
        }
    };
    let out = match c.epi {
        Epi::Bf16 => {
            let mut o = s.alloc_zeros::<bf16>(m * c.n).unwrap();
            gemv_with(
                kernels,
                dev(kernels, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::Bf16 {
                    out: dev_mut(kernels, &mut o),
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
                kernels,
                dev(kernels, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::F32 {
                    out: dev_mut(kernels, &mut o),
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
        Epi::Residual | Epi::ResidualNorm => {
            let with_norm = matches!(c.epi, Epi::ResidualNorm);
            let mut h = upload(s, &h0[..m * c.n]);
            let mut so = s
                .alloc_zeros::<f32>(residual_groups(c.n) * MAX_TOKENS)
                .unwrap();
            let mut normed = s.alloc_zeros::<bf16>(m * c.n).unwrap();
            let mut arrived = s.alloc_zeros::<i32>(1).unwrap();
            let onw = upload(s, &out_norm_weight(c.n));
            let output = if with_norm {
                GemvOutput::ResidualNorm {
                    h: dev_mut(kernels, &mut h),
                    ld_h: c.n,
                    ssq_out: dev_mut(kernels, &mut so),
                    norm: OutputNorm {
                        weight: dev(kernels, &onw),
                        eps: OUT_NORM_EPS,
                        weight_offset: 1.0,
                    },
                    normed: dev_mut(kernels, &mut normed),
                    ld_normed: c.n,
                    arrived: dev_mut(kernels, &mut arrived),
                }
            } else {
                GemvOutput::Residual {
                    h: dev_mut(kernels, &mut h),
                    ld_h: c.n,
                    ssq_out: dev_mut(kernels, &mut so),
                }
            };
            gemv_with(
                kernels,
                dev(kernels, &dw),
                c.n,
                c.k,
                m,
                &input,
                output,
                options,
            )
            .unwrap();
            assert_eq!(
                s.clone_dtoh(&arrived).unwrap(),
                [0],
                "{}: the last block must leave the arrival count zero",
                c.name
            );
            // [normed (residual norm only) | h | sums of squares]
            let bits = |v: &CudaSlice<bf16>| -> Vec<u32> {
                s.clone_dtoh(v)
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits() as u32)
                    .collect()
            };
            let mut v = if with_norm { bits(&normed) } else { Vec::new() };
            v.extend(bits(&h));
            v.extend(s.clone_dtoh(&so).unwrap().iter().map(|f| f.to_bits()));
            v
        }
        Epi::Parts(widths) => {
            let mut outs: Vec<CudaSlice<bf16>> = widths
                .iter()
                .map(|&w| s.alloc_zeros::<bf16>(m * w).unwrap())
                .collect();
            let parts = outs
                .iter_mut()
                .zip(widths)
                .map(|(o, &width)| GemvPart {
                    out: dev_mut(kernels, o),
                    width,
                })
                .collect();
            gemv_with(
                kernels,
                dev(kernels, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::Bf16Parts { parts },
                options,
            )
            .unwrap();
            let host: Vec<Vec<bf16>> = outs.iter().map(|o| s.clone_dtoh(o).unwrap()).collect();
            let mut v = Vec::with_capacity(m * c.n);
            for t in 0..m {
                for (part, &w) in host.iter().zip(widths) {
                    v.extend(part[t * w..(t + 1) * w].iter().map(|x| x.to_bits() as u32));
                }
            }
            v
        }
        Epi::SiluMul => {
            let inter = c.n / 2;
            let mut o = s.alloc_zeros::<bf16>(m * inter).unwrap();
            gemv_with(
                kernels,
                dev(kernels, &dw),
                c.n,
                c.k,
                m,
                &input,
                GemvOutput::SiluMul {
                    out: dev_mut(kernels, &mut o),
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
fn takes_staged(kernels: &LoadedKernels, n: usize, k: usize, m: usize, norm: bool) -> bool {
    gemv_launch(kernels, n, k, m, norm, GemvOptions::overlap_previous(true)).staged
}

/// A chain as the decode step runs it, each launch reading what the one before wrote: a plain
/// GEMV (9728 -> 4096) writes x; an overlapped one (o_proj-like, 4096 -> 2560) reads it after its
/// wait and adds into h with new sums of squares; an overlapped norm one (qkv-like, 2560 -> 6144)
/// normalises that h. x, h and the sums start as garbage, so a read before the producer ends would
/// show.
struct GemvChain {
    kernels: LoadedKernels,
    w1: CudaSlice<bf16>,
    w2: CudaSlice<bf16>,
    w3: CudaSlice<bf16>,
    nw: CudaSlice<bf16>,
    x0: CudaSlice<bf16>,
    h_init: Vec<bf16>,
    garbage_x: Vec<bf16>,
    garbage_ssq: Vec<f32>,
}

/// The chain's K of its first link, its three N, and its tokens.
const CHAIN: (usize, usize, usize, usize, usize) = (9728, 4096, 2560, 6144, 8);

impl GemvChain {
    fn new(test: &str, d: &OpenDevice) -> Self {
        let mut rng = seed(test);
        let kernels = load(d, Policy::Auto);
        let (k1, n1, n2, n3, m) = CHAIN;
        let s = kernels.stream();
        let w1 = upload(s, &random_bf16(&mut rng, n1 * k1, (3.0 / k1 as f32).sqrt()));
        let w2 = upload(s, &random_bf16(&mut rng, n2 * n1, (3.0 / n1 as f32).sqrt()));
        let w3 = upload(s, &random_bf16(&mut rng, n3 * n2, (3.0 / n2 as f32).sqrt()));
        let nw = upload(s, &random_bf16(&mut rng, n2, 1.0));
        let x0 = upload(s, &random_bf16(&mut rng, m * k1, 1.5));
        let h_init = random_bf16(&mut rng, m * n2, 2.0);
        let garbage_x = random_bf16(&mut rng, m * n1, 7.0);
        let garbage_ssq: Vec<f32> = (0..residual_groups(n2) * MAX_TOKENS)
            .map(|i| 1.0 + i as f32)
            .collect();
        GemvChain {
            kernels,
            w1,
            w2,
            w3,
            nw,
            x0,
            h_init,
            garbage_x,
            garbage_ssq,
        }
    }

    /// Runs the chain, its last two links overlapped or not; returns the bits of h and of the
    /// last output.
    fn run(&self, overlap: bool) -> (Vec<u16>, Vec<u16>) {
        let (k1, n1, n2, n3, m) = CHAIN;
        let kernels = &self.kernels;
        let s = kernels.stream();
        let options = GemvOptions::overlap_previous(overlap);
        let mut x = upload(s, &self.garbage_x);
        let mut h = upload(s, &self.h_init);
        let mut ssq = upload(s, &self.garbage_ssq);
        let mut out = s.alloc_zeros::<bf16>(m * n3).unwrap();
        let input0 = GemvInput::Plain {
            x: dev(kernels, &self.x0),
            ld_x: k1,
        };
        gemv(
            kernels,
            dev(kernels, &self.w1),
            n1,
            k1,
            m,
            &input0,
            GemvOutput::Bf16 {
                out: dev_mut(kernels, &mut x),
                ld_out: n1,
            },
        )
        .unwrap();
        let input1 = GemvInput::Plain {
            x: dev(kernels, &x),
            ld_x: n1,
        };
        let output1 = GemvOutput::Residual {
            h: dev_mut(kernels, &mut h),
            ld_h: n2,
            ssq_out: dev_mut(kernels, &mut ssq),
        };
        gemv_with(
            kernels,
            dev(kernels, &self.w2),
            n2,
            n1,
            m,
            &input1,
            output1,
            options,
        )
        .unwrap();
        let input2 = GemvInput::Norm {
            h: dev(kernels, &h),
            ld_h: n2,
            ssq: dev(kernels, &ssq),
            ssq_groups: residual_groups(n2),
            weight: dev(kernels, &self.nw),
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let output2 = GemvOutput::Bf16 {
            out: dev_mut(kernels, &mut out),
            ld_out: n3,
        };
        gemv_with(
            kernels,
            dev(kernels, &self.w3),
            n3,
            n2,
            m,
            &input2,
            output2,
            options,
        )
        .unwrap();
        let bits = |v: Vec<bf16>| v.iter().map(|b| b.to_bits()).collect::<Vec<u16>>();
        (
            bits(s.clone_dtoh(&h).unwrap()),
            bits(s.clone_dtoh(&out).unwrap()),
        )
    }
}

/// Whether this device launches the decode GEMVs programmatically under `auto`: an sm_90+ GPU
/// unless `AOT_PDL=off`.
fn pdl_expected(d: &OpenDevice) -> bool {
    pdl_device(&d.spec) && PdlMode::from_env().unwrap() != PdlMode::Off
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_overlapped_gemv_chain_takes_the_staged_entries_on_an_sm_90_gpu() {
    let d = device();
    let kernels = load_auto(&d);
    let (_, n1, n2, n3, m) = CHAIN;
    let staged =
        takes_staged(&kernels, n2, n1, m, false) && takes_staged(&kernels, n3, n2, m, true);
    eprintln!(
        "  overlap {} (capability {}.{}): staged launches {staged}",
        kernels.overlap_launch(MODULE),
        d.spec.capability.major,
        d.spec.capability.minor
    );
    if pdl_expected(&d) {
        assert!(
            staged,
            "an sm_90+ GPU under auto must take the staged entries here"
        );
    }
}

/// The plain chain against the reference of its first two links (h from x0): the residual sum of
/// a correct x, not of the garbage.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_plain_gemv_chain_matches_the_reference() {
    let d = device();
    let chain = GemvChain::new("gemv-chain-reference", &d);
    let (k1, n1, n2, _, m) = CHAIN;
    let s = chain.kernels.stream();
    let (want_h, want_out) = chain.run(false);
    assert!(
        want_out.iter().any(|&b| b != 0),
        "the plain chain wrote nothing"
    );
    let x_ref: Vec<bf16> = gemv_reference(
        &s.clone_dtoh(&chain.w1).unwrap(),
        n1,
        k1,
        &s.clone_dtoh(&chain.x0).unwrap(),
        m,
    )
    .iter()
    .map(|&v| bf16::from_f64(v))
    .collect();
    let y_ref = gemv_reference(&s.clone_dtoh(&chain.w2).unwrap(), n2, n1, &x_ref, m);
    let (h_ref, _) = residual_reference(&y_ref, &chain.h_init, n2, m);
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
}

/// The overlapped chain must equal the plain one bit for bit, five times over.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_overlapped_gemvs_read_what_the_kernel_before_wrote() {
    let d = device();
    let chain = GemvChain::new("gemv-overlap", &d);
    let (want_h, want_out) = chain.run(false);
    for round in 0..5 {
        let (h, out) = chain.run(true);
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

/// The GEMV cases, every epilogue at the Qwen3-4B shapes and at odd sizes. The first two are
/// narrow launches whose blocks take two tiles at once (four warps a tile) on any GPU: 3 x SMs + 1
/// tiles over 2 x SMs blocks, so blocks 0..=SMs have a pair and the rest one tile, with K of 7 and
/// of 4 chunks (slices of 2, 2, 2, 1 and some warps without one).
fn gemv_cases(sm_count: usize) -> Vec<GemvCase> {
    let pair_tiles = 3 * sm_count + 1;
    vec![
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
            // A Qwen3.6-35B-A3B DeltaNet layer's in_proj_qkv, z, b and a in one launch.
            name: "DeltaNet in_proj 12352x2048 parts",
            n: 12352,
            k: 2048,
            norm: false,
            epi: Epi::Parts(&[8192, 4096, 32, 32]),
        },
        GemvCase {
            name: "odd 200x72 norm parts",
            n: 200,
            k: 72,
            norm: true,
            epi: Epi::Parts(&[64, 16, 120]),
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
            // A Qwen3.6-35B-A3B layer's out_proj / o_proj with the post-mixer add and norm.
            name: "A3B o_proj 2048x4096 residual norm",
            n: 2048,
            k: 4096,
            norm: false,
            epi: Epi::ResidualNorm,
        },
        GemvCase {
            // Narrow blocks with two tiles each, and blocks past the tiles' pairs.
            name: "narrow pairs, 3 x SMs + 1 tiles x 200, residual norm",
            n: pair_tiles * 16,
            k: 200,
            norm: false,
            epi: Epi::ResidualNorm,
        },
        GemvCase {
            // Wide: warps take whole tiles, then the blocks meet at the count.
            name: "wide 8 x SMs x 16 + 8 rows x 64, residual norm",
            n: 8 * sm_count * 16 + 8,
            k: 64,
            norm: false,
            epi: Epi::ResidualNorm,
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
    ]
}

/// The token counts of every case. Wide norm launches take the all-rows prologue from
/// NORM_ALL_ROWS_MIN (4) rows: 3 and 4 sit either side, and the alone-versus-batched check
/// compares the two prologues' bits.
const GEMV_TOKENS: [usize; 4] = [1, 3, 4, 8];

/// Random inputs of one case at `m` tokens.
struct GemvRun {
    m: usize,
    w: Vec<bf16>,
    x: Vec<bf16>,
    nw: Vec<bf16>,
    /// The reference's sums of squares are exact (float64, rounded once); the kernel adds per-16
    /// f32 partial sums (see `run_gemv`), a few f32 ulps away (`norm_flip_bound`).
    ssq: Vec<f32>,
    h0: Vec<bf16>,
}

impl GemvRun {
    fn new(rng: &mut StdRng, c: &GemvCase, m: usize) -> Self {
        let w = random_bf16(rng, c.n * c.k, (3.0 / c.k as f32).sqrt());
        let x = random_bf16(rng, m * c.k, 1.5);
        let nw = random_bf16(rng, c.k, 1.0);
        let ssq: Vec<f32> = x
            .chunks(c.k)
            .map(|r| r.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum::<f64>() as f32)
            .collect();
        let h0 = random_bf16(rng, m * c.n, 2.0);
        GemvRun {
            m,
            w,
            x,
            nw,
            ssq,
            h0,
        }
    }

    /// The case's outputs on `kernels` (see [`run_gemv`]), overlapped or not.
    fn on(&self, kernels: &LoadedKernels, c: &GemvCase, overlap: bool) -> Vec<u32> {
        run_gemv(
            kernels, c, self.m, &self.w, &self.x, &self.nw, &self.h0, overlap,
        )
    }

    /// The reference's y (before the epilogue), in float64.
    fn reference(&self, c: &GemvCase) -> Vec<f64> {
        let xin = if c.norm {
            norm_input_reference(&self.x, c.k, &self.ssq, &self.nw, 1e-6, 0.0)
        } else {
            self.x.clone()
        };
        gemv_reference(&self.w, c.n, c.k, &xin, self.m)
    }

    /// With the norm prologue: what the inputs that may round either way can move each output
    /// (see `norm_flip_bound`); nothing without it.
    fn flips(&self, c: &GemvCase) -> Vec<f64> {
        if c.norm {
            norm_flip_bound(
                &self.w, c.n, c.k, &self.x, &self.ssq, &self.nw, 1e-6, 0.0, self.m,
            )
        } else {
            vec![0.0; self.m * c.n]
        }
    }

    fn label(&self, c: &GemvCase) -> String {
        format!("{} m={}", c.name, self.m)
    }
}

/// Every case that `keep` keeps, at every token count of [`GEMV_TOKENS`], on fresh inputs (the
/// seed printed under `test`).
fn each_gemv_run(
    test: &str,
    sm_count: usize,
    keep: impl Fn(&GemvCase) -> bool,
    mut check: impl FnMut(&GemvCase, &GemvRun),
) {
    let mut rng = seed(test);
    for c in gemv_cases(sm_count).iter().filter(|c| keep(c)) {
        for m in GEMV_TOKENS {
            check(c, &GemvRun::new(&mut rng, c, m));
        }
    }
}

/// fp32 accumulation against float64: relative error ~1e-6 of sum |w x| (about 1 for these
/// scales).
const GEMV_ABS: f32 = 2e-3;

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_pair_cases_are_narrow_with_fewer_blocks_than_tiles() {
    let kernels = load_auto(&device());
    let sm_count = kernels.sm_count();
    let pair_tiles = 3 * sm_count + 1;
    let pair_shape = gemv_shape(gemv_cases(sm_count)[0].n, sm_count);
    assert!(
        pair_shape.narrow && pair_shape.blocks < pair_tiles,
        "the pair cases must be narrow with fewer blocks than tiles: {pair_shape:?}"
    );
}

/// Overlapped launches stage on Hopper and later, whose auto images are sm_90+; never from the
/// compute_80 PTX.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_overlaps_only_from_sm_90_images() {
    let d = device();
    let sass = load(&d, Policy::Auto);
    let ptx = load(&d, Policy::PtxOnly);
    let capability = d.spec.capability;
    assert_eq!(
        sass.overlap_launch(MODULE),
        pdl_expected(&d),
        "overlap on an sm_{}{} GPU",
        capability.major,
        capability.minor
    );
    assert!(
        !ptx.overlap_launch(MODULE),
        "the compute_80 PTX has no griddepcontrol.wait"
    );
}

/// Where overlapped launches stage, some case takes the staged entries (so the test below checks
/// them).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_some_case_takes_the_staged_entries() {
    let sass = load_auto(&device());
    let mut staged_runs = 0;
    for c in &gemv_cases(sass.sm_count()) {
        for m in GEMV_TOKENS {
            if takes_staged(&sass, c.n, c.k, m, c.norm) {
                staged_runs += 1;
            }
        }
    }
    if sass.overlap_launch(MODULE) {
        eprintln!("  {staged_runs} launches took the staged entries");
        assert!(staged_runs > 0, "no case took the staged entries");
    }
}

/// Overlapped (the staged narrow entries, launched programmatically where the image allows: an
/// sm_90+ GPU under auto): the same sums in the same order, the same bits.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_overlapped_launch_equals_the_plain_one() {
    let sass = load_auto(&device());
    each_gemv_run(
        "gemv-overlapped",
        sass.sm_count(),
        |_| true,
        |c, run| {
            assert_eq!(
                run.on(&sass, c, false),
                run.on(&sass, c, true),
                "{}: the overlapped launch differs",
                run.label(c)
            );
        },
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_sass_equals_ptx() {
    let d = device();
    let sass = load(&d, Policy::Auto);
    let ptx = load(&d, Policy::PtxOnly);
    each_gemv_run(
        "gemv-sass-ptx",
        sass.sm_count(),
        |_| true,
        |c, run| {
            assert_eq!(
                run.on(&sass, c, false),
                run.on(&ptx, c, false),
                "{}: SASS and PTX differ",
                run.label(c)
            );
        },
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_bf16_output_matches_the_reference() {
    let sass = load_auto(&device());
    let bf16_out = |c: &GemvCase| matches!(c.epi, Epi::Bf16 | Epi::Parts(_));
    each_gemv_run("gemv-bf16", sass.sm_count(), bf16_out, |c, run| {
        let got = run.on(&sass, c, false);
        let flips = run.flips(c);
        check_bf16_with(
            &run.label(c),
            &bf16s(&got),
            &run.reference(c)
                .iter()
                .map(|&v| bf16::from_f64(v))
                .collect::<Vec<_>>(),
            1,
            |i| GEMV_ABS + flips[i] as f32,
        );
    });
}

/// Each part of a parts launch holds the bits a Bf16 launch of the whole W writes in its columns.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_parts_equal_the_whole_launch() {
    let sass = load_auto(&device());
    let parts = |c: &GemvCase| matches!(c.epi, Epi::Parts(_));
    each_gemv_run("gemv-parts", sass.sm_count(), parts, |c, run| {
        let whole = GemvCase {
            epi: Epi::Bf16,
            ..*c
        };
        assert_eq!(
            run.on(&sass, c, false),
            run.on(&sass, &whole, false),
            "{}: the parts differ from the whole launch",
            run.label(c)
        );
    });
}

/// fp32 accumulation: 1e-3, plus the input flips.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_f32_output_matches_the_reference() {
    let sass = load_auto(&device());
    let f32_out = |c: &GemvCase| matches!(c.epi, Epi::F32);
    each_gemv_run("gemv-f32", sass.sm_count(), f32_out, |c, run| {
        let got = run.on(&sass, c, false);
        let (y, flips, label) = (run.reference(c), run.flips(c), run.label(c));
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
    });
}

/// A residual case's output: its h (bf16) and its sums of squares per group of rows and token.
struct ResidualOut {
    got_h: Vec<bf16>,
    got_ssq: Vec<f32>,
    want_h: Vec<bf16>,
    want_ssq: Vec<f32>,
    y: Vec<f64>,
}

/// Every residual case on `auto`, with the reference's h and sums of squares.
fn each_residual_run(test: &str, mut check: impl FnMut(&GemvCase, &GemvRun, &ResidualOut)) {
    let sass = load_auto(&device());
    let residual = |c: &GemvCase| matches!(c.epi, Epi::Residual);
    each_gemv_run(test, sass.sm_count(), residual, |c, run| {
        let got = run.on(&sass, c, false);
        let y = run.reference(c);
        let (want_h, want_ssq) = residual_reference(&y, &run.h0, c.n, run.m);
        let split = run.m * c.n;
        let out = ResidualOut {
            got_h: bf16s(&got[..split]),
            got_ssq: got[split..].iter().map(|&b| f32::from_bits(b)).collect(),
            want_h,
            want_ssq,
            y,
        };
        check(c, run, &out);
    });
}

/// bf16(bf16(y) + h): a one-ulp flip in rounding y, then the sum's own rounding going the other
/// way: up to an ulp of y plus an ulp of the result.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_residual_h_matches_the_reference() {
    each_residual_run("gemv-residual-h", |c, run, out| {
        check_bf16_with(&run.label(c), &out.got_h, &out.want_h, 1, |i| {
            GEMV_ABS.max(bf16_ulp(out.y[i] as f32) + bf16_ulp(out.want_h[i].to_f32()))
        });
    });
}

/// Rows `g`'s group of [`TILE_ROWS`] (the last one may be short).
fn group_rows(g: usize, n: usize) -> std::ops::Range<usize> {
    g * TILE_ROWS..((g + 1) * TILE_ROWS).min(n)
}

/// The sums of squares are of the h the kernel wrote: exact in float64 from its output, against
/// the kernel's fp32 sum of 16 squares. (Against the reference's h they may differ by far more:
/// one h that rounds the other way by an ulp moves its square by 2 |h| ulp, 0.25 at |h| = 4; on
/// the H200 that failed the old bound of 1e-3 relative + 0.05 with seed 10888643568556379875.)
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_residual_sums_of_squares_are_those_of_the_written_h() {
    each_residual_run("gemv-residual-ssq", |c, run, out| {
        let label = run.label(c);
        for g in 0..residual_groups(c.n) {
            for t in 0..run.m {
                let got_s = out.got_ssq[g * MAX_TOKENS + t];
                let exact: f64 = group_rows(g, c.n)
                    .map(|r| f64::from(out.got_h[t * c.n + r].to_f32()).powi(2))
                    .sum();
                assert!(
                    (f64::from(got_s) - exact).abs() <= 1e-5 * exact + 1e-6,
                    "{label}: ssq[{g}][{t}] {got_s} vs {exact} from its own h"
                );
            }
        }
    });
}

/// And near the reference's sums (the h test bounds the flips).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_residual_sums_of_squares_match_the_reference() {
    each_residual_run("gemv-residual-ssq-reference", |c, run, out| {
        let label = run.label(c);
        for g in 0..residual_groups(c.n) {
            for t in 0..run.m {
                let got_s = out.got_ssq[g * MAX_TOKENS + t];
                let want_s = out.want_ssq[g * MAX_TOKENS + t];
                let flips: f32 = rows_flip_bound(
                    &out.got_h[t * c.n..],
                    &out.want_h[t * c.n..],
                    group_rows(g, c.n),
                );
                assert!(
                    (got_s - want_s).abs() <= 1e-3 * want_s.abs() + flips,
                    "{label}: ssq[{g}][{t}] {got_s} vs reference {want_s} (h flips allow {flips})"
                );
            }
        }
    });
}

/// Every residual-norm case on `auto` (see [`each_gemv_run`]), with the kernels.
fn each_residual_norm_run(test: &str, mut check: impl FnMut(&LoadedKernels, &GemvCase, &GemvRun)) {
    let sass = load_auto(&device());
    let keep = |c: &GemvCase| matches!(c.epi, Epi::ResidualNorm);
    each_gemv_run(test, sass.sm_count(), keep, |c, run| check(&sass, c, run));
}

/// A residual-norm launch writes the h and the sums of squares of the residual epilogue, bit for
/// bit (the same epilogue code; the norm only reads them).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_residual_norm_h_and_sums_are_the_residual_epilogues() {
    each_residual_norm_run("gemv-residual-norm-h", |sass, c, run| {
        let residual = GemvCase {
            epi: Epi::Residual,
            ..*c
        };
        assert_eq!(
            run.on(sass, c, false)[run.m * c.n..],
            run.on(sass, &residual, false),
            "{}: h or its sums differ from the residual epilogue's",
            run.label(c)
        );
    });
}

/// The norm is that of the h the launch wrote, with every token's scale from the exact float64 sum
/// of its squares: within an ulp, plus, for an element of `h * scale` that lies within the fp32
/// sum's error (scale +- 1e-5, as `norm_flip_bound`) of a bf16 rounding boundary, the gap
/// between its two roundings times (1 + w).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_residual_norm_output_is_the_norm_of_its_h() {
    each_residual_norm_run("gemv-residual-norm", |sass, c, run| {
        let (m, n) = (run.m, c.n);
        let got = bf16s(&run.on(sass, c, false));
        let (normed, h) = (&got[..m * n], &got[m * n..2 * m * n]);
        let nw = out_norm_weight(n);
        let scales = |factor: f64| -> Vec<f64> {
            h.chunks(n)
                .map(|row| {
                    let ss: f64 = row.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum();
                    factor / (ss / n as f64 + f64::from(OUT_NORM_EPS)).sqrt()
                })
                .collect()
        };
        let want = norm_input_with_scales(h, n, &scales(1.0), &nw, 1.0);
        let lo = norm_input_with_scales(h, n, &scales(1.0 - 1e-5), &nw, 1.0);
        let hi = norm_input_with_scales(h, n, &scales(1.0 + 1e-5), &nw, 1.0);
        check_bf16_with(&run.label(c), normed, &want, 1, |i| {
            (hi[i].to_f32() - lo[i].to_f32()).abs()
        });
    });
}

/// bf16(bf16(silu(bf16(gate))) * bf16(up)): a flip in rounding gate moves the activation by up to
/// two of its ulps, a flip in up by one, and the product is rounded once more: up to about four
/// ulps of the result.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_silu_mul_output_matches_the_reference() {
    let sass = load_auto(&device());
    let silu_mul = |c: &GemvCase| matches!(c.epi, Epi::SiluMul);
    each_gemv_run("gemv-silu-mul", sass.sm_count(), silu_mul, |c, run| {
        check_bf16(
            &run.label(c),
            &bf16s(&run.on(&sass, c, false)),
            &silu_mul_reference(&run.reference(c), c.n / 2, run.m),
            4,
            GEMV_ABS,
        );
    });
}

/// Token j's result alone equals its result in the batch (residual output: h rows only).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_token_alone_equals_batched() {
    let sass = load_auto(&device());
    each_gemv_run(
        "gemv-alone",
        sass.sm_count(),
        |_| true,
        |c, run| {
            if run.m == 1 {
                return;
            }
            let (m, j) = (run.m, run.m - 1);
            let got = run.on(&sass, c, false);
            let alone = run_gemv(
                &sass,
                c,
                1,
                &run.w,
                &run.x[j * c.k..],
                &run.nw,
                &run.h0[j * c.n..],
                false,
            );
            let width = match c.epi {
                Epi::SiluMul => c.n / 2,
                _ => c.n,
            };
            assert_eq!(
                &alone[..width],
                &got[j * width..(j + 1) * width],
                "{} m={m}: token {j} alone differs from batched",
                c.name
            );
        },
    );
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
            kc: random_bf16(rng, blocks * block_elems, 1.0),
            vc: random_bf16(rng, blocks * block_elems, 1.0),
            qkv: random_bf16(rng, m * (q_heads + 2 * kv_heads) * hd, 2.0),
            q_norm: random_bf16(rng, hd, 1.2),
            k_norm: random_bf16(rng, hd, 1.2),
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
    fn upload(&self, kernels: &LoadedKernels, rows: &[usize]) -> AttnDevice {
        let s = kernels.stream();
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
        kernels: &LoadedKernels,
        d: &mut AttnDevice,
        grid: usize,
        pipelined: bool,
        cluster: bool,
        overlap_previous: bool,
    ) {
        attention_decode(
            kernels,
            AttnDecode {
                qkv: dev(kernels, &d.qkv),
                ld_qkv: (self.q_heads + 2 * self.kv_heads) * self.hd,
                q_norm: dev(kernels, &d.q_norm),
                k_norm: dev(kernels, &d.k_norm),
                eps: 1e-6,
                weight_offset: 0.0,
                cos_sin: dev(kernels, &d.cos_sin),
                max_pos: self.max_pos,
                k_cache: dev_mut(kernels, &mut d.kc),
                v_cache: dev_mut(kernels, &mut d.vc),
                block_table: dev(kernels, &d.table),
                ld_bt: self.ld_bt,
                slot_of_row: dev(kernels, &d.slots),
                positions: dev(kernels, &d.pos),
                out: dev_mut(kernels, &mut d.out),
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
                ws_ml: dev_mut(kernels, &mut d.ws_ml),
                ws_o: dev_mut(kernels, &mut d.ws_o),
                counters: dev_mut(kernels, &mut d.counters),
            },
        )
        .unwrap();
    }

    /// Runs rows `rows` once, through the pipelined entry or not; returns (out, k cache, v cache).
    fn run(
        &self,
        kernels: &LoadedKernels,
        rows: &[usize],
        grid: usize,
        pipelined: bool,
    ) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        self.run_with(kernels, rows, grid, pipelined, false)
    }

    /// [`Self::run`], the splits merged in clusters or not.
    fn run_with(
        &self,
        kernels: &LoadedKernels,
        rows: &[usize],
        grid: usize,
        pipelined: bool,
        cluster: bool,
    ) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        let s = kernels.stream();
        let mut d = self.upload(kernels, rows);
        // Programmatic where the image allows it, the cache read before the wait, as the engine
        // launches it (after a copy here, so nothing overlaps).
        self.launch(kernels, &mut d, grid, pipelined, cluster, true);
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

/// The attention cases: (q heads, KV heads, head dimension, the context of each row).
fn attention_cases() -> Vec<(usize, usize, usize, Vec<usize>)> {
    vec![
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
    ]
}

/// One attention case's inputs, with the splits its longest row takes.
struct AttnCase {
    inp: AttnInputs,
    ctxs: Vec<usize>,
    grid: usize,
    /// Every row, in order.
    all: Vec<usize>,
}

impl AttnCase {
    fn name(&self) -> String {
        let i = &self.inp;
        format!("{}/{}x{}", i.q_heads, i.kv_heads, i.hd)
    }

    /// Every row, pipelined, on `kernels`: (out, k cache, v cache).
    fn run_all(&self, kernels: &LoadedKernels) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        self.inp.run(kernels, &self.all, self.grid, true)
    }

    /// The rows whose splits fit a cluster.
    fn cluster_rows(&self) -> Vec<usize> {
        (0..self.all.len())
            .filter(|&r| attn_splits(self.ctxs[r]).0 <= CLUSTER_SPLITS)
            .collect()
    }

    /// Whether the cluster merge runs here for this case's rows: sm_90+ code, a 9.0+ GPU, and
    /// the driver places such a cluster (`cluster_fits`), and some row fits one.
    fn clusters(&self, sass: &LoadedKernels) -> bool {
        let i = &self.inp;
        cluster_fits(sass, i.hd, i.q_heads / i.kv_heads, true) && !self.cluster_rows().is_empty()
    }
}

/// Every attention case on fresh inputs (the seed printed under `test`).
fn each_attention_case(test: &str, mut check: impl FnMut(&AttnCase)) {
    let mut rng = seed(test);
    for (q_heads, kv_heads, hd, ctxs) in attention_cases() {
        let pos: Vec<usize> = ctxs.iter().map(|c| c - 1).collect();
        let inp = AttnInputs::new(&mut rng, q_heads, kv_heads, hd, pos);
        let grid = ctxs.iter().map(|&c| attn_splits(c).0).max().unwrap();
        let all = (0..ctxs.len()).collect();
        check(&AttnCase {
            inp,
            ctxs,
            grid,
            all,
        });
    }
}

/// What the reference makes of one row: the new key and value of each KV head, and the output
/// over the whole context (the cache's earlier positions and the new key and value).
struct RowReference {
    label: String,
    new_keys: Vec<Vec<bf16>>,
    new_values: Vec<Vec<bf16>>,
    out: Vec<bf16>,
    /// The largest |v| of each KV head over the context.
    v_max: Vec<f32>,
}

impl AttnInputs {
    /// Row `r` in a failure message: its case, its position and its splits.
    fn row_label(&self, r: usize) -> String {
        let (q_heads, kv_heads, hd, p) = (self.q_heads, self.kv_heads, self.hd, self.pos[r]);
        format!(
            "{q_heads}/{kv_heads}x{hd} pos {p} ({} splits)",
            attn_splits(p + 1).0
        )
    }

    fn reference(&self, r: usize) -> RowReference {
        let (q_heads, kv_heads, hd) = (self.q_heads, self.kv_heads, self.hd);
        let p = self.pos[r];
        let shape = QkvShape {
            q_heads,
            kv_heads,
            head_dim: hd,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let w = (q_heads + 2 * kv_heads) * hd;
        let raw = |head: usize| -> Vec<f64> {
            self.qkv[r * w + head * hd..r * w + (head + 1) * hd]
                .iter()
                .map(|v| f64::from(v.to_f32()))
                .collect()
        };
        let cs = &self.cos_sin[p * hd..(p + 1) * hd];
        let new_keys: Vec<Vec<bf16>> = (0..kv_heads)
            .map(|kv| qkv_head_reference(&raw(q_heads + kv), Some(&self.k_norm), cs, &shape))
            .collect();
        let new_values: Vec<Vec<bf16>> = (0..kv_heads)
            .map(|kv| qkv_head_reference(&raw(q_heads + kv_heads + kv), None, cs, &shape))
            .collect();
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for t in 0..=p {
            for kv in 0..kv_heads {
                if t == p {
                    keys.extend_from_slice(&new_keys[kv]);
                    values.extend_from_slice(&new_values[kv]);
                } else {
                    let at = self.at(r, t, kv);
                    keys.extend_from_slice(&self.kc[at..at + hd]);
                    values.extend_from_slice(&self.vc[at..at + hd]);
                }
            }
        }
        let q: Vec<bf16> = (0..q_heads)
            .flat_map(|h| qkv_head_reference(&raw(h), Some(&self.q_norm), cs, &shape))
            .collect();
        let out = attention_decode_reference(&q, &keys, &values, p + 1, q_heads, kv_heads, hd);
        let v_max: Vec<f32> = (0..kv_heads)
            .map(|kv| {
                (0..=p)
                    .flat_map(|t| &values[(t * kv_heads + kv) * hd..][..hd])
                    .map(|v| v.to_f32().abs())
                    .fold(0.0f32, f32::max)
            })
            .collect();
        RowReference {
            label: self.row_label(r),
            new_keys,
            new_values,
            out,
            v_max,
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_sass_equals_ptx() {
    let d = device();
    let sass = load(&d, Policy::Auto);
    let ptx = load(&d, Policy::PtxOnly);
    each_attention_case("attention-sass-ptx", |case| {
        assert_eq!(
            case.run_all(&sass),
            case.run_all(&ptx),
            "{}: SASS and PTX differ",
            case.name()
        );
    });
}

/// The rows whose splits fit a cluster, merged in clusters (sm_90+ code: the SASS path on this
/// GPU): the same bits as the workspace merge, pipelined (and at 256 its one kind).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_cluster_merge_equals_the_workspace_merge() {
    let sass = load_auto(&device());
    let mut clusters_checked = 0;
    each_attention_case("attention-cluster", |case| {
        if !case.clusters(&sass) {
            return;
        }
        let fit = case.cluster_rows();
        let plain = case
            .inp
            .run(&sass, &fit, case.grid.min(CLUSTER_SPLITS), true);
        let clustered = case.inp.run_with(&sass, &fit, CLUSTER_SPLITS, true, true);
        assert_eq!(
            clustered,
            plain,
            "{} rows {fit:?}: the cluster merge differs",
            case.name()
        );
        clusters_checked += fit.len();
    });
    eprintln!("cluster merge equal to the workspace merge on {clusters_checked} rows");
}

/// A GPU of 64 SMs or more with clusters (the H200: GPCs of 16 or more SMs) places clusters of 8:
/// there the cluster merge test above must check some rows.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_cluster_merge_runs_on_a_gpu_of_64_sms() {
    let sass = load_auto(&device());
    let mut cluster_rows = 0;
    each_attention_case("attention-cluster-rows", |case| {
        if case.clusters(&sass) {
            cluster_rows += case.cluster_rows().len();
        }
    });
    if sass.cluster_launch(aot_kernels::ops::attention::MODULE) && sass.sm_count() >= 64 {
        assert!(cluster_rows > 0, "no row took the cluster merge");
    }
}

/// The compute_80 PTX has no cluster code: ptx-only never takes the cluster entries.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_ptx_only_never_takes_the_cluster_entries() {
    let ptx = load(&device(), Policy::PtxOnly);
    assert!(!ptx.cluster_launch(aot_kernels::ops::attention::MODULE));
}

/// The entries without the pipeline (head dimensions 64 and 128; 256 has one kind) must give the
/// same bits: the same sums in the same order, only the loads move.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_pipelined_equals_not_pipelined() {
    let d = device();
    let sass = load(&d, Policy::Auto);
    let ptx = load(&d, Policy::PtxOnly);
    each_attention_case("attention-pipelined", |case| {
        let pipelined = case.run_all(&sass);
        for (kernels, path) in [(&sass, "SASS"), (&ptx, "PTX")] {
            assert_eq!(
                case.inp.run(kernels, &case.all, case.grid, false),
                pipelined,
                "{} {path}: pipelined and not differ",
                case.name()
            );
        }
    });
}

/// The new key (normed and rotated) and value of each row in the cache, as the reference makes
/// them.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_writes_the_new_key_and_value() {
    let sass = load_auto(&device());
    each_attention_case("attention-cache-write", |case| {
        let (_, kc, vc) = case.run_all(&sass);
        let inp = &case.inp;
        for (r, &p) in inp.pos.iter().enumerate() {
            let want = inp.reference(r);
            for kv in 0..inp.kv_heads {
                let at = inp.at(r, p, kv);
                check_bf16(
                    &format!("{} new key", want.label),
                    &kc[at..at + inp.hd],
                    &want.new_keys[kv],
                    2,
                    2e-2,
                );
                assert_eq!(
                    &vc[at..at + inp.hd],
                    &want.new_values[kv][..],
                    "{}: new value",
                    want.label
                );
            }
        }
    });
}

/// Everything in the cache before a row's new position stays as it was.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_leaves_the_earlier_keys_untouched() {
    let sass = load_auto(&device());
    each_attention_case("attention-cache-kept", |case| {
        let (_, kc, _) = case.run_all(&sass);
        let inp = &case.inp;
        for (r, &p) in inp.pos.iter().enumerate() {
            for t in 0..p {
                for kv in 0..inp.kv_heads {
                    let at = inp.at(r, t, kv);
                    assert_eq!(
                        &kc[at..at + inp.hd],
                        &inp.kc[at..at + inp.hd],
                        "{}: key {t} changed",
                        inp.row_label(r)
                    );
                }
            }
        }
    });
}

/// The kernel multiplies V by the probabilities rounded to bf16 (round to nearest with an 8-bit
/// significand: relative error at most 2^-8 each) and divides by the sum of the unrounded ones,
/// so an output may move by up to 2^-8 x the largest |v| of its KV head beyond the
/// fp32-vs-float64 slack.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_matches_the_reference() {
    let sass = load_auto(&device());
    each_attention_case("attention", |case| {
        let (out, _, _) = case.run_all(&sass);
        let inp = &case.inp;
        let (width, group) = (inp.q_heads * inp.hd, inp.q_heads / inp.kv_heads);
        for r in 0..inp.pos.len() {
            let want = inp.reference(r);
            check_bf16_with(
                &want.label,
                &out[r * width..(r + 1) * width],
                &want.out,
                2,
                |i| 2e-3 + want.v_max[i / inp.hd / group] * 2f32.powi(-8),
            );
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_decode_row_alone_equals_batched() {
    let sass = load_auto(&device());
    each_attention_case("attention-alone", |case| {
        let inp = &case.inp;
        let m = inp.pos.len();
        if m == 1 {
            return;
        }
        let (out, _, _) = case.run_all(&sass);
        let width = inp.q_heads * inp.hd;
        for (r, &p) in inp.pos.iter().enumerate() {
            let (alone, _, _) = inp.run(&sass, &[r], attn_splits(p + 1).0, true);
            assert_eq!(
                alone,
                out[r * width..(r + 1) * width],
                "{}: alone differs from batched",
                inp.row_label(r)
            );
        }
    });
}

/// Gathered rows and their sums of squares.
type Gathered = (Vec<bf16>, Vec<f32>);

/// Five random rows of a 1000 x 2560 table gathered on `auto`: (rows, sums of squares) as the
/// kernel and as the reference give them.
fn run_embedding(test: &str) -> (Gathered, Gathered) {
    let mut rng = seed(test);
    let kernels = load_auto(&device());
    let s = kernels.stream();
    let (vocab, hidden) = (1000, 2560);
    let table = random_bf16(&mut rng, vocab * hidden, 1.0);
    let tokens: Vec<u32> = (0..5).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let (dt, dtok) = (
        upload(s, &table),
        upload(s, &tokens.iter().map(|&t| t as i32).collect::<Vec<_>>()),
    );
    let mut out = s.alloc_zeros::<bf16>(5 * hidden).unwrap();
    let mut ssq = s.alloc_zeros::<f32>(5).unwrap();
    embedding(
        &kernels,
        dev_mut(&kernels, &mut out),
        hidden,
        Some(dev_mut(&kernels, &mut ssq)),
        dev(&kernels, &dt),
        vocab,
        hidden,
        dev(&kernels, &dtok),
        5,
    )
    .unwrap();
    (
        (s.clone_dtoh(&out).unwrap(), s.clone_dtoh(&ssq).unwrap()),
        embedding_reference(&table, hidden, &tokens),
    )
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_embedding_copies_rows_exactly() {
    let ((rows, _), (want, _)) = run_embedding("embedding-rows");
    assert_eq!(rows, want, "rows are copied exactly");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_embedding_sums_the_squares_of_each_row() {
    let ((_, ssq), (_, want_ssq)) = run_embedding("embedding-ssq");
    for (g, w) in ssq.iter().zip(&want_ssq) {
        assert!((g - w).abs() <= 1e-4 * w, "{g} vs {w}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_graph_replay_equals_eager() {
    let mut rng = seed("gemv_graph");
    let kernels = load_auto(&device());
    let s = kernels.stream();
    // down_proj shape (narrow: the warps of a block split K).
    let (n, k, m) = (2560usize, 9728usize, 4usize);
    let w = upload(s, &random_bf16(&mut rng, n * k, 0.02));
    let x = upload(s, &random_bf16(&mut rng, m * k, 1.0));
    let mut out = s.alloc_zeros::<bf16>(m * n).unwrap();
    let launch = |out: &mut CudaSlice<bf16>| {
        gemv(
            &kernels,
            dev(&kernels, &w),
            n,
            k,
            m,
            &GemvInput::Plain {
                x: dev(&kernels, &x),
                ld_x: k,
            },
            GemvOutput::Bf16 {
                out: dev_mut(&kernels, out),
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
}

/// Bandwidth of the Qwen3-4B decode projections (printed only).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_bandwidth() {
    let mut rng = seed("gemv_bandwidth");
    let kernels = load_auto(&device());
    let s = kernels.stream();
    for (name, n, k, norm) in [
        ("qkv 6144x2560", 6144usize, 2560usize, true),
        ("o_proj 2560x4096", 2560, 4096, false),
        ("gate_up 19456x2560", 19456, 2560, true),
        ("down 2560x9728", 2560, 9728, false),
        ("lm_head 151936x2560", 151_936, 2560, true),
    ] {
        let w = upload(s, &random_bf16(&mut rng, n * k, 0.02));
        let x = upload(s, &random_bf16(&mut rng, 8 * k, 1.0));
        let ssq = upload(s, &[k as f32; 8]);
        let nw = upload(s, &vec![bf16::ONE; k]);
        let mut out = s.alloc_zeros::<bf16>(8 * n).unwrap();
        for m in [1usize, 8] {
            let input = if norm {
                GemvInput::Norm {
                    h: dev(&kernels, &x),
                    ld_h: k,
                    ssq: dev(&kernels, &ssq),
                    ssq_groups: 1,
                    weight: dev(&kernels, &nw),
                    eps: 1e-6,
                    weight_offset: 0.0,
                }
            } else {
                GemvInput::Plain {
                    x: dev(&kernels, &x),
                    ld_x: k,
                }
            };
            let iters = 50;
            let start = aot_kernels::device::timing_event(kernels.context()).unwrap();
            let stop = aot_kernels::device::timing_event(kernels.context()).unwrap();
            for i in 0..iters + 5 {
                if i == 5 {
                    start.record(s).unwrap();
                }
                gemv(
                    &kernels,
                    dev(&kernels, &w),
                    n,
                    k,
                    m,
                    &input,
                    GemvOutput::Bf16 {
                        out: dev_mut(&kernels, &mut out),
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
        let kernels = load(&d, policy);
        let s = kernels.stream();
        for reader in Reader::ALL {
            let blocks = reader.blocks(kernels.sm_count());
            let ring_reuse = 4096 * Reader::Bulk.blocks(kernels.sm_count()) * 9 + 12;
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
                stream_read(
                    &kernels,
                    reader,
                    dev(&kernels, &dd),
                    dev_mut(&kernels, &mut out),
                )
                .unwrap();
                let got = s.clone_dtoh(&out).unwrap().iter().fold(0, |a, &b| a ^ b);
                assert_eq!(
                    got,
                    xor_reference(&data),
                    "{policy} {reader:?}: {words} words"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_stream_read_refuses_a_length_not_a_multiple_of_4_words() {
    use aot_kernels::ops::stream_read::{stream_read, Reader};
    let d = device();
    for policy in [Policy::Auto, Policy::PtxOnly] {
        let kernels = load(&d, policy);
        let s = kernels.stream();
        for reader in Reader::ALL {
            let dd = upload(s, &[1u32, 2, 3]);
            let mut out = s
                .alloc_zeros::<u32>(reader.blocks(kernels.sm_count()))
                .unwrap();
            let err = stream_read(
                &kernels,
                reader,
                dev(&kernels, &dd),
                dev_mut(&kernels, &mut out),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("multiple of 4"), "{policy} {reader:?}: {err}");
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
    let kernels = load_auto(&d);
    let s = kernels.stream();
    let (q_heads, kv_heads, hd) = (32usize, 8usize, 128usize);
    for (m, ctx, pipelined) in [1usize, 8]
        .into_iter()
        .flat_map(|m| [300usize, 1024].map(|ctx| (m, ctx)))
        .flat_map(|(m, ctx)| [true, false].map(|p| (m, ctx, p)))
    {
        let inp = AttnInputs::new(&mut rng, q_heads, kv_heads, hd, vec![ctx - 1; m]);
        let grid = attn_splits(ctx).0;
        let rows: Vec<usize> = (0..m).collect();
        let mut dv = inp.upload(&kernels, &rows);
        // Not overlapped: back to back, each launch would overlap the one before it and the
        // figures would not be one launch's.
        let mut launch = |_: &mut ()| inp.launch(&kernels, &mut dv, grid, pipelined, false, false);
        let mut out = ();
        for _ in 0..5 {
            launch(&mut out);
        }
        let iters = 50;
        let (start, stop) = (
            aot_kernels::device::timing_event(kernels.context()).unwrap(),
            aot_kernels::device::timing_event(kernels.context()).unwrap(),
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
