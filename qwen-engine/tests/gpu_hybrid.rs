//! The hybrid Qwen3.5/3.6 MoE family on the GPU against the transformers oracle, and against
//! itself across policies, batching, prompt chunking and slot reuse. Needs a CUDA GPU (the tests
//! are `#[ignore]`d) and fixtures of the shapes the GPU's Gated DeltaNet and MoE kernels are
//! compiled for (Qwen3.5/3.6-35B-A3B's; a few layers): they are gigabytes, so they are made on the
//! GPU machine, not committed:
//!
//! ```text
//! python3 scripts/oracle/make_hybrid_fixtures.py --a3b-shapes --out /tmp/hybrid-a3b --device cuda
//! QWEN_HYBRID_GPU_FIXTURES=/tmp/hybrid-a3b cargo test --release --test gpu_hybrid -- --include-ignored
//! ```
//!
//! Without the variable the tests fail (they never pass without having run). The yardsticks are
//! those of the dense GPU tests (gpu_engine.rs): teacher-forced logits within `NOISE_FACTOR` times
//! transformers' own bf16 distance from float32, and the greedy choice equal to the oracle's at every
//! step whose margin exceeds `MARGIN_FACTOR` times the measured noise.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use aot_kernels::dispatch::{ModuleSource, Policy, ToolchainChoice};
use aot_kernels::registry::ModuleKind;
use common::driver::{run, Generation, Request};
use common::fixtures::{self, Fixture};
use qwen_engine::gpu::hybrid::HybridGpuRunner;
use qwen_engine::gpu::{DecodeStep, GpuOptions};
use qwen_engine::model::ModelConfig;
use qwen_engine::weights::Weights;

const NOISE_FACTOR: f32 = 1.5;
const MARGIN_FACTOR: f64 = 2.0;

fn gpu_fixtures() -> Vec<Fixture> {
    let dir = std::env::var_os("QWEN_HYBRID_GPU_FIXTURES")
        .map(PathBuf::from)
        .expect(
            "set QWEN_HYBRID_GPU_FIXTURES to fixtures made by \
         `scripts/oracle/make_hybrid_fixtures.py --a3b-shapes` (see this file's header)",
        );
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "{}: no fixtures", dir.display());
    dirs.iter().map(|d| fixtures::load(d)).collect()
}

/// How a run loads and launches: the policy, the modules taken from their PTX whatever the
/// policy, CUDA graphs on or off.
#[derive(Debug, Clone)]
struct Mode {
    label: &'static str,
    policy: Policy,
    ptx_modules: Vec<String>,
    graphs: bool,
}

impl Mode {
    fn of(label: &'static str, policy: Policy, graphs: bool) -> Mode {
        Mode {
            label,
            policy,
            ptx_modules: Vec::new(),
            graphs,
        }
    }

    fn options(&self, toolchain: ToolchainChoice, slots: usize) -> GpuOptions {
        GpuOptions {
            ptx_modules: self.ptx_modules.clone(),
            graphs: self.graphs,
            ..options(self.policy, toolchain, slots)
        }
    }
}

/// The modules of one kind in the registry.
fn modules_of(kind: ModuleKind) -> Vec<String> {
    ModuleSource::registry_of_kind(kind)
        .into_iter()
        .map(|m| m.name)
        .collect()
}

fn options(policy: Policy, toolchain: ToolchainChoice, slots: usize) -> GpuOptions {
    GpuOptions {
        policy,
        slots,
        kv_budget: Some(256 << 20),
        graphs: false,
        max_context: 2048,
        toolchain,
        prefill_tokens: qwen_engine::gpu::prefill::PREFILL_TOKENS,
        attention_pipelined: None,
        attention_cluster: true,
        decode_ahead: false,
        ptx_modules: Vec::new(),
        step: DecodeStep::Launches,
        persistent_stamps: false,
    }
}

fn runner(config: &ModelConfig, weights: &Weights, o: &GpuOptions) -> HybridGpuRunner {
    HybridGpuRunner::new(config, weights, o, &mut |_| {})
        .unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"))
}

