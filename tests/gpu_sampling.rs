//! The sampling kernel and the counter RNG on a real GPU, under both dispatch paths (exact SASS and
//! the PTX fallback), against their CPU definitions: exact equality, no tolerance.
//!
//! `#[ignore]`d: they need a CUDA GPU (run with `--include-ignored` there; the GPU bundle does).
//! The input seed is printed; rerun a failure with `AOT_TEST_SEED=<seed>`. One claim a test: the
//! runs that several claims check are made once per binary and shared.

mod gpu_common;

use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::init::fill_uniform_bf16;
use aot_kernels::ops::random::fill_uniform_bf16_reference;
use aot_kernels::ops::sampling::{
    sample_candidates, sample_reference, sample_tokens, DeviceSamplingParams, LogitsShape,
    SamplingParams, SAMPLE_CANDIDATES,
};
use aot_kernels::ops::{dev, dev_mut, OpsError};
use cudarc::driver::CudaSlice;
use gpu_common::{device, load_auto, load_both_paths, test_seed, time_ms};
use half::bf16;
use rand::{Rng, SeedableRng};
use std::sync::OnceLock;

/// A row of logits of one of several characters: LLM-like (a few strong candidates over a
/// broad tail), flat, very peaked, few distinct values (ties everywhere), a plateau at the top,
/// with NaN / infinities / signed zeros sprinkled in, or nothing but NaN and -inf (kind 6) or NaN
/// (kind 7), where greedy must still take the rank order's first: the lowest -inf, else index 0;
/// kind 8 is a trained model's shape: a bell-shaped tail (spread about 2.5) and a few tokens 8 to
/// 20 above it, which at Qwen's sampling settings leaves few candidates (`sample_candidates`).
fn logits_row(rng: &mut impl Rng, vocab: usize, kind: usize) -> Vec<f32> {
    if kind == 6 || kind == 7 {
        return (0..vocab)
            .map(|_| {
                if kind == 6 && rng.gen_range(0..3) == 0 {
                    f32::NEG_INFINITY
                } else if rng.gen() {
                    f32::NAN
                } else {
                    -f32::NAN
                }
            })
            .collect();
    }
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| match kind {
            0 => rng.gen_range(-6.0f32..6.0) + rng.gen_range(-6.0f32..0.0),
            8 => (0..3).map(|_| rng.gen_range(-2.5f32..2.5)).sum(),
            1 => rng.gen_range(-0.5..0.5),
            2 => rng.gen_range(-60.0..10.0),
            3 => rng.gen_range(0..5) as f32 * 0.5,
            _ => rng.gen_range(-10.0..10.0),
        })
        .collect();
    match kind {
        0 => {
            for _ in 0..rng.gen_range(1..30) {
                let i = rng.gen_range(0..vocab);
                row[i] = rng.gen_range(8.0..20.0);
            }
        }
        8 => {
            for _ in 0..rng.gen_range(1..12) {
                let i = rng.gen_range(0..vocab);
                row[i] = rng.gen_range(8.0..20.0);
            }
        }
        4 => {
            let top = rng.gen_range(2..vocab.clamp(3, 64));
            for _ in 0..top {
                let i = rng.gen_range(0..vocab);
                row[i] = 11.25;
            }
        }
        5 => {
            for _ in 0..rng.gen_range(1..6) {
                let i = rng.gen_range(0..vocab);
                row[i] =
                    [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.0][rng.gen_range(0..5)];
            }
        }
        _ => {}
    }
    row
}

fn params(rng: &mut impl Rng, vocab: usize, case: usize) -> SamplingParams {
    let temperature = [0.6f32, 1.0, 0.25, 1.7][rng.gen_range(0..4)];
    let (temperature, top_k, top_p) = match case % 11 {
        0 => (0.0, 0, 1.0),                                           // greedy
        1 => (temperature, 1, 1.0),                                   // greedy through top_k = 1
        2 => (temperature, 0, 1.0),                                   // temperature only
        3 => (temperature, rng.gen_range(2..100), 1.0),               // top-k
        4 => (temperature, 0, rng.gen_range(0.5..0.99)),              // top-p
        5 => (temperature, rng.gen_range(2..2000), 0.9),              // both
        6 => (temperature, vocab as u32 + rng.gen_range(0..9), 0.95), // k > V
        7 => (temperature, 0, 1e-6),                                  // tiny p: the top token
        9 => (0.6, 20, 0.95), // Qwen3's generation config (thinking)
        10 => (0.7, 20, 0.8), // Qwen3's non-thinking settings
        _ => (
            temperature,
            rng.gen_range(1..vocab as u32 + 1),
            rng.gen_range(0.01..1.0),
        ),
    };
    SamplingParams {
        temperature,
        top_k,
        top_p,
    }
}

