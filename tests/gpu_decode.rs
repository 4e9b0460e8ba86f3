//! The decode kernels (embedding, fused GEMV, paged decode attention) on a real GPU, against their
//! CPU references, on fresh random inputs at the Qwen3-4B shapes and at odd sizes.
//!
//! `#[ignore]`d: without a GPU they are listed as ignored, never passed; asked to run
//! (`--include-ignored`) without one they fail. Each test prints its input seed.
//! Checks: outputs within the stated tolerance of the float64 reference; SASS (`auto`) and PTX
//! (`ptx-only`) bitwise equal; a token's result identical alone and in a batch of 8; a split-K
//! launch replayed from a CUDA graph equal to the eager one (the arrival counters reset).
//! Bandwidth of the Qwen3-4B projections is printed (measured with CUDA events; never asserted).

use aot_kernels::dispatch::{
    load_modules, open_device, LoadedKernels, ModuleSource, OpenDevice, Policy,
};
use aot_kernels::ops::attention::{
    attention_decode, attention_decode_reference, attn_scratch_needs, attn_splits, AttnDecode,
    AttnScratch, BLOCK_TOKENS,
};
use aot_kernels::ops::compare::ulp_distance;
use aot_kernels::ops::embedding::{embedding, embedding_reference};
use aot_kernels::ops::gemv::{
    gemv, gemv_reference, gemv_scratch_needs, norm_input_reference, qkv_head_reference,
    residual_groups, residual_reference, silu_mul_reference, GemvInput, GemvOutput, GemvScratch,
    QkvRope, QkvShape, MAX_TOKENS,
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
    load_modules(d, 0, policy, &ModuleSource::registry()).unwrap()
}

fn rand_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

