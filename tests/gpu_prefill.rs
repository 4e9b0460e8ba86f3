//! The prefill kernels on a real GPU, under both dispatch paths (exact SASS and the PTX fallback,
//! compared bitwise), against their CPU references, at Qwen3-4B shapes (hidden 2560, 32/8 heads of
//! 128, MLP 9728) and odd ones; and the property chunked prefill relies on: every output is
//! bitwise independent of how the prompt is chunked.
//!
//! `#[ignore]`d: they need a CUDA GPU (run with `--include-ignored` there; the GPU bundle does).
//! The input seed is printed; rerun a failure with `AOT_TEST_SEED=<seed>`. One claim a test: the
//! runs that several claims check are made once per binary and shared.
//!
//! The GEMM has two kernels (mma.sync everywhere, wgmma where sm_90a SASS is loaded): on an sm_90
//! GPU the SASS path runs wgmma and the PTX path mma.sync, so comparing the paths bitwise also
//! compares the two kernels; the SASS path's mma.sync is compared to its wgmma as well.
//!
//! Tolerances against the float64 references (the kernels accumulate in fp32 in their own order):
//! - GEMM: `|got - ref| <= 2^-16 * sum_k |a_k w_k|`, plus one bf16 ulp of `ref` for bf16 output.
//! - q/k norm + RoPE: `|got - ref| <= 2` bf16 ulps of the largest value of the head (a normalised
//!   value next to a rounding boundary may round the other way, and RoPE mixes pairs); v and the
//!   cache rows not written: bitwise.
//! - attention: `|got - ref| <= 1` bf16 ulp of `ref` + `2^-10 * max |v|` (the reference follows
//!   the kernel's key tiles and bf16 probabilities; what remains is fp32 against float64).

mod gpu_common;

use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::attention_prefill::{
    attention_prefill, attention_prefill_row, AttentionPrefillParams,
};
use aot_kernels::ops::gemm::{
    gemm_bf16, gemm_bf16_f32out, gemm_bf16_f32out_on, gemm_bf16_on, gemm_element, GemmKernel,
    GemmShape,
};
use aot_kernels::ops::init::fill_uniform_bf16;
use aot_kernels::ops::kv_cache::{block_elements, BlockTable, KV_BLOCK_TOKENS};
use aot_kernels::ops::qk_norm_rope::{
    qk_norm_rope_cache, qk_norm_rope_cache_reference, QkNormRopeInputs, QkNormRopeParams,
};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut, OpsError};
use cudarc::driver::CudaSlice;
use gpu_common::{describe, device, load_auto, load_both_paths, random_bf16, test_seed, time_ms};
use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::OnceLock;

/// The spacing of bf16 values at `|x|` (one ulp).
fn ulp(x: f64) -> f64 {
    let b = bf16::from_f64(x.abs());
    let next = bf16::from_bits(b.to_bits() + 1);
    f64::from(next.to_f32()) - f64::from(b.to_f32())
}