struct Batch {
    shape: LogitsShape,
    logits: Vec<f32>,
    params: Vec<SamplingParams>,
    seeds: Vec<u64>,
    counters: Vec<u64>,
}

fn batch<R: Rng>(rng: &mut R, rows: usize, vocab: usize, pad: usize) -> Batch {
    batch_of(rng, rows, vocab, pad, 0..9, |rng, r| params(rng, vocab, r))
}

/// Rows of a trained model's shape (kind 8) under top-k settings (cases 3, 5, 9, 10): where the
/// kernel mostly samples over candidates.
fn top_k_batch<R: Rng>(rng: &mut R, rows: usize, vocab: usize) -> Batch {
    batch_of(rng, rows, vocab, 0, 8..9, |rng, r| {
        params(rng, vocab, [3, 5, 9, 10][r % 4])
    })
}

/// Greedy rows only (temperature 0 or top_k 1), of every kind.
fn greedy_batch<R: Rng>(rng: &mut R, rows: usize, vocab: usize, pad: usize) -> Batch {
    batch_of(rng, rows, vocab, pad, 0..9, |rng, r| {
        params(rng, vocab, 11 * r + r % 2)
    })
}

fn batch_of<R: Rng>(
    rng: &mut R,
    rows: usize,
    vocab: usize,
    pad: usize,
    kinds: std::ops::Range<usize>,
    mut params_for: impl FnMut(&mut R, usize) -> SamplingParams,
) -> Batch {
    let shape = LogitsShape {
        rows,
        vocab,
        row_stride: vocab + pad,
    };
    let mut logits = vec![f32::NAN; rows * shape.row_stride];
    let mut params_ = Vec::with_capacity(rows);
    for r in 0..rows {
        let kind = rng.gen_range(kinds.clone());
        let row = logits_row(rng, vocab, kind);
        logits[r * shape.row_stride..r * shape.row_stride + vocab].copy_from_slice(&row);
        params_.push(params_for(rng, r));
    }
    Batch {
        shape,
        logits,
        params: params_,
        seeds: (0..rows).map(|_| rng.gen()).collect(),
        counters: (0..rows).map(|_| rng.gen_range(0..4096)).collect(),
    }
}

fn run(kernels: &LoadedKernels, b: &Batch) -> Vec<i32> {
    let s = kernels.stream();
    let logits = s.clone_htod(&b.logits).unwrap();
    let temperature = s
        .clone_htod(&b.params.iter().map(|p| p.temperature).collect::<Vec<_>>())
        .unwrap();
    let top_k = s
        .clone_htod(&b.params.iter().map(|p| p.top_k).collect::<Vec<_>>())
        .unwrap();
    let top_p = s
        .clone_htod(&b.params.iter().map(|p| p.top_p).collect::<Vec<_>>())
        .unwrap();
    let seed = s.clone_htod(&b.seeds).unwrap();
    let counter = s.clone_htod(&b.counters).unwrap();
    let mut tokens = s.alloc_zeros::<i32>(b.shape.rows).unwrap();
    let p = DeviceSamplingParams {
        temperature: dev(kernels, &temperature),
        top_k: dev(kernels, &top_k),
        top_p: dev(kernels, &top_p),
        seed: dev(kernels, &seed),
        counter: dev(kernels, &counter),
    };
    sample_tokens(kernels, &mut tokens, &logits, &b.shape, &p).unwrap();
    s.clone_dtoh(&tokens).unwrap()
}