fn seed(test: &str) -> StdRng {
    let s: u64 = rand::random();
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

struct Scratch {
    ws: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

impl Scratch {
    fn new(s: &Arc<CudaStream>, floats: usize, counters: usize) -> Self {
        Scratch {
            ws: s.alloc_zeros(floats.max(1)).unwrap(),
            counters: s.alloc_zeros(counters.max(1)).unwrap(),
        }
    }
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

/// Runs one case for `m` tokens on `k` kernels; returns the outputs (bf16 bits or f32 bits as u32).
#[allow(clippy::too_many_arguments)]
fn run_gemv(
    kr: &LoadedKernels,
    c: &GemvCase,
    m: usize,
    w: &[bf16],
    x: &[bf16],
    ssq: &[f32],
    nw: &[bf16],
    h0: &[bf16],
) -> Vec<u32> {
    let s = kr.stream();
    let dw = upload(s, w);
    let dx = upload(s, x);
    let mut ssq8 = vec![0.0f32; MAX_TOKENS];
    ssq8[..m].copy_from_slice(&ssq[..m]);
    let dssq = upload(s, &ssq8);
    let dnw = upload(s, nw);
    let (ws, cn) = gemv_scratch_needs(c.n, c.k, 32, kr.sm_count());
    let mut sc = Scratch::new(s, ws, cn);
    let input = if c.norm {
        GemvInput::Norm {
            h: dev(kr, &dx),
            ld_h: c.k,
            ssq: dev(kr, &dssq),
            ssq_groups: 1,
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
    let mut scratch = GemvScratch {
        ws: dev_mut(kr, &mut sc.ws),
        counters: dev_mut(kr, &mut sc.counters),
    };
    let out = match c.epi {
        Epi::Bf16 => {
            let mut o = s.alloc_zeros::<bf16>(m * c.n).unwrap();
            gemv(
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
                &mut scratch,
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
            gemv(
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
                &mut scratch,
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
            gemv(
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
                &mut scratch,
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
            gemv(
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
                &mut scratch,
            )
            .unwrap();
            s.clone_dtoh(&o)
                .unwrap()
                .iter()
                .map(|v| v.to_bits() as u32)
                .collect()
        }
    };
    // Counters must be back at zero for the next launch.
    let counters = s.clone_dtoh(&sc.counters).unwrap();
    assert!(
        counters.iter().all(|&c| c == 0),
        "{}: arrival counters left non-zero",
        c.name
    );
    out
}

fn bf16s(v: &[u32]) -> Vec<bf16> {
    v.iter().map(|&b| bf16::from_bits(b as u16)).collect()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gemv_epilogues_match_reference_batch_independent_sass_equals_ptx() {
    let mut rng = seed("gemv");
    let d = device();
    let sass = kernels(&d, Policy::Auto);
    let ptx = kernels(&d, Policy::PtxOnly);
    let cases = [
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
    ];
    for c in &cases {
        for m in [1usize, 3, 8] {
            let w = rand_bf16(&mut rng, c.n * c.k, (3.0 / c.k as f32).sqrt());
            let x = rand_bf16(&mut rng, m * c.k, 1.5);
            let nw = rand_bf16(&mut rng, c.k, 1.0);
            let ssq: Vec<f32> = x
                .chunks(c.k)
                .map(|r| r.iter().map(|v| v.to_f32() * v.to_f32()).sum())
                .collect();
            let h0 = rand_bf16(&mut rng, m * c.n, 2.0);
            let got = run_gemv(&sass, c, m, &w, &x, &ssq, &nw, &h0);
            let got_ptx = run_gemv(&ptx, c, m, &w, &x, &ssq, &nw, &h0);
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
            match c.epi {
                Epi::Bf16 => check_bf16(
                    &label,
                    &bf16s(&got),
                    &y.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
                    1,
                    abs,
                ),
                Epi::F32 => {
                    let worst = got
                        .iter()
                        .zip(&y)
                        .map(|(&g, &r)| (f64::from(f32::from_bits(g)) - r).abs())
                        .fold(0.0, f64::max);
                    eprintln!("  {label}: max |f32 - f64| = {worst:.2e}");
                    assert!(worst < 1e-3, "{label}: {worst}");
                }
                Epi::Residual => {
                    let (want_h, want_ssq) = residual_reference(&y, &h0, c.n, m);
                    // h + bf16(y): a one-ulp flip in rounding y is up to one ulp of y in the sum.
                    check_bf16_with(&label, &bf16s(&got[..m * c.n]), &want_h, 1, |i| {
                        abs.max(bf16_ulp(y[i] as f32).max(bf16_ulp(h0[i].to_f32())))
                    });
                    for g in 0..residual_groups(c.n) {
                        for t in 0..m {
                            let got_s = f32::from_bits(got[m * c.n + g * MAX_TOKENS + t]);
                            let want_s = want_ssq[g * MAX_TOKENS + t];
                            assert!(
                                (got_s - want_s).abs() <= 1e-3 * want_s.abs() + 0.05,
                                "{label}: ssq[{g}][{t}] {got_s} vs {want_s}"
                            );
                        }
                    }
                }
                Epi::SiluMul => check_bf16(
                    &label,
                    &bf16s(&got),
                    &silu_mul_reference(&y, c.n / 2, m),
                    2,
                    abs,
                ),
            }
            // Token j's result alone equals its result in the batch (residual output: h rows only).
            if m > 1 {
                let j = m - 1;
                let alone = run_gemv(
                    &sass,
                    c,
                    1,
                    &w,
                    &x[j * c.k..],
                    &ssq[j..],
                    &nw,
                    &h0[j * c.n..],
                );
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
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qkv_rope_writes_q_and_the_paged_cache() {
    let mut rng = seed("qkv_rope");
    let d = device();
    for policy in [Policy::Auto, Policy::PtxOnly] {
        let kr = kernels(&d, policy);
        let s = kr.stream();
        for (q_heads, kv_heads, hd, k) in [
            (32usize, 8usize, 128usize, 2560usize),
            (16, 2, 256, 2048),
            (4, 2, 64, 320),
            (6, 6, 64, 200),
        ] {
            let m = 8;
            let n = (q_heads + 2 * kv_heads) * hd;
            let max_pos = 4096;
            let blocks = 64;
            let ld_bt = 8;
            let w = rand_bf16(&mut rng, n * k, (3.0 / k as f32).sqrt());
            let x = rand_bf16(&mut rng, m * k, 1.5);
            let qn = rand_bf16(&mut rng, hd, 1.2);
            let kn = rand_bf16(&mut rng, hd, 1.2);
            let cs = cos_sin_cache(max_pos, hd, 1e6);
            // Each row its own slot with a random block table; positions anywhere in the table.
            let mut table = vec![-1i32; m * ld_bt];
            let mut free: Vec<i32> = (0..blocks as i32).collect();
            for v in table.iter_mut() {
                let i = rng.gen_range(0..free.len());
                *v = free.swap_remove(i);
            }
            let slots: Vec<i32> = (0..m as i32).rev().collect();
            let positions: Vec<i32> = (0..m)
                .map(|_| rng.gen_range(0..(ld_bt * BLOCK_TOKENS) as i32))
                .collect();
            let dw = upload(s, &w);
            let dx = upload(s, &x);
            let (dqn, dkn, dcs, dtab, dslots, dpos) = (
                upload(s, &qn),
                upload(s, &kn),
                upload(s, &cs),
                upload(s, &table),
                upload(s, &slots),
                upload(s, &positions),
            );
            let mut q_out = s.alloc_zeros::<bf16>(m * q_heads * hd).unwrap();
            let cache_elems = blocks * kv_heads * BLOCK_TOKENS * hd;
            let mut kc = s.alloc_zeros::<bf16>(cache_elems).unwrap();
            let mut vc = s.alloc_zeros::<bf16>(cache_elems).unwrap();
            let (ws, cn) = gemv_scratch_needs(n, k, hd, kr.sm_count());
            let mut sc = Scratch::new(s, ws, cn);
            let mut scratch = GemvScratch {
                ws: dev_mut(&kr, &mut sc.ws),
                counters: dev_mut(&kr, &mut sc.counters),
            };
            gemv(
                &kr,
                dev(&kr, &dw),
                n,
                k,
                m,
                &GemvInput::Plain {
                    x: dev(&kr, &dx),
                    ld_x: k,
                },
                GemvOutput::QkvRope(QkvRope {
                    q_out: dev_mut(&kr, &mut q_out),
                    ld_q: q_heads * hd,
                    q_norm: dev(&kr, &dqn),
                    k_norm: dev(&kr, &dkn),
                    eps: 1e-6,
                    weight_offset: 0.0,
                    cos_sin: dev(&kr, &dcs),
                    max_pos,
                    k_cache: dev_mut(&kr, &mut kc),
                    v_cache: dev_mut(&kr, &mut vc),
                    block_table: dev(&kr, &dtab),
                    ld_bt,
                    slot_of_row: dev(&kr, &dslots),
                    positions: dev(&kr, &dpos),
                    q_heads,
                    kv_heads,
                    head_dim: hd,
                }),
                &mut scratch,
            )
            .unwrap();
            let (gq, gk, gv) = (
                s.clone_dtoh(&q_out).unwrap(),
                s.clone_dtoh(&kc).unwrap(),
                s.clone_dtoh(&vc).unwrap(),
            );
            let y = gemv_reference(&w, n, k, &x, m);
            let shape = QkvShape {
                q_heads,
                kv_heads,
                head_dim: hd,
                eps: 1e-6,
                weight_offset: 0.0,
            };
            let (mut wq, mut wk, mut wv, mut got_k, mut got_v) =
                (vec![], vec![], vec![], vec![], vec![]);
            for t in 0..m {
                let pos = positions[t] as usize;
                let csr = &cs[pos * hd..(pos + 1) * hd];
                let blk = table[slots[t] as usize * ld_bt + pos / BLOCK_TOKENS] as usize;
                for h in 0..q_heads + 2 * kv_heads {
                    let yh = &y[t * n + h * hd..t * n + (h + 1) * hd];
                    if h < q_heads {
                        wq.extend(qkv_head_reference(yh, Some(&qn), csr, &shape));
                    } else {
                        let kvh = if h < q_heads + kv_heads {
                            h - q_heads
                        } else {
                            h - q_heads - kv_heads
                        };
                        let at = ((blk * kv_heads + kvh) * BLOCK_TOKENS + pos % BLOCK_TOKENS) * hd;
                        if h < q_heads + kv_heads {
                            wk.extend(qkv_head_reference(yh, Some(&kn), csr, &shape));
                            got_k.extend_from_slice(&gk[at..at + hd]);
                        } else {
                            wv.extend(qkv_head_reference(yh, None, csr, &shape));
                            got_v.extend_from_slice(&gv[at..at + hd]);
                        }
                    }
                }
            }
            let label = format!("{policy} qkv {q_heads}/{kv_heads}x{hd} k={k}");
            check_bf16(&format!("{label} q"), &gq, &wq, 2, 2e-2);
            check_bf16(&format!("{label} k cache"), &got_k, &wk, 2, 2e-2);
            check_bf16(&format!("{label} v cache"), &got_v, &wv, 1, 2e-3);
            let written = gk.iter().filter(|v| v.to_bits() != 0).count();
            assert!(
                written <= m * kv_heads * hd,
                "{label}: the cache has writes outside the rows' positions"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_decode_attention_matches_reference_over_paged_cache() {
    let mut rng = seed("attention");
    let d = device();
    let sass = kernels(&d, Policy::Auto);
    let ptx = kernels(&d, Policy::PtxOnly);
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
    ] {
        let m = ctxs.len();
        let ld_bt = ctxs.iter().map(|c| c.div_ceil(BLOCK_TOKENS)).max().unwrap() + 1;
        let blocks = m * ld_bt;
        let block_elems = kv_heads * BLOCK_TOKENS * hd;
        let kc = rand_bf16(&mut rng, blocks * block_elems, 1.0);
        let vc = rand_bf16(&mut rng, blocks * block_elems, 1.0);
        let q = rand_bf16(&mut rng, m * q_heads * hd, 2.0);
        let mut ids: Vec<i32> = (0..blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.gen_range(0..=i));
        }
        let slots: Vec<i32> = (0..m as i32).collect();
        let grid = ctxs.iter().map(|&c| attn_splits(c).0).max().unwrap();
        let run = |kr: &LoadedKernels, rows: &[usize]| -> Vec<bf16> {
            let s = kr.stream();
            let mr = rows.len();
            let sub_q: Vec<bf16> = rows
                .iter()
                .flat_map(|&r| q[r * q_heads * hd..(r + 1) * q_heads * hd].to_vec())
                .collect();
            let sub_slots: Vec<i32> = rows.iter().map(|&r| slots[r]).collect();
            let sub_ctx: Vec<i32> = rows.iter().map(|&r| ctxs[r] as i32).collect();
            let (dq, dk, dv, dt, ds, dc) = (
                upload(s, &sub_q),
                upload(s, &kc),
                upload(s, &vc),
                upload(s, &ids),
                upload(s, &sub_slots),
                upload(s, &sub_ctx),
            );
            let mut out = s.alloc_zeros::<bf16>(mr * q_heads * hd).unwrap();
            let (a, b, c) = attn_scratch_needs(mr, q_heads, kv_heads, hd);
            let (mut wml, mut wo, mut cnt) = (
                s.alloc_zeros::<f32>(a).unwrap(),
                s.alloc_zeros::<f32>(b).unwrap(),
                s.alloc_zeros::<u32>(c).unwrap(),
            );
            attention_decode(
                kr,
                AttnDecode {
                    q: dev(kr, &dq),
                    k_cache: dev(kr, &dk),
                    v_cache: dev(kr, &dv),
                    block_table: dev(kr, &dt),
                    ld_bt,
                    slot_of_row: dev(kr, &ds),
                    ctx_lens: dev(kr, &dc),
                    out: dev_mut(kr, &mut out),
                    m: mr,
                    q_heads,
                    kv_heads,
                    head_dim: hd,
                    grid_splits: grid,
                },
                &mut AttnScratch {
                    ws_ml: dev_mut(kr, &mut wml),
                    ws_o: dev_mut(kr, &mut wo),
                    counters: dev_mut(kr, &mut cnt),
                },
            )
            .unwrap();
            assert!(
                s.clone_dtoh(&cnt).unwrap().iter().all(|&c| c == 0),
                "counters left non-zero"
            );
            s.clone_dtoh(&out).unwrap()
        };
        let all: Vec<usize> = (0..m).collect();
        let got = run(&sass, &all);
        assert_eq!(got, run(&ptx, &all), "SASS and PTX differ");
        for (r, &ctx) in ctxs.iter().enumerate() {
            // Gather the row's keys and values in position order through its block table.
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for pos in 0..ctx {
                let blk = ids[slots[r] as usize * ld_bt + pos / BLOCK_TOKENS] as usize;
                for h in 0..kv_heads {
                    let at = ((blk * kv_heads + h) * BLOCK_TOKENS + pos % BLOCK_TOKENS) * hd;
                    keys.extend_from_slice(&kc[at..at + hd]);
                    values.extend_from_slice(&vc[at..at + hd]);
                }
            }
            let want = attention_decode_reference(
                &q[r * q_heads * hd..(r + 1) * q_heads * hd],
                &keys,
                &values,
                ctx,
                q_heads,
                kv_heads,
                hd,
            );
            let label = format!(
                "attention {q_heads}/{kv_heads}x{hd} ctx {ctx} ({} splits)",
                attn_splits(ctx).0
            );
            check_bf16(
                &label,
                &got[r * q_heads * hd..(r + 1) * q_heads * hd],
                &want,
                2,
                2e-3,
            );
            if m > 1 {
                let alone = run(&sass, &[r]);
                assert_eq!(
                    alone,
                    got[r * q_heads * hd..(r + 1) * q_heads * hd],
                    "{label}: alone differs from batched"
                );
            }
        }
    }
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
    // down_proj shape: 7 splits, so counters are used and must reset between replays.
    let (n, k, m) = (2560usize, 9728usize, 4usize);
    let w = upload(s, &rand_bf16(&mut rng, n * k, 0.02));
    let x = upload(s, &rand_bf16(&mut rng, m * k, 1.0));
    let (ws, cn) = gemv_scratch_needs(n, k, 32, kr.sm_count());
    let mut sc = Scratch::new(s, ws, cn);
    let mut out = s.alloc_zeros::<bf16>(m * n).unwrap();
    let launch = |sc: &mut Scratch, out: &mut CudaSlice<bf16>| {
        let mut scratch = GemvScratch {
            ws: dev_mut(&kr, &mut sc.ws),
            counters: dev_mut(&kr, &mut sc.counters),
        };
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
            &mut scratch,
        )
        .unwrap();
    };
    launch(&mut sc, &mut out);
    let eager = s.clone_dtoh(&out).unwrap();
    s.memset_zeros(&mut out).unwrap();
    s.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    launch(&mut sc, &mut out);
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
        let (ws, cn) = gemv_scratch_needs(n, k, 32, kr.sm_count());
        let mut sc = Scratch::new(s, ws, cn);
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
                let mut scratch = GemvScratch {
                    ws: dev_mut(&kr, &mut sc.ws),
                    counters: dev_mut(&kr, &mut sc.counters),
                };
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
                    &mut scratch,
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