/// Asserts bitwise equality of two outputs, naming the first difference.
fn assert_same_bits(what: &str, a: &[bf16], b: &[bf16]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        panic!(
            "{what}: differ at element {i}: {} vs {} ({} elements differ)",
            a[i],
            b[i],
            a.iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM

struct GemmCase {
    name: &'static str,
    shape: GemmShape,
    a: Vec<bf16>,
    w: Vec<bf16>,
    /// Check every element (small shapes) or this many sampled ones.
    sampled: Option<usize>,
}

fn gemm_case(
    rng: &mut impl Rng,
    name: &'static str,
    shape: GemmShape,
    sampled: Option<usize>,
) -> GemmCase {
    let a = random_bf16(rng, (shape.m - 1) * shape.lda + shape.k, 2.0);
    let w = random_bf16(rng, (shape.n - 1) * shape.ldw + shape.k, 0.1);
    GemmCase {
        name,
        shape,
        a,
        w,
        sampled,
    }
}

/// Elements to check: all, or the corners plus random ones.
fn gemm_points(rng: &mut impl Rng, s: &GemmShape, sampled: Option<usize>) -> Vec<(usize, usize)> {
    match sampled {
        None => (0..s.m)
            .flat_map(|r| (0..s.n).map(move |c| (r, c)))
            .collect(),
        Some(n) => {
            let mut p = vec![(0, 0), (s.m - 1, s.n - 1), (0, s.n - 1), (s.m - 1, 0)];
            p.extend((0..n).map(|_| (rng.gen_range(0..s.m), rng.gen_range(0..s.n))));
            p
        }
    }
}

/// Runs both outputs of one case on `kernel`; returns (bf16 C, f32 C) as downloaded.
fn run_gemm(kernels: &LoadedKernels, kernel: GemmKernel, c: &GemmCase) -> (Vec<bf16>, Vec<f32>) {
    let s = kernels.stream();
    let s_ = &c.shape;
    let (a, w) = (s.clone_htod(&c.a).unwrap(), s.clone_htod(&c.w).unwrap());
    let c_len = (s_.m - 1) * s_.ldc + s_.n;
    let mut out = s.alloc_zeros::<bf16>(c_len).unwrap();
    let mut out32 = s.alloc_zeros::<f32>(c_len).unwrap();
    gemm_bf16_on(kernels, kernel, &mut out, &a, &w, s_).unwrap();
    gemm_bf16_f32out_on(kernels, kernel, &mut out32, &a, &w, s_).unwrap();
    (s.clone_dtoh(&out).unwrap(), s.clone_dtoh(&out32).unwrap())
}

fn assert_same_f32_bits(what: &str, a: &[f32], b: &[f32]) {
    let differ = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert!(
        a.len() == b.len() && differ == 0,
        "{what}: f32 outputs differ ({differ} elements)"
    );
}

/// A GEMM's bf16 and f32 outputs.
type GemmOut = (Vec<bf16>, Vec<f32>);

/// The GEMM cases and each path's outputs on them, with what the tests compare them to.
struct GemmRuns {
    seed: u64,
    sm: u32,
    /// The GEMM kernel each path runs (`GemmKernel::best` of its load): SASS, then PTX.
    best_gemms: [GemmKernel; 2],
    cases: Vec<GemmCase>,
    /// Per path (SASS, then PTX), per case: the bf16 and the f32 output.
    per_path: Vec<(&'static str, Vec<GemmOut>)>,
    /// Per case, the SASS load's mma.sync outputs, where its best kernel is wgmma.
    sass_mma_sync: Option<Vec<GemmOut>>,
}

/// Every GEMM case run once per binary on both paths (and, where the SASS path runs wgmma, on
/// its mma.sync kernel as well).
fn gemm_runs() -> &'static GemmRuns {
    static RUNS: OnceLock<GemmRuns> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_gemm runs");
        eprintln!("device \"{}\": {}", d.name, d.spec);
        let paths = load_both_paths(&d);
        eprintln!("{}", describe(&paths[0].1, "gemm_bf16"));
        eprintln!("{}", describe(&paths[0].1, "gemm_bf16_sm90"));
        let best_gemms = paths
            .each_ref()
            .map(|(_, kernels)| GemmKernel::best(kernels));
        eprintln!(
            "GEMM kernels: sass path {:?}, ptx path {:?}",
            best_gemms[0], best_gemms[1]
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cases = vec![
            gemm_case(
                &mut rng,
                "qkv_proj T=300",
                GemmShape::dense(300, 6144, 2560),
                Some(3000),
            ),
            gemm_case(
                &mut rng,
                "down_proj T=64",
                GemmShape::dense(64, 2560, 9728),
                Some(2000),
            ),
            gemm_case(
                &mut rng,
                "gate_up T=7",
                GemmShape::dense(7, 19456, 2560),
                Some(2000),
            ),
            gemm_case(&mut rng, "odd 37x40x24", GemmShape::dense(37, 40, 24), None),
            // Nine row tiles: a full group of eight in the grouped tile order and a partial one;
            // three column tiles, the last partial.
            gemm_case(
                &mut rng,
                "grouped order 1100x520x320",
                GemmShape::dense(1100, 520, 320),
                Some(4000),
            ),
            gemm_case(
                &mut rng,
                "odd strided 129x264x1000",
                GemmShape {
                    m: 129,
                    n: 264,
                    k: 1000,
                    lda: 1008,
                    ldw: 1016,
                    ldc: 270,
                },
                None,
            ),
            gemm_case(&mut rng, "one row 1x8x8", GemmShape::dense(1, 8, 8), None),
        ];
        let per_path = paths
            .iter()
            .zip(&best_gemms)
            .map(|((path, kernels), &gemm)| {
                let outs: Vec<_> = cases.iter().map(|c| run_gemm(kernels, gemm, c)).collect();
                (*path, outs)
            })
            .collect();
        let sass_mma_sync = (best_gemms[0] == GemmKernel::Wgmma).then(|| {
            cases
                .iter()
                .map(|c| run_gemm(&paths[0].1, GemmKernel::MmaSync, c))
                .collect()
        });
        GemmRuns {
            seed,
            sm: d.spec.capability.sm(),
            best_gemms,
            cases,
            per_path,
            sass_mma_sync,
        }
    })
}

/// Each path's outputs of each case against the float64 reference at the case's points:
/// `check(path, case, row, col, want, sum |a w|, bf16 output, f32 output)`.
fn each_gemm_point(
    mut check: impl FnMut(&str, &GemmCase, usize, usize, f64, f64, bf16, f32),
) -> Vec<(String, usize)> {
    let runs = gemm_runs();
    let mut checked = Vec::new();
    for (path, outs) in &runs.per_path {
        for (c, (out, out32)) in runs.cases.iter().zip(outs) {
            let s = &c.shape;
            let mut rng = rand::rngs::StdRng::seed_from_u64(runs.seed ^ 0x6e6d);
            let points = gemm_points(&mut rng, s, c.sampled);
            for &(r, col) in &points {
                let (want, mag) = gemm_element(&c.a, &c.w, s, r, col);
                check(
                    path,
                    c,
                    r,
                    col,
                    want,
                    mag,
                    out[r * s.ldc + col],
                    out32[r * s.ldc + col],
                );
            }
            checked.push((format!("[{path}] {} {s:?}", c.name), points.len()));
        }
    }
    checked
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_ptx_path_runs_mma_sync() {
    assert_eq!(
        gemm_runs().best_gemms[1],
        GemmKernel::MmaSync,
        "the PTX path has no wgmma"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_sass_path_runs_wgmma_on_an_sm_90_gpu() {
    let runs = gemm_runs();
    if runs.sm == 90 {
        assert_eq!(
            runs.best_gemms[0],
            GemmKernel::Wgmma,
            "an sm_90 GPU under auto must run the sm_90a wgmma kernel"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_bf16_output_matches_the_reference_on_both_paths() {
    let (mut worst, mut differ) = (0.0f64, 0usize);
    let checked = each_gemm_point(|path, c, r, col, want, mag, got, _| {
        let tol = mag * 2f64.powi(-16);
        let got16 = f64::from(got.to_f32());
        let e16 = (got16 - want).abs() / (tol + ulp(want));
        differ += usize::from(got != bf16::from_f64(want));
        worst = worst.max(e16);
        assert!(
            e16 <= 1.0,
            "[{path}] {} at ({r}, {col}): bf16 {got16}, reference {want}, sum|aw| {mag}",
            c.name
        );
    });
    eprintln!(
        "{checked:?} elements checked; {differ} bf16 outputs differ from the rounded reference; worst error / tolerance {worst:.3}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_f32_output_matches_the_reference_on_both_paths() {
    let mut worst = 0.0f64;
    let checked = each_gemm_point(|path, c, r, col, want, mag, _, got| {
        let tol = mag * 2f64.powi(-16);
        let got32 = f64::from(got);
        let e32 = (got32 - want).abs() / tol.max(f64::MIN_POSITIVE);
        worst = worst.max(e32);
        assert!(
            e32 <= 1.0,
            "[{path}] {} at ({r}, {col}): f32 {got32}, reference {want}, sum|aw| {mag}",
            c.name
        );
    });
    eprintln!("{checked:?} elements checked; worst error / tolerance {worst:.3}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_leaves_the_row_padding_untouched() {
    let runs = gemm_runs();
    for (path, outs) in &runs.per_path {
        for (c, (out, _)) in runs.cases.iter().zip(outs) {
            let s = &c.shape;
            // Nothing written past the rows (the padding between ldc rows stays zero).
            for r in 0..s.m {
                assert!(
                    out[r * s.ldc + s.n..(r * s.ldc + s.ldc).min(out.len())]
                        .iter()
                        .all(|v| v.to_bits() == 0),
                    "[{path}] {}: wrote into the row padding",
                    c.name
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_sass_equals_ptx() {
    let runs = gemm_runs();
    let (sass, ptx) = (&runs.per_path[0].1, &runs.per_path[1].1);
    for (c, ((a16, a32), (b16, b32))) in runs.cases.iter().zip(sass.iter().zip(ptx)) {
        assert_same_bits(&format!("{}: SASS vs PTX", c.name), a16, b16);
        assert_same_f32_bits(&format!("{}: SASS vs PTX", c.name), a32, b32);
    }
    eprintln!(
        "SASS ({:?}) and PTX ({:?}) outputs are bitwise identical",
        runs.best_gemms[0], runs.best_gemms[1]
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_wgmma_equals_mma_sync() {
    let runs = gemm_runs();
    // The same SASS load's mma.sync kernel against its wgmma kernel.
    if let Some(mma_sync) = &runs.sass_mma_sync {
        for (c, ((w16, w32), (m16, m32))) in runs
            .cases
            .iter()
            .zip(runs.per_path[0].1.iter().zip(mma_sync))
        {
            assert_same_bits(&format!("{}: wgmma vs mma.sync", c.name), w16, m16);
            assert_same_f32_bits(&format!("{}: wgmma vs mma.sync", c.name), w32, m32);
        }
        eprintln!("wgmma and mma.sync (both SASS) outputs are bitwise identical");
    }
}

/// Qwen3-4B qkv_proj over 1024 tokens, then the same rows in chunks of awkward sizes (each row
/// lands at other places in the 128-row tiles): the whole's outputs, and per chunking per chunk
/// its first row and its outputs.
struct ChunkedGemm {
    n: usize,
    whole: GemmOut,
    /// Per chunking, per chunk: its first row and its outputs.
    chunkings: Vec<Vec<(usize, GemmOut)>>,
}

fn chunked_gemm() -> &'static ChunkedGemm {
    static RUNS: OnceLock<ChunkedGemm> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_gemm chunked runs");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let kernels = load_auto(&d);
        let s = kernels.stream();
        let full = GemmShape::dense(1024, 6144, 2560);
        let a = random_bf16(&mut rng, full.m * full.k, 2.0);
        let w = s
            .clone_htod(&random_bf16(&mut rng, full.n * full.k, 0.1))
            .unwrap();
        let run = |rows: &[bf16], m: usize| -> (Vec<bf16>, Vec<f32>) {
            let shape = GemmShape { m, ..full };
            let a = s.clone_htod(rows).unwrap();
            let mut c = s.alloc_zeros::<bf16>(m * full.n).unwrap();
            let mut c32 = s.alloc_zeros::<f32>(m * full.n).unwrap();
            gemm_bf16(&kernels, &mut c, &a, &w, &shape).unwrap();
            gemm_bf16_f32out(&kernels, &mut c32, &a, &w, &shape).unwrap();
            (s.clone_dtoh(&c).unwrap(), s.clone_dtoh(&c32).unwrap())
        };
        let whole = run(&a, full.m);
        let chunkings = [
            vec![1, 7, 64, 127, 128, 129, 255, 313],
            vec![1000, 24],
            vec![3; 341].into_iter().chain([1]).collect::<Vec<_>>(),
        ]
        .iter()
        .map(|chunks| {
            let mut r0 = 0;
            chunks
                .iter()
                .map(|&m| {
                    let (part, part32) = run(&a[r0 * full.k..(r0 + m) * full.k], m);
                    r0 += m;
                    (r0 - m, (part, part32))
                })
                .collect()
        })
        .collect();
        ChunkedGemm {
            n: full.n,
            whole,
            chunkings,
        }
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_bf16_rows_do_not_depend_on_the_chunking() {
    let runs = chunked_gemm();
    let n = runs.n;
    for chunks in &runs.chunkings {
        for (r0, (part, _)) in chunks {
            let m = part.len() / n;
            assert_same_bits(
                &format!("rows {r0}..{} alone vs in the whole", r0 + m),
                part,
                &runs.whole.0[r0 * n..(r0 + m) * n],
            );
        }
        eprintln!("{} chunks: bitwise equal to the whole", chunks.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_f32_rows_do_not_depend_on_the_chunking() {
    let runs = chunked_gemm();
    let n = runs.n;
    for chunks in &runs.chunkings {
        for (r0, (_, part32)) in chunks {
            assert!(
                part32
                    .iter()
                    .zip(&runs.whole.1[r0 * n..])
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "rows {r0}..{}: f32 output depends on the chunking",
                r0 + part32.len() / n
            );
        }
        eprintln!("{} chunks: bitwise equal to the whole", chunks.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_timings() {
    let d = device();
    let kernels = load_auto(&d);
    let s = kernels.stream();
    let t = 8192; // 8 sequences x 1024 tokens
    let buffer = |n: usize, stream: u64| -> CudaSlice<bf16> {
        let mut b = s.alloc_zeros::<bf16>(n).unwrap();
        fill_uniform_bf16(&kernels, dev_mut(&kernels, &mut b), n, 1, stream, 0.5, 0.0).unwrap();
        b
    };
    let a = buffer(t * 9728, 1);
    let w = buffer(19456 * 2560, 2);
    let mut c = s.alloc_zeros::<bf16>(t * 19456).unwrap();
    let best = GemmKernel::best(&kernels);
    let gemms: &[GemmKernel] = if best == GemmKernel::Wgmma {
        &[GemmKernel::MmaSync, GemmKernel::Wgmma]
    } else {
        &[GemmKernel::MmaSync]
    };
    for &kernel in gemms {
        let mut layer_ms = 0.0;
        let mut layer_flop = 0.0;
        for (name, n, kk) in [
            ("qkv_proj", 6144, 2560),
            ("o_proj", 2560, 4096),
            ("gate_up_proj", 19456, 2560),
            ("down_proj", 2560, 9728),
        ] {
            let shape = GemmShape::dense(t, n, kk);
            let ms = time_ms(&kernels, 10, || {
                gemm_bf16_on(&kernels, kernel, &mut c, &a, &w, &shape).unwrap()
            });
            let flop = 2.0 * (t * n * kk) as f64;
            layer_ms += f64::from(ms);
            layer_flop += flop;
            eprintln!(
                "gemm_bf16 [{kernel:?}] {t} x {n} x {kk} ({name}): {ms:.3} ms, {:.1} TFLOP/s",
                flop / f64::from(ms) / 1e9
            );
        }
        eprintln!(
            "Qwen3-4B layer GEMMs [{kernel:?}], 8 x 1024-token prefill: {layer_ms:.3} ms, {:.1} TFLOP/s effective",
            layer_flop / layer_ms / 1e9
        );
    }
    let mut logits = s.alloc_zeros::<f32>(8 * 151_936).unwrap();
    let lm_w = buffer(151_936 * 2560, 3);
    let shape = GemmShape::dense(8, 151_936, 2560);
    let ms = time_ms(&kernels, 10, || {
        gemm_bf16_f32out(&kernels, &mut logits, &a, &lm_w, &shape).unwrap()
    });
    eprintln!(
        "gemm_bf16_f32out 8 x 151936 x 2560 (lm_head, last tokens): {ms:.3} ms, {:.0} GB/s of weights",
        151_936.0 * 2560.0 * 2.0 / f64::from(ms) / 1e6
    );
}

// ---------------------------------------------------------------------------------------------
// q/k norm + RoPE + cache write, and attention

/// A paged cache for one sequence: `blocks` is a random permutation of cache blocks (more blocks
/// than the sequence needs, so other sequences' blocks sit in between).
struct Cache {
    kv_heads: usize,
    head_dim: usize,
    blocks: Vec<i32>,
    k: Vec<bf16>,
    v: Vec<bf16>,
}

impl Cache {
    /// A cache for `positions` positions, filled with `fill` everywhere.
    fn new(
        rng: &mut impl Rng,
        positions: usize,
        kv_heads: usize,
        head_dim: usize,
        fill: bf16,
    ) -> Cache {
        let needed = positions.div_ceil(KV_BLOCK_TOKENS);
        let total = needed + 3;
        let mut ids: Vec<i32> = (0..total as i32).collect();
        ids.shuffle(rng);
        ids.truncate(needed);
        let n = total * block_elements(kv_heads, head_dim);
        Cache {
            kv_heads,
            head_dim,
            blocks: ids,
            k: vec![fill; n],
            v: vec![fill; n],
        }
    }

    /// Random k and v at positions `0..positions`.
    fn fill_positions(&mut self, rng: &mut impl Rng, positions: usize) {
        let d = self.head_dim;
        for p in 0..positions {
            let block = self.blocks[p / KV_BLOCK_TOKENS] as usize;
            for h in 0..self.kv_heads {
                let at = aot_kernels::ops::kv_cache::cache_offset(
                    block,
                    h,
                    p % KV_BLOCK_TOKENS,
                    self.kv_heads,
                    d,
                );
                for i in 0..d {
                    self.k[at + i] = bf16::from_f32(rng.gen_range(-2.0..2.0));
                    self.v[at + i] = bf16::from_f32(rng.gen_range(-2.0..2.0));
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct NormCase {
    name: &'static str,
    tokens: usize,
    start_pos: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    pad: usize,
    theta: f64,
    weight_offset: f32,
}

/// Per case: the reference's q, k cache and v cache, and each path's (SASS, then PTX).
struct NormRun {
    case: NormCase,
    want: [Vec<bf16>; 3],
    per_path: Vec<(&'static str, [Vec<bf16>; 3])>,
}

/// Every q/k norm + RoPE case run once per binary on both paths, from the same inputs.
fn norm_runs() -> &'static [NormRun] {
    static RUNS: OnceLock<Vec<NormRun>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_qk_norm_rope_cache runs");
        eprintln!("device \"{}\": {}", d.name, d.spec);
        let paths = load_both_paths(&d);
        eprintln!("{}", describe(&paths[0].1, "qk_norm_rope_cache"));
        let cases = [
            NormCase {
                name: "qwen3-4b 1024 tokens",
                tokens: 1024,
                start_pos: 0,
                q_heads: 32,
                kv_heads: 8,
                head_dim: 128,
                pad: 0,
                theta: 1e6,
                weight_offset: 0.0,
            },
            NormCase {
                name: "qwen3-4b chunk at 977",
                tokens: 45,
                start_pos: 977,
                q_heads: 32,
                kv_heads: 8,
                head_dim: 128,
                pad: 8,
                theta: 1e6,
                weight_offset: 0.0,
            },
            NormCase {
                name: "head_dim 64, 6/2 heads",
                tokens: 37,
                start_pos: 3,
                q_heads: 6,
                kv_heads: 2,
                head_dim: 64,
                pad: 0,
                theta: 1e4,
                weight_offset: 0.0,
            },
            NormCase {
                name: "head_dim 256, 16/2 heads, (1 + w)",
                tokens: 19,
                start_pos: 250,
                q_heads: 16,
                kv_heads: 2,
                head_dim: 256,
                pad: 16,
                theta: 1e7,
                weight_offset: 1.0,
            },
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut runs = Vec::new();
        for c in cases {
            let dd = c.head_dim;
            let p = QkNormRopeParams {
                tokens: c.tokens,
                q_heads: c.q_heads,
                kv_heads: c.kv_heads,
                head_dim: dd,
                qkv_stride: (c.q_heads + 2 * c.kv_heads) * dd + c.pad,
                start_pos: c.start_pos,
                eps: 1e-6,
                weight_offset: c.weight_offset,
            };
            let max_position = c.start_pos + c.tokens + 5;
            let qkv = random_bf16(&mut rng, c.tokens * p.qkv_stride, 3.0);
            let (q_norm, k_norm) = (
                random_bf16(&mut rng, dd, 1.5),
                random_bf16(&mut rng, dd, 1.5),
            );
            let cos_sin = cos_sin_cache(max_position, dd, c.theta);
            // The cache starts random: rows this call does not write must keep their bits.
            let mut cache =
                Cache::new(&mut rng, c.start_pos + c.tokens, c.kv_heads, dd, bf16::ZERO);
            cache.k = random_bf16(&mut rng, cache.k.len(), 1.0);
            cache.v = random_bf16(&mut rng, cache.v.len(), 1.0);
            let (mut want_k, mut want_v) = (cache.k.clone(), cache.v.clone());
            let want_q = qk_norm_rope_cache_reference(
                &qkv,
                &q_norm,
                &k_norm,
                &cos_sin,
                &cache.blocks,
                &p,
                &mut want_k,
                &mut want_v,
            );
            let per_path = paths
                .iter()
                .map(|(path, kernels)| {
                    let s = kernels.stream();
                    let table = s.clone_htod(&cache.blocks).unwrap();
                    let qkv_dev = s.clone_htod(&qkv).unwrap();
                    let inputs = QkNormRopeInputs {
                        qkv: dev(kernels, &qkv_dev),
                        q_norm: &s.clone_htod(&q_norm).unwrap(),
                        k_norm: &s.clone_htod(&k_norm).unwrap(),
                        cos_sin: &s.clone_htod(&cos_sin).unwrap(),
                        max_position,
                        blocks: BlockTable {
                            table: &table,
                            offset: 0,
                            len: cache.blocks.len(),
                        },
                    };
                    let mut q_out = s.alloc_zeros::<bf16>(c.tokens * c.q_heads * dd).unwrap();
                    let mut kc = s.clone_htod(&cache.k).unwrap();
                    let mut vc = s.clone_htod(&cache.v).unwrap();
                    qk_norm_rope_cache(
                        kernels,
                        &inputs,
                        dev_mut(kernels, &mut q_out),
                        &mut kc,
                        &mut vc,
                        &p,
                    )
                    .unwrap();
                    let got = [
                        s.clone_dtoh(&q_out).unwrap(),
                        s.clone_dtoh(&kc).unwrap(),
                        s.clone_dtoh(&vc).unwrap(),
                    ];
                    (*path, got)
                })
                .collect();
            runs.push(NormRun {
                case: c,
                want: [want_q, want_k, want_v],
                per_path,
            });
        }
        runs
    })
}

/// Output `i` (0 q, 1 k cache) of every case on both paths within 2 bf16 ulps of the largest
/// value of its head.
fn check_norm_output(i: usize, what: &str) {
    for run in norm_runs() {
        let (c, dd) = (&run.case, run.case.head_dim);
        let want = &run.want[i];
        for (path, outs) in &run.per_path {
            let got = &outs[i];
            let (mut worst, mut differ) = (0.0f64, 0usize);
            for (row, (g, w)) in got.chunks(dd).zip(want.chunks(dd)).enumerate() {
                let head_max = w
                    .iter()
                    .map(|x| f64::from(x.to_f32()).abs())
                    .fold(0.0, f64::max);
                let tol = 2.0 * ulp(head_max);
                for (j, (&a, &b)) in g.iter().zip(w).enumerate() {
                    let e = (f64::from(a.to_f32()) - f64::from(b.to_f32())).abs();
                    differ += usize::from(a != b);
                    worst = worst.max(e / tol);
                    assert!(
                        e <= tol,
                        "[{path}] {} {what}: head row {row} element {j}: {a} vs reference {b} (tolerance {tol})",
                        c.name
                    );
                }
            }
            eprintln!(
                "[{path}] {} {what}: {differ} of {} differ from the reference, worst error / tolerance {worst:.2}",
                c.name,
                got.len()
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qk_norm_rope_q_matches_the_reference_on_both_paths() {
    check_norm_output(0, "q");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qk_norm_rope_k_cache_matches_the_reference_on_both_paths() {
    check_norm_output(1, "k cache");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qk_norm_rope_v_cache_equals_the_reference_on_both_paths() {
    for run in norm_runs() {
        for (path, outs) in &run.per_path {
            assert_same_bits(
                &format!("[{path}] {}: v cache", run.case.name),
                &outs[2],
                &run.want[2],
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qk_norm_rope_sass_equals_ptx() {
    for run in norm_runs() {
        let (sass, ptx) = (&run.per_path[0].1, &run.per_path[1].1);
        for (i, (a, b)) in sass.iter().zip(ptx).enumerate() {
            assert_same_bits(&format!("{} output {i}: SASS vs PTX", run.case.name), a, b);
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct AttnCase {
    name: &'static str,
    tokens: usize,
    start_pos: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Query tokens checked against the reference (all when 0).
    sampled: usize,
}

/// `q` and `out` are views this many elements into larger buffers (as the engine passes one
/// request's rows of a packed batch).
const ATTN_PAD: usize = 64;
/// What `out`'s elements before and after the view hold, and must still hold after the kernel.
const ATTN_SENTINEL: f32 = -7.25;

/// One attention run: q, a cache holding positions `0..start_pos + tokens` with NaN everywhere
/// else (never to be read), and the whole output buffer: [`ATTN_PAD`] elements of
/// [`ATTN_SENTINEL`] on each side of the output.
fn run_attention(kernels: &LoadedKernels, c: &AttnCase, q: &[bf16], cache: &Cache) -> Vec<bf16> {
    let s = kernels.stream();
    let p = AttentionPrefillParams {
        tokens: c.tokens,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        start_pos: c.start_pos,
        softmax_scale: AttentionPrefillParams::default_scale(c.head_dim),
    };
    let table = s.clone_htod(&cache.blocks).unwrap();
    let blocks = BlockTable {
        table: &table,
        offset: 0,
        len: cache.blocks.len(),
    };
    let (kc, vc) = (
        s.clone_htod(&cache.k).unwrap(),
        s.clone_htod(&cache.v).unwrap(),
    );
    let sentinel = bf16::from_f32(ATTN_SENTINEL);
    let mut out = s
        .clone_htod(&vec![sentinel; q.len() + 2 * ATTN_PAD])
        .unwrap();
    let mut padded_q = vec![bf16::from_f32(3.0); ATTN_PAD];
    padded_q.extend_from_slice(q);
    let q = s.clone_htod(&padded_q).unwrap();
    attention_prefill(
        kernels,
        dev_mut(kernels, &mut out).skip(ATTN_PAD).unwrap(),
        dev(kernels, &q).skip(ATTN_PAD).unwrap(),
        &kc,
        &vc,
        &blocks,
        &p,
    )
    .unwrap();
    s.clone_dtoh(&out).unwrap()
}

/// The output view of a [`run_attention`] buffer.
fn attention_view(all: &[bf16]) -> &[bf16] {
    &all[ATTN_PAD..all.len() - ATTN_PAD]
}

/// One attention case's inputs and each path's whole output buffer (SASS, then PTX).
struct AttnRun {
    case: AttnCase,
    q: Vec<bf16>,
    cache: Cache,
    /// The query tokens checked against the reference.
    tokens: Vec<usize>,
    per_path: Vec<(&'static str, Vec<bf16>)>,
}

/// Every attention case run once per binary on both paths, from the same inputs.
fn attention_runs() -> &'static [AttnRun] {
    static RUNS: OnceLock<Vec<AttnRun>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_attention_prefill runs");
        eprintln!("device \"{}\": {}", d.name, d.spec);
        let paths = load_both_paths(&d);
        eprintln!("{}", describe(&paths[0].1, "attention_prefill"));
        let case = |name, tokens, start_pos, q_heads, kv_heads, head_dim, sampled| AttnCase {
            name,
            tokens,
            start_pos,
            q_heads,
            kv_heads,
            head_dim,
            sampled,
        };
        let cases = [
            case("qwen3-4b 1024 tokens", 1024, 0, 32, 8, 128, 24),
            case("qwen3-4b chunk 700..777", 77, 700, 32, 8, 128, 12),
            case("qwen3-4b one token at 200", 1, 200, 32, 8, 128, 0),
            case("head_dim 64, no GQA (3/3)", 133, 5, 3, 3, 64, 0),
            case("head_dim 128, GQA 3 (6/2)", 50, 0, 6, 2, 128, 0),
            case("head_dim 256, GQA 8 (16/2)", 70, 31, 16, 2, 256, 0),
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut runs = Vec::new();
        for c in cases {
            let positions = c.start_pos + c.tokens;
            let mut cache = Cache::new(&mut rng, positions, c.kv_heads, c.head_dim, bf16::NAN);
            cache.fill_positions(&mut rng, positions);
            let q = random_bf16(&mut rng, c.tokens * c.q_heads * c.head_dim, 2.0);
            let mut tokens: Vec<usize> = (0..c.tokens).collect();
            if c.sampled > 0 {
                tokens.shuffle(&mut rng);
                tokens.truncate(c.sampled);
                tokens.extend([0, c.tokens - 1]);
            }
            let per_path = paths
                .iter()
                .map(|(path, kernels)| (*path, run_attention(kernels, &c, &q, &cache)))
                .collect();
            runs.push(AttnRun {
                case: c,
                q,
                cache,
                tokens,
                per_path,
            });
        }
        runs
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_writes_only_its_view() {
    let sentinel = bf16::from_f32(ATTN_SENTINEL);
    for run in attention_runs() {
        for (path, all) in &run.per_path {
            let (before, rest) = all.split_at(ATTN_PAD);
            let (_, after) = rest.split_at(rest.len() - ATTN_PAD);
            assert!(
                before.iter().chain(after).all(|&x| x == sentinel),
                "[{path}] {}: attention_prefill wrote outside its view",
                run.case.name
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_matches_the_reference_on_both_paths() {
    let v_max = 2.0;
    for run in attention_runs() {
        let (c, cache) = (&run.case, &run.cache);
        let p = AttentionPrefillParams {
            tokens: c.tokens,
            q_heads: c.q_heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            start_pos: c.start_pos,
            softmax_scale: AttentionPrefillParams::default_scale(c.head_dim),
        };
        for (path, all) in &run.per_path {
            let out = attention_view(all);
            let (mut worst, mut differ, mut checked) = (0.0f64, 0usize, 0usize);
            for &t in &run.tokens {
                for h in 0..c.q_heads {
                    let want =
                        attention_prefill_row(&run.q, &cache.k, &cache.v, &cache.blocks, &p, t, h);
                    let got = &out[(t * c.q_heads + h) * c.head_dim..][..c.head_dim];
                    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let (gf, wf) = (f64::from(g.to_f32()), f64::from(w.to_f32()));
                        let tol = ulp(wf) + v_max * 2f64.powi(-10);
                        let e = (gf - wf).abs();
                        assert!(
                            e <= tol,
                            "[{path}] {}: token {t} head {h} dim {j}: {g} vs reference {w}",
                            c.name
                        );
                        worst = worst.max(e / tol);
                        differ += usize::from(g != w);
                        checked += 1;
                    }
                }
            }
            eprintln!(
                "[{path}] {}: {differ} of {checked} checked outputs differ from the reference, worst error / tolerance {worst:.3}",
                c.name
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_sass_equals_ptx() {
    for run in attention_runs() {
        assert_same_bits(
            &format!("{}: SASS vs PTX", run.case.name),
            attention_view(&run.per_path[0].1),
            attention_view(&run.per_path[1].1),
        );
    }
    eprintln!("SASS and PTX outputs are bitwise identical");
}

/// One prompt's shape, its chunkings, and per chunking the q, k cache, v cache and attention
/// output of the whole prompt.
struct ChunkedPrefill {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    prompt: usize,
    chunkings: Vec<Vec<usize>>,
    results: Vec<[Vec<bf16>; 4]>,
}

impl ChunkedPrefill {
    fn what(&self, chunks: &[usize]) -> String {
        format!(
            "{}/{} heads of {}, {} tokens in {} chunks",
            self.q_heads,
            self.kv_heads,
            self.head_dim,
            self.prompt,
            chunks.len()
        )
    }
}

/// Every prompt of every chunking run once per binary under `auto`.
fn chunked_prefills() -> &'static [ChunkedPrefill] {
    static RUNS: OnceLock<Vec<ChunkedPrefill>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_prefill chunked runs");
        let kernels = load_auto(&d);
        let s = kernels.stream();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // The whole prefill step per chunk: q/k norm + RoPE writing the cache, then attention over
        // the cache so far. Every chunking must give the same q, cache and attention output bits.
        let mut runs = Vec::new();
        for (q_heads, kv_heads, head_dim, prompt, chunkings) in [
            (
                32,
                8,
                128,
                1024,
                vec![
                    vec![1024],
                    vec![1, 15, 16, 17, 100, 131, 256, 488],
                    vec![333, 333, 358],
                ],
            ),
            (
                6,
                2,
                128,
                200,
                vec![vec![200], vec![7; 28].into_iter().chain([4]).collect()],
            ),
            (16, 2, 256, 150, vec![vec![150], vec![31, 1, 64, 54]]),
            (3, 3, 64, 97, vec![vec![97], vec![50, 47], vec![1; 97]]),
        ] {
            let width = (q_heads + 2 * kv_heads) * head_dim;
            let qkv = random_bf16(&mut rng, prompt * width, 3.0);
            let (q_norm, k_norm) = (
                s.clone_htod(&random_bf16(&mut rng, head_dim, 1.5)).unwrap(),
                s.clone_htod(&random_bf16(&mut rng, head_dim, 1.5)).unwrap(),
            );
            let cos_sin = s.clone_htod(&cos_sin_cache(prompt, head_dim, 1e6)).unwrap();
            let cache = Cache::new(&mut rng, prompt, kv_heads, head_dim, bf16::NAN);
            let table = s.clone_htod(&cache.blocks).unwrap();
            let blocks = BlockTable {
                table: &table,
                offset: 0,
                len: cache.blocks.len(),
            };
            // Per chunking: q, k cache, v cache, attention output.
            let mut results: Vec<[Vec<bf16>; 4]> = Vec::new();
            for chunks in &chunkings {
                let mut kc = s.clone_htod(&cache.k).unwrap();
                let mut vc = s.clone_htod(&cache.v).unwrap();
                let (mut all_q, mut all_o) = (Vec::new(), Vec::new());
                let mut start = 0;
                for &t in chunks {
                    let p = QkNormRopeParams {
                        tokens: t,
                        q_heads,
                        kv_heads,
                        head_dim,
                        qkv_stride: width,
                        start_pos: start,
                        eps: 1e-6,
                        weight_offset: 0.0,
                    };
                    let qkv_dev = s
                        .clone_htod(&qkv[start * width..(start + t) * width])
                        .unwrap();
                    let inputs = QkNormRopeInputs {
                        qkv: dev(&kernels, &qkv_dev),
                        q_norm: &q_norm,
                        k_norm: &k_norm,
                        cos_sin: &cos_sin,
                        max_position: prompt,
                        blocks,
                    };
                    let mut q = s.alloc_zeros::<bf16>(t * q_heads * head_dim).unwrap();
                    qk_norm_rope_cache(
                        &kernels,
                        &inputs,
                        dev_mut(&kernels, &mut q),
                        &mut kc,
                        &mut vc,
                        &p,
                    )
                    .unwrap();
                    let ap = AttentionPrefillParams {
                        tokens: t,
                        q_heads,
                        kv_heads,
                        head_dim,
                        start_pos: start,
                        softmax_scale: AttentionPrefillParams::default_scale(head_dim),
                    };
                    let mut o = s.alloc_zeros::<bf16>(t * q_heads * head_dim).unwrap();
                    attention_prefill(
                        &kernels,
                        dev_mut(&kernels, &mut o),
                        dev(&kernels, &q),
                        &kc,
                        &vc,
                        &blocks,
                        &ap,
                    )
                    .unwrap();
                    all_q.extend(s.clone_dtoh(&q).unwrap());
                    all_o.extend(s.clone_dtoh(&o).unwrap());
                    start += t;
                }
                results.push([
                    all_q,
                    s.clone_dtoh(&kc).unwrap(),
                    s.clone_dtoh(&vc).unwrap(),
                    all_o,
                ]);
            }
            runs.push(ChunkedPrefill {
                q_heads,
                kv_heads,
                head_dim,
                prompt,
                chunkings,
                results,
            });
        }
        runs
    })
}

/// Output `i` (q, k cache, v cache, attention output) of every chunking bitwise equal to that of
/// one chunk.
fn check_chunked_output(i: usize, name: &str) {
    for run in chunked_prefills() {
        for (chunks, r) in run.chunkings.iter().zip(&run.results).skip(1) {
            let what = run.what(chunks);
            assert_same_bits(&format!("{what}: {name}"), &r[i], &run.results[0][i]);
            eprintln!("{what}: {name} bitwise equal to one chunk");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_prefill_attention_output_is_finite_in_every_chunking() {
    for run in chunked_prefills() {
        for (chunks, r) in run.chunkings.iter().zip(&run.results) {
            assert!(
                r[3].iter().all(|x| x.is_finite()),
                "{}: non-finite attention output",
                run.what(chunks)
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_prefill_q_does_not_depend_on_the_chunking() {
    check_chunked_output(0, "q");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_prefill_k_cache_does_not_depend_on_the_chunking() {
    check_chunked_output(1, "k cache");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_prefill_v_cache_does_not_depend_on_the_chunking() {
    check_chunked_output(2, "v cache");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_prefill_attention_does_not_depend_on_the_chunking() {
    check_chunked_output(3, "attention output");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_timings() {
    let d = device();
    let kernels = load_auto(&d);
    let s = kernels.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (q_heads, kv_heads, head_dim, tokens, sequences) = (32, 8, 128, 1024, 8);
    let mut caches = Vec::new();
    for _ in 0..sequences {
        let mut c = Cache::new(&mut rng, tokens, kv_heads, head_dim, bf16::ZERO);
        c.fill_positions(&mut rng, tokens);
        caches.push(c);
    }
    let q = s
        .clone_htod(&random_bf16(&mut rng, tokens * q_heads * head_dim, 2.0))
        .unwrap();
    let on_device: Vec<_> = caches
        .iter()
        .map(|c| {
            (
                s.clone_htod(&c.blocks).unwrap(),
                s.clone_htod(&c.k).unwrap(),
                s.clone_htod(&c.v).unwrap(),
            )
        })
        .collect();
    let mut out = s.alloc_zeros::<bf16>(tokens * q_heads * head_dim).unwrap();
    let p = AttentionPrefillParams {
        tokens,
        q_heads,
        kv_heads,
        head_dim,
        start_pos: 0,
        softmax_scale: AttentionPrefillParams::default_scale(head_dim),
    };
    let ms = time_ms(&kernels, 5, || {
        for (table, kc, vc) in &on_device {
            let blocks = BlockTable {
                table,
                offset: 0,
                len: table.len(),
            };
            attention_prefill(
                &kernels,
                dev_mut(&kernels, &mut out),
                dev(&kernels, &q),
                kc,
                vc,
                &blocks,
                &p,
            )
            .unwrap();
        }
    });
    // Causal: query t sees t + 1 keys; 4 flops per (query head, key, dim) for QK^T and PV.
    let flop =
        4.0 * (q_heads * head_dim) as f64 * (tokens * (tokens + 1) / 2) as f64 * sequences as f64;
    eprintln!(
        "attention_prefill {sequences} sequences x {tokens} tokens, 32/8 heads of 128: {ms:.3} ms per layer, {:.1} TFLOP/s",
        flop / f64::from(ms) / 1e9
    );
}

/// Device buffers that the refusal tests hand the launchers, sized for the shapes they pass.
struct Buffers {
    /// 64 x 64 zeros: the GEMM's `a` and `w`, attention's q.
    a: CudaSlice<bf16>,
    /// 64 x 64: the GEMM's output.
    c: CudaSlice<bf16>,
    /// A block table of two blocks, and a cache of two blocks of one head of 64.
    table: CudaSlice<i32>,
    cache: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
}

/// All of a block table of two blocks.
fn two_blocks(table: &CudaSlice<i32>) -> BlockTable<'_> {
    BlockTable {
        table,
        offset: 0,
        len: 2,
    }
}

/// Attention over one kv head with the given shape (scale 1/8).
fn bad_attention(
    tokens: usize,
    start_pos: usize,
    head_dim: usize,
    q_heads: usize,
) -> AttentionPrefillParams {
    AttentionPrefillParams {
        tokens,
        q_heads,
        kv_heads: 1,
        head_dim,
        start_pos,
        softmax_scale: 0.125,
    }
}

/// The error `call` returns on fresh buffers under `auto`; the stream still healthy after it.
fn refusal(call: impl FnOnce(&LoadedKernels, &mut Buffers) -> Result<(), OpsError>) -> String {
    let d = device();
    let kernels = load_auto(&d);
    let s = kernels.stream();
    let mut b = Buffers {
        a: s.alloc_zeros::<bf16>(64 * 64).unwrap(),
        c: s.alloc_zeros::<bf16>(64 * 64).unwrap(),
        table: s.clone_htod(&[0i32, 1]).unwrap(),
        cache: s.alloc_zeros::<bf16>(2 * block_elements(1, 64)).unwrap(),
        out: s.alloc_zeros::<bf16>(64 * 2 * 64).unwrap(),
    };
    let e = call(&kernels, &mut b).unwrap_err().to_string();
    s.synchronize().unwrap();
    e
}

/// The error of `attention_prefill` with `p` on the buffers: q the 64 x 64 zeros from element
/// `q_offset` on, the table's blocks from `table_offset` on.
fn attention_refusal(q_offset: usize, table_offset: usize, p: AttentionPrefillParams) -> String {
    refusal(|kernels, b| {
        let blocks = BlockTable {
            offset: table_offset,
            ..two_blocks(&b.table)
        };
        attention_prefill(
            kernels,
            dev_mut(kernels, &mut b.out),
            dev(kernels, &b.a).skip(q_offset).unwrap(),
            &b.cache,
            &b.cache,
            &blocks,
            &p,
        )
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_refuses_n_not_a_multiple_of_8() {
    let e = refusal(|kernels, b| {
        gemm_bf16(kernels, &mut b.c, &b.a, &b.a, &GemmShape::dense(8, 12, 64))
    });
    assert!(e.contains("multiples of 8"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemm_refuses_an_a_shorter_than_its_shape() {
    let e = refusal(|kernels, b| {
        gemm_bf16(kernels, &mut b.c, &b.a, &b.a, &GemmShape::dense(65, 64, 64))
    });
    assert!(e.contains("`a` holds 4096 elements"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_refuses_a_table_shorter_than_the_positions() {
    let e = attention_refusal(0, 0, bad_attention(8, 30, 64, 1));
    assert!(e.contains("need 3 cache blocks"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_refuses_a_view_off_a_16_byte_boundary() {
    // Refused before the kernel sees it.
    let e = attention_refusal(3, 0, bad_attention(8, 0, 64, 1));
    assert!(e.contains("16-byte boundary"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_refuses_head_dim_96() {
    let e = attention_refusal(0, 0, bad_attention(8, 0, 96, 1));
    assert!(e.contains("head_dim 96"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_refuses_more_than_8_query_heads_per_kv_head() {
    let e = attention_refusal(0, 0, bad_attention(1, 0, 64, 9));
    assert!(e.contains("at most 8"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_attention_prefill_refuses_blocks_outside_the_table() {
    let e = attention_refusal(0, 1, bad_attention(1, 0, 64, 1));
    assert!(e.contains("outside the table"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qk_norm_rope_refuses_positions_past_the_cos_sin_table() {
    let e = refusal(|kernels, b| {
        let s = kernels.stream();
        let cos_sin = s.alloc_zeros::<f32>(20 * 64).unwrap();
        let qkv = s.alloc_zeros::<bf16>(8 * 3 * 64).unwrap();
        let w = s.alloc_zeros::<bf16>(64).unwrap();
        let (mut kc, mut vc) = (b.cache.clone(), b.cache.clone());
        let inputs = QkNormRopeInputs {
            qkv: dev(kernels, &qkv),
            q_norm: &w,
            k_norm: &w,
            cos_sin: &cos_sin,
            max_position: 20,
            blocks: two_blocks(&b.table),
        };
        let np = QkNormRopeParams {
            tokens: 8,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 64,
            qkv_stride: 3 * 64,
            start_pos: 16,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        qk_norm_rope_cache(
            kernels,
            &inputs,
            dev_mut(kernels, &mut b.out),
            &mut kc,
            &mut vc,
            &np,
        )
    });
    assert!(e.contains("run past the cos/sin table of 20"), "{e}");
}