/// The sampling batches and each path's tokens for them.
struct SamplingRuns {
    seed: u64,
    batches: Vec<Batch>,
    /// Per path (SASS, then PTX), per batch, the tokens sampled.
    per_path: Vec<(&'static str, Vec<Vec<i32>>)>,
}

/// Every batch sampled once per binary on both paths.
fn sampling_runs() -> &'static SamplingRuns {
    static RUNS: OnceLock<SamplingRuns> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let seed = test_seed("gpu_sampling runs");
        eprintln!("device \"{}\": {}", d.name, d.spec);
        let paths = load_both_paths(&d);
        eprintln!("{}", gpu_common::describe(&paths[0].1, "sampling"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Qwen3's vocabulary (all kinds, then a trained model's shape under top-k), an odd one
        // with padded rows, Qwen3.5's, and tiny ones; then greedy rows alone, at 16-byte aligned
        // row starts and (stride 151,935) at every other alignment.
        let batches = vec![
            batch(&mut rng, 72, 151_936, 0),
            top_k_batch(&mut rng, 24, 151_936),
            greedy_batch(&mut rng, 16, 151_936, 0),
            greedy_batch(&mut rng, 16, 151_933, 2),
            greedy_batch(&mut rng, 12, 4_099, 0),
            batch(&mut rng, 27, 50_021, 3),
            batch(&mut rng, 9, 248_320, 0),
            batch(&mut rng, 36, 7, 1),
            batch(&mut rng, 9, 1, 0),
        ];
        let per_path = paths
            .iter()
            .map(|(path, kernels)| {
                (
                    *path,
                    batches.iter().map(|b| run(kernels, b)).collect::<Vec<_>>(),
                )
            })
            .collect();
        SamplingRuns {
            seed,
            batches,
            per_path,
        }
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_rows_take_both_candidate_paths() {
    let SamplingRuns { seed, batches, .. } = sampling_runs();
    // The kernel runs a row's passes over its candidates when they fit, else over the whole row:
    // both must be among the rows checked.
    let (mut within, mut past) = (0, 0);
    for b in batches {
        for (r, p) in b.params.iter().enumerate() {
            let row = &b.logits[r * b.shape.row_stride..][..b.shape.vocab];
            if !p.is_greedy() && b.shape.vocab > SAMPLE_CANDIDATES {
                match sample_candidates(row, p) {
                    Some(_) => within += 1,
                    None => past += 1,
                }
            }
        }
    }
    eprintln!("non-greedy rows longer than {SAMPLE_CANDIDATES}: {within} sampled over their candidates, {past} over the whole row");
    assert!(
        within >= 10 && past >= 10,
        "both candidate paths need rows (input seed {seed})"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_equals_the_reference_token_for_token() {
    let runs = sampling_runs();
    let mut mismatches = Vec::new();
    for (path, tokens) in &runs.per_path {
        for (b, got) in runs.batches.iter().zip(tokens) {
            for (r, &token) in got.iter().enumerate() {
                let row = &b.logits[r * b.shape.row_stride..][..b.shape.vocab];
                let want = sample_reference(row, &b.params[r], b.seeds[r], b.counters[r]);
                if token < 0 || token as u32 != want {
                    mismatches.push(format!(
                        "[{path}] vocab {} row {r}: kernel {token}, reference {want}; {:?} seed {} counter {}",
                        b.shape.vocab, b.params[r], b.seeds[r], b.counters[r]
                    ));
                }
            }
        }
        eprintln!(
            "[{path}] {} rows sampled",
            tokens.iter().map(Vec::len).sum::<usize>()
        );
    }
    for m in &mismatches {
        eprintln!("{m}");
    }
    assert!(
        mismatches.is_empty(),
        "{} rows differ from the reference (input seed {})",
        mismatches.len(),
        runs.seed
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_sass_equals_ptx() {
    let runs = sampling_runs();
    assert_eq!(
        runs.per_path[0].1, runs.per_path[1].1,
        "SASS and PTX chose differently"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_timings() {
    let d = device();
    let kernels = load_auto(&d);
    let mut rng = rand::rngs::StdRng::seed_from_u64(test_seed("gpu_sampling_timings"));
    let s = kernels.stream();
    let vocab = 151_936;
    let rows = 8;
    // Rows of a trained model's shape (kind 8).
    let host: Vec<f32> = (0..rows)
        .flat_map(|_| logits_row(&mut rng, vocab, 8))
        .collect();
    let logits = s.clone_htod(&host).unwrap();
    let shape = LogitsShape {
        rows,
        vocab,
        row_stride: vocab,
    };
    let seed = s.clone_htod(&[7u64; 8]).unwrap();
    let counter = s.clone_htod(&[0u64; 8]).unwrap();
    let mut tokens = s.alloc_zeros::<i32>(rows).unwrap();
    for (name, t, kk, pp) in [
        ("greedy", 0.0f32, 0u32, 1.0f32),
        ("temperature 0.7", 0.7, 0, 1.0),
        ("top-k 50", 0.7, 50, 1.0),
        ("top-p 0.9", 0.7, 0, 0.9),
        ("top-k 50 + top-p 0.9", 0.7, 50, 0.9),
        ("Qwen3 thinking (0.6, top-k 20, top-p 0.95)", 0.6, 20, 0.95),
        (
            "Qwen3 non-thinking (0.7, top-k 20, top-p 0.8)",
            0.7,
            20,
            0.8,
        ),
        ("temperature 1.5, flat tail", 1.5, 0, 1.0),
    ] {
        let temperature = s.clone_htod(&[t; 8]).unwrap();
        let top_k = s.clone_htod(&[kk; 8]).unwrap();
        let top_p = s.clone_htod(&[pp; 8]).unwrap();
        let p = DeviceSamplingParams {
            temperature: dev(&kernels, &temperature),
            top_k: dev(&kernels, &top_k),
            top_p: dev(&kernels, &top_p),
            seed: dev(&kernels, &seed),
            counter: dev(&kernels, &counter),
        };
        let ms = time_ms(&kernels, 20, || {
            sample_tokens(&kernels, &mut tokens, &logits, &shape, &p).unwrap()
        });
        let candidates: Vec<Option<usize>> = host
            .chunks(vocab)
            .map(|row| {
                sample_candidates(
                    row,
                    &SamplingParams {
                        temperature: t,
                        top_k: kk,
                        top_p: pp,
                    },
                )
            })
            .collect();
        eprintln!(
            "sample_tokens 8 x {vocab}, {name}: {:.1} us (candidates per row, None: the whole row: {candidates:?})",
            ms * 1e3
        );
    }
}

/// One `fill_uniform_bf16` call: n, seed, stream, scale, offset.
type FillCase = (usize, u64, u64, f32, f32);

/// The fill cases, and per path (SASS, then PTX) per case the output, 5 elements past n
/// included (allocated as zeros).
struct FillRuns {
    cases: Vec<FillCase>,
    per_path: Vec<(&'static str, Vec<Vec<bf16>>)>,
}

/// Every fill case run once per binary on both paths.
fn fill_runs() -> &'static FillRuns {
    static RUNS: OnceLock<FillRuns> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = device();
        let mut rng = rand::rngs::StdRng::seed_from_u64(test_seed("gpu_fill_uniform runs"));
        let cases: Vec<FillCase> = (0..3)
            .map(|i| {
                (
                    [1usize, 4_097, 3_000_017][i],
                    rng.gen(),
                    rng.gen(),
                    rng.gen_range(0.001..2.0),
                    rng.gen_range(-1.0..1.0),
                )
            })
            .collect();
        let per_path = load_both_paths(&d)
            .iter()
            .map(|(path, kernels)| {
                let s = kernels.stream();
                let outs: Vec<_> = cases
                    .iter()
                    .map(|&(n, seed, stream, scale, offset)| {
                        let mut out = s.alloc_zeros::<bf16>(n + 5).unwrap();
                        fill_uniform_bf16(
                            kernels,
                            dev_mut(kernels, &mut out),
                            n,
                            seed,
                            stream,
                            scale,
                            offset,
                        )
                        .unwrap();
                        s.clone_dtoh(&out).unwrap()
                    })
                    .collect();
                (*path, outs)
            })
            .collect();
        FillRuns { cases, per_path }
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_fill_uniform_equals_the_reference_bit_for_bit() {
    let runs = fill_runs();
    for (path, outs) in &runs.per_path {
        for (&(n, seed, stream, scale, offset), got) in runs.cases.iter().zip(outs) {
            let want = fill_uniform_bf16_reference(n, seed, stream, scale, offset);
            let first_diff = got[..n]
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                first_diff, None,
                "[{path}] n {n} seed {seed} stream {stream} scale {scale} offset {offset}: first difference"
            );
            eprintln!("[{path}] fill_uniform_bf16 n {n}: bitwise equal to the reference");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_fill_uniform_writes_nothing_past_n() {
    let runs = fill_runs();
    for (path, outs) in &runs.per_path {
        for (&(n, ..), got) in runs.cases.iter().zip(outs) {
            assert!(
                got[n..].iter().all(|v| v.to_bits() == 0),
                "[{path}] wrote past n"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_fill_uniform_sass_equals_ptx() {
    let runs = fill_runs();
    assert_eq!(runs.per_path[0].1, runs.per_path[1].1);
}

/// Device buffers that the refusal tests hand the launchers: 100 logits, two rows' parameters
/// and a counter of one row.
struct Buffers {
    logits: CudaSlice<f32>,
    f: CudaSlice<f32>,
    u: CudaSlice<u32>,
    w: CudaSlice<u64>,
    short: CudaSlice<u64>,
}

/// What the refused launchers would write: two tokens, and 4 bf16 outputs.
struct Outputs {
    tokens: CudaSlice<i32>,
    out: CudaSlice<bf16>,
}

impl Buffers {
    /// Parameters of the right length for two rows.
    fn params<'a>(&'a self, kernels: &'a LoadedKernels) -> DeviceSamplingParams<'a> {
        DeviceSamplingParams {
            temperature: dev(kernels, &self.f),
            top_k: dev(kernels, &self.u),
            top_p: dev(kernels, &self.f),
            seed: dev(kernels, &self.w),
            counter: dev(kernels, &self.w),
        }
    }
}

fn shape(rows: usize, vocab: usize, row_stride: usize) -> LogitsShape {
    LogitsShape {
        rows,
        vocab,
        row_stride,
    }
}

/// The error `call` returns on fresh buffers under `auto`. Nothing was launched: the stream is
/// healthy after it.
fn refusal(
    call: impl FnOnce(&LoadedKernels, &Buffers, &mut Outputs) -> Result<(), OpsError>,
) -> String {
    let d = device();
    let kernels = load_auto(&d);
    let s = kernels.stream();
    let b = Buffers {
        logits: s.alloc_zeros::<f32>(100).unwrap(),
        f: s.alloc_zeros::<f32>(2).unwrap(),
        u: s.alloc_zeros::<u32>(2).unwrap(),
        w: s.alloc_zeros::<u64>(2).unwrap(),
        short: s.alloc_zeros::<u64>(1).unwrap(),
    };
    let mut o = Outputs {
        tokens: s.alloc_zeros::<i32>(2).unwrap(),
        out: s.alloc_zeros::<bf16>(4).unwrap(),
    };
    let e = call(&kernels, &b, &mut o).unwrap_err().to_string();
    s.synchronize().unwrap();
    e
}

/// `sample_tokens` on the buffers' logits, into their tokens, with parameters of the right
/// length for two rows, or (`short_counter`) with a counter of one row.
fn sample_refusal(shape: LogitsShape, short_counter: bool) -> String {
    refusal(|kernels, b, o| {
        let mut params = b.params(kernels);
        if short_counter {
            params.counter = dev(kernels, &b.short);
        }
        sample_tokens(kernels, &mut o.tokens, &b.logits, &shape, &params)
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_refuses_logits_shorter_than_the_shape() {
    let e = sample_refusal(shape(2, 60, 60), false);
    assert!(e.contains("`logits` holds 100 elements"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_refuses_a_row_stride_shorter_than_the_vocabulary() {
    let e = sample_refusal(shape(2, 50, 40), false);
    assert!(e.contains("row stride 40 is shorter"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_refuses_an_empty_vocabulary() {
    let e = sample_refusal(shape(2, 0, 0), false);
    assert!(e.contains("vocabulary"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_sampling_refuses_a_counter_shorter_than_the_rows() {
    let e = sample_refusal(shape(2, 50, 50), true);
    assert!(e.contains("`counter` holds 1 elements"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_fill_uniform_refuses_an_out_shorter_than_n() {
    let e = refusal(|kernels, _, o| {
        fill_uniform_bf16(kernels, dev_mut(kernels, &mut o.out), 5, 1, 2, 1.0, 0.0)
    });
    assert!(e.contains("`out` holds 4 elements"), "{e}");
}