/// What the engine did with one fixture under one policy.
struct PolicyRun {
    fixture: Fixture,
    label: String,
    noise_abs: f32,
    noise_rel: f32,
    /// Teacher-forced, every prompt in one batch.
    forced: Vec<Generation>,
    /// Free-running greedy, each prompt alone, whole prompts.
    alone: Vec<Generation>,
    /// Each prompt alone in prompt chunks of 16 and of 64 tokens.
    chunked: Vec<(usize, Vec<Generation>)>,
    /// Concurrency 4 and 8 (prompts repeated).
    concurrent: Vec<(usize, Vec<Generation>)>,
    /// In one slot, in sequence: the last prompt, the first, the last again.
    reuse: Vec<Generation>,
}

/// Teacher-forced generations (every prompt in one batch) and free-running ones (each alone).
type ForcedAndAlone = (Vec<Generation>, Vec<Generation>);

/// Every prompt teacher-forced in one batch, and each alone free-running (whole prompts).
fn forced_and_alone(r: &mut HybridGpuRunner, f: &Fixture) -> ForcedAndAlone {
    let prompts = &f.expected.prompts;
    let reqs: Vec<Request> = prompts
        .iter()
        .map(|p| Request {
            teacher: Some(&p.generated),
            ..Request::greedy(&p.ids, p.generated.len())
        })
        .collect();
    let forced = run(r, &reqs, None).unwrap();
    let alone = prompts
        .iter()
        .map(|p| {
            run(r, &[Request::greedy(&p.ids, p.generated.len())], None)
                .unwrap()
                .remove(0)
        })
        .collect();
    (forced, alone)
}

fn policy_run(f: &Fixture, config: &ModelConfig, weights: &Weights, mode: &Mode) -> PolicyRun {
    let prompts = &f.expected.prompts;
    let label = format!("{} [{}]", f.name, mode.label);
    let mut r = runner(config, weights, &mode.options(ToolchainChoice::Newest, 8));
    let (forced, alone) = forced_and_alone(&mut r, f);
    let (mut noise_abs, mut noise_rel, mut worst) = (0.0f32, 0.0f32, String::new());
    for (p, g) in prompts.iter().zip(&forced) {
        for (i, (step, logits)) in p.steps.iter().zip(&g.logits).enumerate() {
            for (&id, &want) in step.top5_ids.iter().zip(&step.top5_logits) {
                let d = (logits[id as usize] - want).abs();
                noise_abs = noise_abs.max(d);
                if d / want.abs().max(1.0) > noise_rel {
                    noise_rel = d / want.abs().max(1.0);
                    worst = format!(
                        "{} step {i} token {id}: {} vs {want}",
                        p.name, logits[id as usize]
                    );
                }
            }
        }
    }
    eprintln!("{label}: largest relative difference at {worst}");
    let alone_with = |r: &mut HybridGpuRunner, chunk: Option<usize>| -> Vec<Generation> {
        prompts
            .iter()
            .map(|p| {
                run(r, &[Request::greedy(&p.ids, p.generated.len())], chunk)
                    .unwrap()
                    .remove(0)
            })
            .collect()
    };
    let chunked = [16usize, 64]
        .into_iter()
        .map(|c| (c, alone_with(&mut r, Some(c))))
        .collect();
    let concurrent = [4usize, 8]
        .into_iter()
        .map(|c| {
            let reqs: Vec<Request> = (0..c)
                .map(|i| {
                    let p = &prompts[i % prompts.len()];
                    Request::greedy(&p.ids, p.generated.len())
                })
                .collect();
            (
                c,
                run(&mut r, &reqs, Some(if c == 4 { 7 } else { 512 })).unwrap(),
            )
        })
        .collect();
    drop(r);
    let mut one = runner(config, weights, &mode.options(ToolchainChoice::Newest, 1));
    let (first, last) = (&prompts[0], &prompts[prompts.len() - 1]);
    let reuse = [last, first, last]
        .iter()
        .map(|p| {
            run(
                &mut one,
                &[Request::greedy(&p.ids, p.generated.len())],
                None,
            )
            .unwrap()
            .remove(0)
        })
        .collect();
    eprintln!("{label}: stats {:?}", one.stats());
    PolicyRun {
        fixture: f.clone(),
        label,
        noise_abs,
        noise_rel,
        forced,
        alone,
        chunked,
        concurrent,
        reuse,
    }
}

