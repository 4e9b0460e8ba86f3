//! Token sampling: greedy argmax and seeded temperature / top-k / top-p, defined so that the GPU
//! kernel and this CPU reference choose the same token bit for bit.
//!
//! The definition (for one row of logits `l`):
//! 1. Greedy (`temperature == 0`, or `top_k == 1`): the largest logit, lowest index on ties.
//!    NaN counts as -inf.
//! 2. Otherwise `s_i = l_i / temperature` (fp32). Order the tokens by `s` descending, index
//!    ascending on ties: the *rank order*.
//! 3. Each token's mass is an integer: `q_i = floor(exp_det(s_i - max s) * 2^32)`, where
//!    [`exp_det`] is a fixed sequence of IEEE fp32 operations (the kernel runs the same sequence),
//!    so masses and their sums are exact and independent of summation order.
//! 4. top-k (`top_k > 0`) keeps the first `top_k` tokens in rank order. top-p (`top_p < 1`) then
//!    keeps the shortest prefix (in rank order) of those whose mass reaches
//!    `ceil(top_p * Z_k)`, `Z_k` the mass top-k kept.
//! 5. Draw `t = floor(Z * u / 2^24)` with `u = random_u24(seed, SAMPLE_STREAM, counter)` and `Z`
//!    the kept mass; walk the kept tokens in *index* order and take the first whose cumulative
//!    mass exceeds `t`. (Any fixed order gives the same distribution; index order needs only a
//!    prefix sum on the GPU, no sort.)
//!
//! `counter` is the position of the token in the request's output (0 for the first), so a
//! request's samples do not depend on what else is in the batch.
//!
//! The kernel (module `sampling`, [`sample_tokens`]) samples a batch of rows, one block per row,
//! without sorting: see `kernels/sampling/sample.cu`.

use cudarc::driver::{CudaSlice, LaunchConfig};
use serde::{Deserialize, Serialize};

use super::launch::{
    check_len, check_rows, check_view, grid_dim, launch, to_i32, Arg, DevRef, OpsError, MAX_GRID_X,
};
use super::random::random_u24;
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "sampling";
pub const ENTRY: &str = "sample_tokens";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

/// The largest vocabulary [`sample_tokens`] accepts (Qwen3.5's 248,320 fits with room).
pub const MAX_VOCAB: usize = 1 << 24;
/// Threads per block of the kernel (one block per row).
const SAMPLE_THREADS: u32 = 1024;
/// The most candidates a row may have for the kernel's passes to run over them in shared memory
/// rather than over the row ([`sample_candidates`]; `kCandidates` in `kernels/sampling/sample.cu`).
pub const SAMPLE_CANDIDATES: usize = 2048;

/// The random stream sampling draws from (any fixed value distinct from the weight streams).
pub const SAMPLE_STREAM: u64 = 0x5341_4d50_4c45; // "SAMPLE"

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: u32,
    /// 1 means no top-p cut; must be in (0, 1].
    pub top_p: f32,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks the ranges; the message names the parameter and what it accepts.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "temperature {} must be a finite number >= 0 (0 is greedy)",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!(
                "top_p {} must be in (0, 1] (1 disables the cut)",
                self.top_p
            ));
        }
        Ok(())
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::GREEDY
    }
}

/// `exp(x)` for `x <= 0` as a fixed sequence of fp32 operations (round-to-nearest-even `rint`,
/// fused multiply-adds, an exact power-of-two scale). The CUDA twin in `aot_sampling.cuh` runs
/// the same sequence, so both produce the same bits. Accurate to a few ulps; 0 below -87.
pub fn exp_det(x: f32) -> f32 {
    if x.is_nan() || x < -87.0 {
        return 0.0;
    }
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split so that n * LN2_HI is exact for |n| < 2^8
    const LN2_LO: f32 = 1.428_606_8e-6;
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    // exp(r) on |r| <= ln2/2, Taylor to degree 7 (Horner with fma).
    let mut p: f32 = 1.0 / 5040.0;
    p = p.mul_add(r, 1.0 / 720.0);
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // 2^n for n in [-126, 0], built from its bits: an exact scale.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// The order-preserving key of a logit: larger logits have larger keys; NaN maps below -inf.
pub fn logit_key(x: f32) -> u32 {
    if x.is_nan() {
        return 0;
    }
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Greedy choice: the largest logit, lowest index on ties (NaN counts as -inf).
pub fn argmax_reference(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_key = 0u32;
    for (i, &l) in logits.iter().enumerate() {
        let k = logit_key(l);
        if i == 0 || k > best_key {
            best = i;
            best_key = k;
        }
    }
    best as u32
}

/// The integer mass `floor(exp_det(s - max) * 2^32)` of one scaled logit.
pub fn mass(s: f32, max: f32) -> u64 {
    let w = exp_det(s - max);
    (w * 4_294_967_296.0) as u64
}

/// Where the kernel runs a non-greedy row's passes after the maximum: `Some(n)` over its `n`
/// candidates in shared memory, `None` over the whole row (also for a greedy row). Candidates are
/// taken under top-k (`0 < top_k < vocab`) where the first radix digit (key bits 31..21) puts at
/// most [`SAMPLE_CANDIDATES`] tokens in the bins from the k-th ranked key's up; they are the
/// tokens of those bins with positive mass: a prefix of the rank order that holds every token the
/// kept set's mass sums and the draw can see, so the token is the same either way. Tests use this
/// to cover both paths.
pub fn sample_candidates(logits: &[f32], p: &SamplingParams) -> Option<usize> {
    candidates_within(logits, p, SAMPLE_CANDIDATES)
}

/// [`sample_candidates`] for a cap of `cap` candidates instead of the kernel's.
fn candidates_within(logits: &[f32], p: &SamplingParams, cap: usize) -> Option<usize> {
    let vocab = logits.len();
    if vocab == 0 || p.is_greedy() || p.top_k == 0 || p.top_k as usize >= vocab {
        return None;
    }
    let scaled: Vec<f32> = logits
        .iter()
        .map(|&l| scaled_logit(l, p.temperature))
        .collect();
    let max = scaled
        .iter()
        .copied()
        .max_by_key(|&s| logit_key(s))
        .unwrap_or(f32::NEG_INFINITY);
    if max == f32::NEG_INFINITY {
        return None;
    }
    let mut keys: Vec<u32> = scaled.iter().map(|&s| logit_key(s)).collect();
    let k = p.top_k as usize;
    let bin_floor = *keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a)).1 >> 21;
    let in_bins = keys.iter().filter(|&&key| key >> 21 >= bin_floor).count();
    (in_bins <= cap).then(|| {
        scaled
            .iter()
            .filter(|&&s| logit_key(s) >> 21 >= bin_floor && mass(s, max) != 0)
            .count()
    })
}

/// `l / temperature`, NaN as -inf: a token's scaled logit.
fn scaled_logit(l: f32, temperature: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l / temperature
    }
}

/// Reference for the `sample` kernel: the token chosen for one row of logits.
pub fn sample_reference(logits: &[f32], p: &SamplingParams, seed: u64, counter: u64) -> u32 {
    if logits.is_empty() {
        return 0;
    }
    if p.is_greedy() {
        return argmax_reference(logits);
    }
    let scaled: Vec<f32> = logits
        .iter()
        .map(|&l| scaled_logit(l, p.temperature))
        .collect();
    // Rank order: scaled value descending (by key), index ascending.
    let mut order: Vec<u32> = (0..scaled.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logit_key(scaled[b as usize])
            .cmp(&logit_key(scaled[a as usize]))
            .then(a.cmp(&b))
    });
    let max = scaled[order[0] as usize];
    if max == f32::NEG_INFINITY {
        return order[0];
    }
    let masses: Vec<u64> = scaled.iter().map(|&s| mass(s, max)).collect();

    let mut kept = if p.top_k > 0 {
        (p.top_k as usize).min(order.len())
    } else {
        order.len()
    };
    if p.top_p < 1.0 {
        let z_k: u64 = order[..kept].iter().map(|&i| masses[i as usize]).sum();
        let target = (f64::from(p.top_p) * z_k as f64).ceil() as u64;
        let mut cum = 0u64;
        for (n, &i) in order[..kept].iter().enumerate() {
            cum += masses[i as usize];
            if cum >= target {
                kept = n + 1;
                break;
            }
        }
    }
    let mut in_set = vec![false; scaled.len()];
    for &i in &order[..kept] {
        in_set[i as usize] = true;
    }
    let z: u64 = order[..kept].iter().map(|&i| masses[i as usize]).sum();
    let u = u128::from(random_u24(seed, SAMPLE_STREAM, counter));
    let t = ((u128::from(z) * u) >> 24) as u64;
    let mut cum = 0u64;
    for (i, (&m, &keep)) in masses.iter().zip(&in_set).enumerate() {
        if keep {
            cum += m;
            if cum > t {
                return i as u32;
            }
        }
    }
    // Unreachable: t < z and the walk covers all of z. Fall back to the top-ranked token.
    order[0]
}