/// A fixture's runs under `auto` with graphs against those that must give its bits: `ptx-only`,
/// the same without graphs, and with the CUDA modules alone from their PTX; where `ptx-only`
/// differs, each Triton module alone from its PTX, and whether that moved the bits.
struct BitsRun {
    label: String,
    auto: ForcedAndAlone,
    same_bits: Vec<(&'static str, ForcedAndAlone)>,
    /// Triton module, and whether taking its PTX (its sm_80 code, which Triton compiled for
    /// another target than its sm_90a SASS) changed the teacher-forced logits.
    triton_ptx_moves: Vec<(String, bool)>,
}

struct Runs {
    policies: Vec<PolicyRun>,
    bits: Vec<BitsRun>,
}

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let (mut policies, mut bits) = (Vec::new(), Vec::new());
        for f in gpu_fixtures() {
            let (config, weights) = f.load_model();
            for mode in [
                Mode::of("auto", Policy::Auto, true),
                Mode::of("ptx-only", Policy::PtxOnly, true),
            ] {
                policies.push(policy_run(&f, &config, &weights, &mode));
            }
            let light = |mode: &Mode| {
                let mut r = runner(&config, &weights, &mode.options(ToolchainChoice::Newest, 8));
                let out = forced_and_alone(&mut r, &f);
                eprintln!("{} [{}]: stats {:?}", f.name, mode.label, r.stats());
                out
            };
            let (p, ptx) = (&policies[policies.len() - 2], &policies[policies.len() - 1]);
            let cuda_ptx = Mode {
                ptx_modules: modules_of(ModuleKind::Cuda),
                ..Mode::of("auto, CUDA modules from PTX", Policy::Auto, true)
            };
            let same_bits = vec![
                ("ptx-only", (ptx.forced.clone(), ptx.alone.clone())),
                (
                    "no graphs",
                    light(&Mode::of("auto, no graphs", Policy::Auto, false)),
                ),
                ("CUDA modules from PTX", light(&cuda_ptx)),
            ];
            let triton_ptx_moves = if ptx.forced == p.forced {
                Vec::new()
            } else {
                modules_of(ModuleKind::Triton)
                    .into_iter()
                    .map(|m| {
                        let mode = Mode {
                            ptx_modules: vec![m.clone()],
                            ..Mode::of("auto, one Triton module from PTX", Policy::Auto, true)
                        };
                        let moved = light(&mode).0 != p.forced;
                        (m, moved)
                    })
                    .collect()
            };
            bits.push(BitsRun {
                label: f.name.clone(),
                auto: (p.forced.clone(), p.alone.clone()),
                same_bits,
                triton_ptx_moves,
            });
        }
        Runs { policies, bits }
    })
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_noise_is_within_transformers_bf16_noise() {
    for r in &runs().policies {
        let hf = r.fixture.expected.bf16_relative_noise;
        eprintln!(
            "{}: teacher-forced top-5 logits vs transformers: max |diff| {:.4}, max relative {:.4}; \
             transformers bf16: {hf:.4} (ours / theirs {:.2})",
            r.label,
            r.noise_abs,
            r.noise_rel,
            r.noise_rel / hf
        );
        assert!(
            r.noise_rel <= NOISE_FACTOR * hf,
            "{}: relative noise {} exceeds {NOISE_FACTOR} x transformers' bf16 noise {hf}",
            r.label,
            r.noise_rel
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_greedy_choice_matches_transformers_where_the_margin_allows() {
    for r in &runs().policies {
        let threshold = MARGIN_FACTOR * f64::from(r.noise_abs);
        let (mut checked, mut skipped) = (0, 0);
        for (p, g) in r.fixture.expected.prompts.iter().zip(&r.forced) {
            for (i, (step, &got)) in p.steps.iter().zip(&g.tokens).enumerate() {
                if step.margin <= threshold {
                    skipped += 1;
                    continue;
                }
                checked += 1;
                assert_eq!(
                    got, step.token,
                    "{} {} step {i}: GPU chose {got}, transformers {} (margin {} > {threshold})",
                    r.label, p.name, step.token, step.margin
                );
            }
        }
        eprintln!(
            "{}: {checked} steps checked, {skipped} under the margin {threshold:.4}",
            r.label
        );
        assert!(
            checked > skipped,
            "{}: too few steps above the margin",
            r.label
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_free_running_greedy_matches_transformers_before_the_first_near_tie() {
    for r in &runs().policies {
        let threshold = MARGIN_FACTOR * f64::from(r.noise_abs);
        for (p, g) in r.fixture.expected.prompts.iter().zip(&r.alone) {
            let agree = p.steps.iter().take_while(|s| s.margin > threshold).count();
            assert_eq!(
                g.tokens[..agree],
                p.generated[..agree],
                "{} {}: free-running tokens differ before the first near tie (step {agree})",
                r.label,
                p.name
            );
            eprintln!(
                "{} {}: first {agree} tokens equal the oracle's",
                r.label, p.name
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_prompt_chunks_of_16_64_and_whole_give_the_same_tokens() {
    for r in &runs().policies {
        for (chunk, gens) in &r.chunked {
            for ((p, g), alone) in r.fixture.expected.prompts.iter().zip(gens).zip(&r.alone) {
                assert_eq!(
                    g.tokens, alone.tokens,
                    "{} {}: chunks of {chunk} vs the whole prompt",
                    r.label, p.name
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_batched_requests_equal_their_single_request_runs() {
    for r in &runs().policies {
        let n = r.fixture.expected.prompts.len();
        for (c, gens) in &r.concurrent {
            for (i, g) in gens.iter().enumerate() {
                let alone = &r.alone[i % n];
                assert_eq!(
                    g.tokens, alone.tokens,
                    "{} c{c} request {i}: batched tokens differ from its single run",
                    r.label
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_a_reused_slot_never_sees_the_request_before_it() {
    for r in &runs().policies {
        let (a, b) = (&r.reuse[0], &r.reuse[2]);
        assert_eq!(
            a, b,
            "{}: the same request before and after another in its slot gives other logits",
            r.label
        );
        let last = r.fixture.expected.prompts.len() - 1;
        assert_eq!(
            a.tokens, r.alone[last].tokens,
            "{}: a one-slot runner's tokens differ from the eight-slot runner's",
            r.label
        );
        assert_eq!(r.reuse[1].tokens, r.alone[0].tokens, "{}", r.label);
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_ptx_only_graphs_off_and_cuda_ptx_give_the_bits_of_auto() {
    for b in &runs().bits {
        // Where ptx-only differs, which Triton module's PTX (its sm_80 code) moves the bits.
        for (module, moved) in &b.triton_ptx_moves {
            eprintln!(
                "{}: {module} from its PTX {} the teacher-forced logits",
                b.label,
                if *moved { "moves" } else { "keeps" }
            );
        }
        for (what, got) in &b.same_bits {
            assert!(
                got.0 == b.auto.0,
                "{} [{what}]: teacher-forced logits differ from auto's with graphs",
                b.label
            );
            assert!(
                got.1 == b.auto.1,
                "{} [{what}]: free-running tokens or logits differ from auto's with graphs",
                b.label
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_stops_with_the_plans_reason_on_cuda_12_images() {
    let f = &gpu_fixtures()[0];
    let (config, weights) = f.load_model();
    let err = HybridGpuRunner::new(
        &config,
        &weights,
        &options(Policy::Auto, ToolchainChoice::Major(12), 1),
        &mut |_| {},
    )
    .err()
    .expect("the Triton modules have no CUDA 12 images");
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains("needs the Triton module") && msg.contains("unavailable here"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU and QWEN_HYBRID_GPU_FIXTURES: run with --include-ignored on the GPU machine"]
fn gpu_hybrid_logits_are_finite() {
    for r in &runs().policies {
        for g in r.forced.iter().chain(&r.alone) {
            assert!(
                g.logits.iter().flatten().all(|v| v.is_finite()),
                "{}: non-finite logits",
                r.label
            );
        }
    }
}