/// The rows of logits [`sample_tokens`] reads: `rows` rows of `vocab` fp32 values, row starts
/// `row_stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogitsShape {
    pub rows: usize,
    pub vocab: usize,
    pub row_stride: usize,
}

/// Per-row sampling parameters on the device, one value per row each ([`SamplingParams`] split
/// into arrays, plus the row's seed and counter). Views, so that they may live side by side in
/// one allocation that a single copy fills (the decode engine uploads a pass's inputs that way).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSamplingParams<'a> {
    pub temperature: DevRef<'a, f32>,
    pub top_k: DevRef<'a, u32>,
    pub top_p: DevRef<'a, f32>,
    pub seed: DevRef<'a, u64>,
    pub counter: DevRef<'a, u64>,
}

/// `tokens[r] = sample_reference(logits row r, params of row r, seed[r], counter[r])` on the GPU,
/// bit for bit. The parameters are read on the device as they are (validate them on the host
/// with [`SamplingParams::validate`]; out-of-range values still follow the reference's rules).
pub fn sample_tokens(
    kernels: &LoadedKernels,
    tokens: &mut CudaSlice<i32>,
    logits: &CudaSlice<f32>,
    shape: &LogitsShape,
    params: &DeviceSamplingParams<'_>,
) -> Result<(), OpsError> {
    let op = "sample_tokens";
    if shape.rows == 0 || shape.vocab == 0 || shape.vocab > MAX_VOCAB {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "{shape:?}: need at least one row and a vocabulary of 1..={MAX_VOCAB}"
            ),
        });
    }
    check_rows(
        op,
        "logits",
        logits.len(),
        shape.rows,
        shape.vocab,
        shape.row_stride,
    )?;
    check_len(op, "tokens", tokens, &[shape.rows])?;
    check_view(op, "temperature", params.temperature.len(), &[shape.rows])?;
    check_view(op, "top_k", params.top_k.len(), &[shape.rows])?;
    check_view(op, "top_p", params.top_p.len(), &[shape.rows])?;
    check_view(op, "seed", params.seed.len(), &[shape.rows])?;
    check_view(op, "counter", params.counter.len(), &[shape.rows])?;
    let cfg = LaunchConfig {
        grid_dim: (grid_dim(op, "rows", shape.rows, MAX_GRID_X)?, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(
        kernels,
        op,
        MODULE,
        ENTRY,
        cfg,
        &mut [
            Arg::OutI32(tokens),
            Arg::InF32(logits),
            Arg::I32(to_i32(op, "vocab", shape.vocab)?),
            Arg::I32(to_i32(op, "row_stride", shape.row_stride)?),
            // The parameters' addresses, checked above (the kernel takes pointers).
            Arg::U64(params.temperature.addr()),
            Arg::U64(params.top_k.addr()),
            Arg::U64(params.top_p.addr()),
            Arg::U64(params.seed.addr()),
            Arg::U64(params.counter.addr()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The kernel's algorithm on the CPU, step for step: the kept set as a rank-order threshold
    /// (key, index) found by radix selection with count and mass histograms, ties resolved by one
    /// integer division and a scan in index order, the draw as a prefix sum in index order.
    /// Checked against the sort-based [`sample_reference`] below, so the GPU test that compares the
    /// kernel with the reference tests CUDA code whose algorithm is known to be right.
    mod threshold_model {
        use super::super::*;

        const DIGITS: [(u32, u32); 3] = [(21, 11), (10, 11), (0, 10)];

        /// A row and the tokens the passes run over (in index order): all, or the candidates.
        struct Row<'a> {
            logits: &'a [f32],
            temperature: f32,
            max: f32,
            items: Vec<usize>,
        }

        impl Row<'_> {
            fn scaled(&self, i: usize) -> f32 {
                scaled_logit(self.logits[i], self.temperature)
            }
            fn key(&self, i: usize) -> u32 {
                logit_key(self.scaled(i))
            }
        }

        fn in_prefix(key: u32, i: usize, set: (u32, usize)) -> bool {
            key > set.0 || (key == set.0 && i <= set.1)
        }

        /// One digit: (bin, total above the bin, count in the bin, mass in the bin).
        fn digit(
            row: &Row,
            prefix: u32,
            (shift, bits): (u32, u32),
            set: (u32, usize),
            need: u64,
            by_mass: bool,
        ) -> (u32, u64, u64, u64) {
            let bins = 1usize << bits;
            let high_mask = if shift + bits >= 32 {
                0
            } else {
                !0u32 << (shift + bits)
            };
            let (mut count, mut mass) = (vec![0u64; bins], vec![0u64; bins]);
            for &i in &row.items {
                let key = row.key(i);
                if (key ^ prefix) & high_mask != 0 || !in_prefix(key, i, set) {
                    continue;
                }
                let bin = ((key >> shift) as usize) & (bins - 1);
                let m = if by_mass {
                    super::super::mass(row.scaled(i), row.max)
                } else {
                    0
                };
                if by_mass && m == 0 {
                    continue;
                }
                count[bin] += 1;
                mass[bin] += m;
            }
            let mut below = 0u64;
            for b in (0..bins).rev() {
                let h = if by_mass { mass[b] } else { count[b] };
                if below < need && need <= below + h {
                    return (b as u32, below, count[b], mass[b]);
                }
                below += h;
            }
            unreachable!("need {need} exceeds the histogram total {below}");
        }

        fn nth_index_with_key(row: &Row, key: u32, n: u64) -> usize {
            row.items
                .iter()
                .copied()
                .filter(|&i| row.key(i) == key)
                .nth(n as usize - 1)
                .expect("n is at most the number of ties")
        }

        /// The kernel's steps: under top-k, its passes over the candidates when the k-th ranked
        /// key's first-digit bins and those above hold at most `cap` tokens (the kernel's cap is
        /// [`SAMPLE_CANDIDATES`]), else over the row.
        pub fn sample(
            logits: &[f32],
            p: &SamplingParams,
            seed: u64,
            counter: u64,
            cap: usize,
        ) -> u32 {
            if p.is_greedy() {
                return argmax_reference(logits);
            }
            let vocab = logits.len();
            let mut row = Row {
                logits,
                temperature: p.temperature,
                max: 0.0,
                items: (0..vocab).collect(),
            };
            let top = (0..vocab)
                .max_by_key(|&i| (row.key(i), std::cmp::Reverse(i)))
                .unwrap();
            row.max = row.scaled(top);
            if row.max == f32::NEG_INFINITY {
                return top as u32;
            }
            // Under top-k: the candidates (positive mass, the k-th ranked key's first digit or
            // above) where that digit's bins hold at most `cap` tokens.
            // (The first digit is also top-k's first step, which starts at the second below.)
            let mut gathered = None;
            let (mut bin0, mut below0) = (0, 0);
            if p.top_k > 0 && (p.top_k as usize) < vocab {
                let (bin_floor, above, in_bin, _) = digit(
                    &row,
                    0,
                    DIGITS[0],
                    (0, vocab - 1),
                    u64::from(p.top_k),
                    false,
                );
                (bin0, below0) = (bin_floor, above);
                if above + in_bin <= cap as u64 {
                    let candidates: Vec<usize> = (0..vocab)
                        .filter(|&i| {
                            row.key(i) >> 21 >= bin_floor && mass(row.scaled(i), row.max) != 0
                        })
                        .collect();
                    gathered = Some(candidates.len());
                    row.items = candidates;
                }
            }
            assert_eq!(gathered, candidates_within(logits, p, cap));
            let mut set = (0u32, vocab - 1);
            let kept = if p.top_k > 0 {
                (p.top_k as usize).min(vocab)
            } else {
                vocab
            };
            if kept < row.items.len() {
                let (mut prefix, mut need, mut ties) =
                    (bin0 << DIGITS[0].0, kept as u64 - below0, 0);
                for d in DIGITS.into_iter().skip(1) {
                    let (bin, below, count, _) =
                        digit(&row, prefix, d, (0, vocab - 1), need, false);
                    prefix |= bin << d.0;
                    need -= below;
                    ties = count;
                }
                let index = if need < ties {
                    nth_index_with_key(&row, prefix, need)
                } else {
                    vocab - 1
                };
                set = (prefix, index);
            }
            if p.top_p < 1.0 {
                let z_k: u64 = row
                    .items
                    .iter()
                    .filter(|&&i| in_prefix(row.key(i), i, set))
                    .map(|&i| mass(row.scaled(i), row.max))
                    .sum();
                let target = (f64::from(p.top_p) * z_k as f64).ceil() as u64;
                if target == 0 {
                    set = (row.key(top), top);
                } else {
                    let (mut prefix, mut need, mut ties, mut tie_mass) = (0u32, target, 0, 0);
                    for d in DIGITS {
                        let (bin, below, count, m) = digit(&row, prefix, d, set, need, true);
                        prefix |= bin << d.0;
                        need -= below;
                        ties = count;
                        tie_mass = m;
                    }
                    let m = tie_mass / ties;
                    let take = need.div_ceil(m);
                    let index = if take < ties {
                        nth_index_with_key(&row, prefix, take)
                    } else if prefix == set.0 {
                        set.1
                    } else {
                        vocab - 1
                    };
                    set = (prefix, index);
                }
            }
            let masses: Vec<(usize, u64)> = row
                .items
                .iter()
                .map(|&i| {
                    let m = if in_prefix(row.key(i), i, set) {
                        mass(row.scaled(i), row.max)
                    } else {
                        0
                    };
                    (i, m)
                })
                .collect();
            let z: u64 = masses.iter().map(|&(_, m)| m).sum();
            let u = u128::from(random_u24(seed, SAMPLE_STREAM, counter));
            let t = ((u128::from(z) * u) >> 24) as u64;
            let mut cum = 0u64;
            for &(i, m) in &masses {
                cum += m;
                if cum > t {
                    return i as u32;
                }
            }
            top as u32
        }
    }

    /// Rows that exercise the cases the kernel treats apart: ties at every cut, plateaus,
    /// infinities and NaNs, top-k beyond the vocabulary, tiny and large top-p, flat and peaked rows.
    fn tricky_row(rng: &mut impl Rng, vocab: usize) -> Vec<f32> {
        let kind = rng.gen_range(0..6);
        let mut row: Vec<f32> = (0..vocab)
            .map(|_| match kind {
                // Few distinct values: many ties.
                0 => rng.gen_range(0..4) as f32 * 0.75,
                // Narrow spread: everything has mass.
                1 => rng.gen_range(-1.0..1.0),
                // Wide spread: a few tokens carry the mass.
                2 => rng.gen_range(-40.0..25.0),
                _ => rng.gen_range(-8.0..8.0),
            })
            .collect();
        if kind == 4 {
            // Plateau at the top.
            let top = rng.gen_range(1..vocab.min(40) + 1);
            for _ in 0..top {
                let i = rng.gen_range(0..vocab);
                row[i] = 9.5;
            }
        }
        if kind == 5 {
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..vocab);
                row[i] = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0][rng.gen_range(0..4)];
            }
        }
        row
    }

    fn tricky_params(rng: &mut impl Rng, vocab: usize) -> SamplingParams {
        let temperature = [0.0, 0.3, 0.7, 1.0, 1.3, 2.5][rng.gen_range(0..6)];
        let top_k = match rng.gen_range(0..5) {
            0 => 0,
            1 => 1,
            2 => rng.gen_range(2..50),
            3 => rng.gen_range(1..vocab as u32 + 1),
            _ => vocab as u32 + rng.gen_range(0..3),
        };
        let top_p = match rng.gen_range(0..4) {
            0 => 1.0,
            1 => 1e-7,
            2 => rng.gen_range(0.05..1.0),
            _ => 0.9,
        };
        SamplingParams {
            temperature,
            top_k,
            top_p,
        }
    }

    #[test]
    fn the_kernels_threshold_algorithm_equals_the_sorting_definition() {
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Passes over the candidates where they fit the kernel's cap, smaller caps (the row
        // more often), and never (cap 0: always the row).
        let mut paths = [0usize; 2];
        for case in 0..600 {
            let vocab = [1, 2, 3, 7, 64, 301, 2048, 5003][case % 8];
            let logits = tricky_row(&mut rng, vocab);
            let p = tricky_params(&mut rng, vocab);
            let (s, c) = (rng.gen(), rng.gen_range(0..1000));
            let want = sample_reference(&logits, &p, s, c);
            if !p.is_greedy() {
                paths[usize::from(candidates_within(&logits, &p, 300).is_some())] += 1;
            }
            for cap in [SAMPLE_CANDIDATES, 300, 40, 0] {
                assert_eq!(
                    threshold_model::sample(&logits, &p, s, c, cap),
                    want,
                    "case {case} (cap {cap}): vocab {vocab}, {p:?}, seed {s}, counter {c}, logits {logits:?}"
                );
            }
        }
        eprintln!("non-greedy rows over the row / over candidates at a cap of 300: {paths:?}");
        assert!(
            paths[0] > 30 && paths[1] > 30,
            "rows over the row / over candidates at a cap of 300: {paths:?}"
        );
    }

    #[test]
    fn exp_det_is_close_to_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = f64::from(exp_det(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(exp_det(0.0), 1.0);
        assert_eq!(exp_det(-100.0), 0.0);
    }

    #[test]
    fn greedy_takes_the_lowest_index_of_the_maximum() {
        assert_eq!(argmax_reference(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax_reference(&[f32::NAN, -5.0]), 1);
        let p = SamplingParams {
            top_k: 1,
            temperature: 0.7,
            top_p: 1.0,
        };
        assert_eq!(sample_reference(&[0.0, 2.0, 1.0], &p, 1, 0), 1);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_choice() {
        let logits: Vec<f32> = (0..50)
            .map(|i| (i % 7) as f32 * 0.5 - (i as f32) * 0.01)
            .collect();
        let top2 = {
            let mut idx: Vec<usize> = (0..50).collect();
            idx.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
            [idx[0] as u32, idx[1] as u32]
        };
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        };
        for c in 0..200 {
            assert!(top2.contains(&sample_reference(&logits, &p, 9, c)));
        }
        // A tiny top_p keeps only the top-ranked token.
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1e-6,
        };
        for c in 0..50 {
            assert_eq!(sample_reference(&logits, &p, 9, c), top2[0]);
        }
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        };
        let mut counts = [0usize; 4];
        let n = 40_000;
        for c in 0..n {
            counts[sample_reference(&logits, &p, 1234, c) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (i, &l) in logits.iter().enumerate() {
            let want = f64::from(l).exp() / z;
            let got = counts[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
        // Same seed and counter, same token; the draw depends on the counter.
        assert_eq!(
            sample_reference(&logits, &p, 5, 3),
            sample_reference(&logits, &p, 5, 3)
        );
    }
}
