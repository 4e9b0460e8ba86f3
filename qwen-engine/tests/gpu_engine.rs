//! The GPU engine against the transformers oracle, and against itself across dispatch policies,
//! CUDA graphs and batch sizes. Needs a CUDA GPU: the tests are `#[ignore]`d, so a machine without
//! one lists them as ignored (never passed); asked to run without one they fail.
//!
//! bf16 noise: the GPU computes in bf16 between kernels, the oracle in float32. The tests measure
//! the difference on teacher-forced logits (the oracle's tokens fed back, so every step is
//! comparable) and print it. The yardstick is transformers' own bf16 run of the same model on the
//! same tokens (recorded by the oracle script): the GPU engine's relative distance from float32
//! must stay within `NOISE_FACTOR` times transformers'. The GPU's greedy choice must then equal
//! the oracle's at every step whose top-1/top-2 margin exceeds `MARGIN_FACTOR` times the measured
//! absolute noise.

mod common;

use aot_kernels::dispatch::{Policy, ToolchainChoice};
use aot_kernels::ops::sampling::SamplingParams;
use common::driver::{run, Generation, Request};
use common::fixtures::{self, Fixture};
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::gpu::{GpuOptions, GpuRunner};
use qwen_engine::model::{ModelConfig, Qwen3Config};
use qwen_engine::runner::{Runner, SampleRequest, SeqStep, StepPlan};
use qwen_engine::scheduler::{Event, FinishReason, RequestSpec};
use qwen_engine::weights::Weights;

/// The GPU's largest relative teacher-forced difference from float32 may be this many times
/// transformers' own bf16 difference on the same steps.
const NOISE_FACTOR: f32 = 1.5;
/// A step's greedy token must match where the oracle's margin exceeds this many times the noise.
const MARGIN_FACTOR: f64 = 2.0;

/// The options of these tests: 8 slots, 2048 tokens of context, a KV cache of `kv` bytes; prefill
/// passes and the attention kind as the engine's defaults unless a test changes them.
fn options(policy: Policy, toolchain: ToolchainChoice, graphs: bool, kv: usize) -> GpuOptions {
    GpuOptions {
        policy,
        slots: 8,
        kv_budget: Some(kv),
        graphs,
        max_context: 2048,
        toolchain,
        prefill_tokens: qwen_engine::gpu::prefill::PREFILL_TOKENS,
        attention_pipelined: None,
        attention_cluster: true,
        decode_ahead: true,
    }
}

fn gpu_runner(config: &ModelConfig, weights: &Weights, options: &GpuOptions) -> GpuRunner {
    GpuRunner::new(config, weights, options, &mut |_| {})
        .unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"))
}

/// Teacher-forced logits of every prompt of `f` (all prompts in one batch): the largest
/// difference to the oracle over each step's top-5, absolute and relative to max(1, |logit|).
fn noise(f: &Fixture, runner: &mut dyn Runner) -> (f32, f32, Vec<Generation>) {
    let reqs: Vec<Request> = f
        .expected
        .prompts
        .iter()
        .map(|p| Request {
            teacher: Some(&p.generated),
            ..Request::greedy(&p.ids, p.generated.len())
        })
        .collect();
    let gens = run(runner, &reqs, Some(64)).unwrap();
    let (mut worst_abs, mut worst_rel) = (0.0f32, 0.0f32);
    for (p, g) in f.expected.prompts.iter().zip(&gens) {
        for (step, logits) in p.steps.iter().zip(&g.logits) {
            for (&id, &want) in step.top5_ids.iter().zip(&step.top5_logits) {
                let d = (logits[id as usize] - want).abs();
                worst_abs = worst_abs.max(d);
                worst_rel = worst_rel.max(d / want.abs().max(1.0));
            }
        }
    }
    (worst_abs, worst_rel, gens)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_engine_matches_transformers_under_every_policy_graph_setting_and_batch() {
    for f in fixtures::all() {
        let (config, weights) = f.load_model();
        let prompts = &f.expected.prompts;
        let mut reference: Option<Vec<Generation>> = None;
        let newest = ToolchainChoice::Newest;
        // The CUDA 12.9 images (what a 12.x driver runs) go through the same checks on this
        // driver: the oracle, batching, chunking, and the same bits as the CUDA 13 images.
        let cuda12 = ToolchainChoice::Major(12);
        // Prefill passes of 4096 rows pack every prompt of a step into one pass; 97 rows cut
        // prompts across passes at odd places, and 8 rows (graphs off) cut every prompt. Decode
        // attention is forced unpipelined in two settings (these small models never reach the
        // busy blocks where `attn_pipelined` switches), one of them with graphs, so that kind's
        // graphs are captured and replayed too. Where the GPU has thread-block clusters, the
        // pipelined passes of these few-head models merge their splits in clusters; the second
        // setting keeps the workspace merge. The bits must not change (checked against the first
        // configuration below).
        for (policy, toolchain, graphs, pass_rows, pipelined, cluster) in [
            (Policy::Auto, newest, true, 4096, None, true),
            (Policy::Auto, newest, true, 4096, None, false),
            (Policy::Auto, newest, false, 8, Some(false), true),
            (Policy::PtxOnly, newest, true, 97, Some(false), true),
            (Policy::PtxOnly, newest, false, 4096, None, true),
            (Policy::Auto, cuda12, true, 4096, None, true),
            (Policy::PtxOnly, cuda12, true, 4096, None, true),
        ] {
            let mut runner = gpu_runner(
                &config,
                &weights,
                &GpuOptions {
                    prefill_tokens: pass_rows,
                    attention_pipelined: pipelined,
                    attention_cluster: cluster,
                    ..options(policy, toolchain, graphs, 256 << 20)
                },
            );
            let label = format!(
                "{} [{policy}, {toolchain}, graphs {}, prefill passes of {pass_rows}, attention {}{}]",
                f.name,
                if graphs { "on" } else { "off" },
                match pipelined {
                    None => "auto",
                    Some(true) => "pipelined",
                    Some(false) => "unpipelined",
                },
                if cluster { "" } else { ", no clusters" }
            );

            // 1. Teacher-forced logits: the bf16 noise, and the greedy choice where margins allow.
            let (abs, rel, forced) = noise(&f, &mut runner);
            eprintln!("{label}: teacher-forced top-5 logits vs transformers: max |diff| {abs:.4}, max relative {rel:.4}");
            let hf = f.expected.bf16_relative_noise;
            eprintln!(
                "{label}: transformers bf16 vs float32 on the same steps: max relative {hf:.4} (ours / theirs {:.2})",
                rel / hf
            );
            assert!(
                rel <= NOISE_FACTOR * hf,
                "{label}: relative noise {rel} exceeds {NOISE_FACTOR} x transformers' bf16 noise {hf}"
            );
            let threshold = MARGIN_FACTOR * f64::from(abs);
            let (mut checked, mut skipped) = (0, 0);
            for (p, g) in prompts.iter().zip(&forced) {
                for (i, step) in p.steps.iter().enumerate() {
                    if step.margin > threshold {
                        let argmax = aot_kernels::ops::sampling::argmax_reference(&g.logits[i]);
                        assert_eq!(argmax, step.token, "{label} {} step {i}: GPU argmax {argmax}, transformers {} (margin {:.4})", p.name, step.token, step.margin);
                        checked += 1;
                    } else {
                        skipped += 1;
                    }
                }
            }
            eprintln!("{label}: greedy choice equal at {checked} steps, {skipped} steps under the margin threshold {threshold:.4}");

            // 2. Free-running greedy, each prompt alone: equal to the oracle up to its first near-tie.
            let mut alone = Vec::new();
            for p in prompts {
                let g = run(
                    &mut runner,
                    &[Request::greedy(&p.ids, p.generated.len())],
                    Some(64),
                )
                .unwrap()
                .remove(0);
                let first_tie = p
                    .steps
                    .iter()
                    .position(|s| s.margin <= threshold)
                    .unwrap_or(p.steps.len());
                assert_eq!(
                    &g.tokens[..first_tie],
                    &p.generated[..first_tie],
                    "{label} {}: greedy tokens before the first near-tie",
                    p.name
                );
                alone.push(g);
            }

            // 3. Concurrency 4 and 8 (prompts repeated): every sequence equals its single-request run, bit for bit.
            for c in [4usize, 8] {
                let reqs: Vec<Request> = (0..c)
                    .map(|i| {
                        Request::greedy(
                            &prompts[i % prompts.len()].ids,
                            prompts[i % prompts.len()].generated.len(),
                        )
                    })
                    .collect();
                // Different prefill chunking too: prompts may be cut anywhere.
                let gens = run(&mut runner, &reqs, Some(if c == 4 { 7 } else { 512 })).unwrap();
                for (i, g) in gens.iter().enumerate() {
                    assert_eq!(g, &alone[i % prompts.len()], "{label}: request {i} at concurrency {c} differs from its single-request run");
                }
            }

            // 4. Policies and graph settings give the same bits; the CUDA 12 images are compared.
            match &reference {
                None => reference = Some(alone),
                Some(r) if toolchain == newest => {
                    assert_eq!(r, &alone, "{label}: differs from auto with graphs")
                }
                Some(r) => {
                    let same_tokens = r.iter().zip(&alone).all(|(a, b)| a.tokens == b.tokens);
                    let worst = r
                        .iter()
                        .zip(&alone)
                        .flat_map(|(a, b)| a.logits.iter().zip(&b.logits))
                        .flat_map(|(x, y)| x.iter().zip(y))
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0f32, f32::max);
                    eprintln!(
                        "{label}: vs the CUDA 13 images (auto, graphs on): {}; tokens {}, largest logit difference {worst:.3e}",
                        if r == &alone { "bit-identical" } else { "not bit-identical" },
                        if same_tokens { "equal" } else { "differ" }
                    );
                    // Measured bit-identical on the H200 (CUDA 12.9 NVRTC and CUDA 13.0 nvcc
                    // images, SASS and PTX JIT): a difference now is a change to look at.
                    assert_eq!(r, &alone, "{label}: differs from the CUDA 13 images");
                }
            }
            let stats = runner.stats();
            eprintln!(
                "{label}: {} passes, {} graph replays, {} captures, {} eager",
                stats.passes, stats.graph_replays, stats.graph_captures, stats.eager_passes
            );
            if graphs {
                assert!(
                    stats.graph_replays > 0,
                    "{label}: graphs on but none replayed"
                );
            } else {
                assert_eq!(stats.graph_replays, 0);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_qwen3_4b_synthetic_same_tokens_with_and_without_graphs_and_under_both_policies() {
    let config = ModelConfig::Qwen3(Qwen3Config::qwen3_4b());
    let weights = Weights::Synthetic { seed: 7 };
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|i| {
            (0..16)
                .map(|t| (i * 7919 + t * 104_729) % 151_936)
                .collect()
        })
        .collect();
    let new = 24;
    let mut reference: Option<Vec<Generation>> = None;
    for (policy, graphs) in [
        (Policy::Auto, true),
        (Policy::Auto, false),
        (Policy::PtxOnly, true),
    ] {
        let mut runner = gpu_runner(
            &config,
            &weights,
            &GpuOptions {
                prefill_tokens: if graphs { 4096 } else { 100 },
                ..options(policy, ToolchainChoice::Newest, graphs, 4 << 30)
            },
        );
        let reqs: Vec<Request> = prompts.iter().map(|p| Request::greedy(p, new)).collect();
        let batch = run(&mut runner, &reqs, Some(512)).unwrap();
        let alone = run(&mut runner, &reqs[..1], Some(512)).unwrap();
        assert_eq!(
            alone[0], batch[0],
            "{policy} graphs {graphs}: request 0 alone differs from the batch of 8"
        );
        for g in &batch {
            assert!(
                g.logits.iter().flatten().all(|v| v.is_finite()),
                "non-finite logits"
            );
        }
        let distinct: std::collections::BTreeSet<u32> = batch
            .iter()
            .flat_map(|g| g.tokens.iter().copied())
            .collect();
        eprintln!("qwen3-4b [{policy}, graphs {graphs}]: request 0 tokens {:?}; {} distinct tokens over 8 requests", batch[0].tokens, distinct.len());
        match &reference {
            None => reference = Some(batch),
            Some(r) => {
                for (i, (a, b)) in r.iter().zip(&batch).enumerate() {
                    assert_eq!(
                        a.tokens, b.tokens,
                        "{policy} graphs {graphs}: request {i} tokens differ from auto with graphs"
                    );
                    assert_eq!(
                        a.logits, b.logits,
                        "{policy} graphs {graphs}: request {i} logits differ from auto with graphs"
                    );
                }
            }
        }
    }
}

/// Every step's events of an engine serving three requests of different lengths and sampling
/// settings, the third submitted while the first two decode, with `eos` as the model's
/// end-of-sequence tokens, decoding ahead or not, replaying graphs or not; and the runner's
/// statistics.
fn serve(
    config: &ModelConfig,
    weights: &Weights,
    eos: &[u32],
    ahead: bool,
    graphs: bool,
) -> (Vec<Vec<Event>>, serde_json::Value) {
    let config = ModelConfig::Qwen3(Qwen3Config {
        eos_token_ids: eos.to_vec(),
        ..config.as_qwen3().expect("a dense fixture").clone()
    });
    let runner = gpu_runner(
        &config,
        weights,
        &GpuOptions {
            decode_ahead: ahead,
            ..options(Policy::Auto, ToolchainChoice::Newest, graphs, 256 << 20)
        },
    );
    let model = config.describe();
    let mut engine = Engine::new(Box::new(runner), &model, EngineOptions::for_model(&model));
    let vocab = model.vocab_size as u32;
    let prompt = |n: u32, salt: u32| {
        (0..n)
            .map(|t| (t * 7919 + salt * 104_729) % vocab)
            .collect::<Vec<u32>>()
    };
    let spec = |prompt: Vec<u32>, new, sampling, seed| RequestSpec {
        prompt,
        max_new_tokens: new,
        sampling,
        seed,
        stop_at_eos: true,
    };
    let warm = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 1.0,
    };
    engine.submit(spec(prompt(5, 1), 40, warm, 1)).unwrap();
    engine
        .submit(spec(prompt(12, 2), 25, SamplingParams::GREEDY, 2))
        .unwrap();
    let mut steps = Vec::new();
    while !engine.is_idle() {
        if steps.len() == 6 {
            let nucleus = SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.9,
            };
            engine.submit(spec(prompt(3, 3), 30, nucleus, 3)).unwrap();
        }
        steps.push(engine.step().unwrap());
    }
    (steps, engine.runner().report()["stats"].clone())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_decode_ahead_gives_the_events_of_waiting_for_every_pass() {
    let f = fixtures::by_name("hd128-gqa2-untied");
    let (config, weights) = f.load_model();
    // An end-of-sequence token the first request samples partway (found without one, and the
    // same run says which: until it stops, the runs are the same).
    let (free, _) = serve(&config, &weights, &[], false, true);
    let first: Vec<u32> = free
        .iter()
        .flatten()
        .filter_map(|e| match e {
            Event::Token { id, token, .. } if id.0 == 0 => Some(*token),
            _ => None,
        })
        .collect();
    // Its first new token from the ninth on: the first request then stops exactly there, well
    // after the third request has joined.
    let eos = (8..first.len())
        .map(|i| first[i])
        .find(|t| !first[..8].contains(t))
        .expect("the first request samples a new token after its eighth");
    let (wait, wait_stats) = serve(&config, &weights, &[eos], false, true);
    let (ahead, stats) = serve(&config, &weights, &[eos], true, true);
    // Eager launches too (the pass queued ahead then launches its kernels one by one).
    let (eager, eager_stats) = serve(&config, &weights, &[eos], true, false);
    eprintln!("decode ahead: {stats}; eagerly: {eager_stats}; waiting: {wait_stats}");
    for (label, run) in [
        ("decode ahead", &ahead),
        ("decode ahead, no graphs", &eager),
    ] {
        assert_eq!(
            run.len(),
            wait.len(),
            "{label}: the number of steps differs"
        );
        for (i, (a, w)) in run.iter().zip(&wait).enumerate() {
            assert_eq!(a, w, "step {i}: the events differ ({label})");
        }
    }
    assert_eq!(
        eager_stats["graph_replays"].as_u64(),
        Some(0),
        "{eager_stats}"
    );
    assert!(
        eager_stats["ahead_adopted"].as_u64().unwrap() > 10,
        "{eager_stats}"
    );
    // The first request stopped at the token while the others went on: the pass queued ahead
    // of that step served the others (partly adopted).
    let eos_stop = ahead
        .iter()
        .position(|e| {
            e.iter().any(|e| {
                matches!(
                    e,
                    Event::Finished {
                        reason: FinishReason::Eos,
                        ..
                    }
                )
            })
        })
        .expect("a request stops at end-of-sequence");
    assert!(eos_stop + 1 < ahead.len(), "others decode after the stop");
    let n = |k: &str| stats[k].as_u64().unwrap();
    assert!(n("ahead_adopted") > 10, "{stats}");
    assert!(n("ahead_partial") >= 1, "{stats}");
    assert_eq!(wait_stats["ahead_passes"].as_u64(), Some(0));
    // Every decode pass queued ahead and adopted is one the waiting engine ran itself.
    assert_eq!(
        n("passes") - (n("ahead_passes") - n("ahead_adopted")),
        wait_stats["passes"].as_u64().unwrap(),
        "{stats} against {wait_stats}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_a_pass_queued_ahead_serves_only_the_plan_it_computed() {
    let f = fixtures::by_name("hd64-gqa4-tied");
    let (config, weights) = f.load_model();
    let vocab = config.describe().vocab_size as u32;
    let prompt: Vec<u32> = (0..9).map(|t| (t * 31 + 5) % vocab).collect();
    let blocks: Vec<u32> = (0..4).collect();
    let greedy = |counter| SampleRequest {
        params: SamplingParams::GREEDY,
        seed: 0,
        counter,
    };
    // One request driven by hand: its prompt, two tokens fed back, a token of the caller's
    // (not the one sampled: the pass queued ahead must be dropped), then two fed back again.
    let drive = |ahead: bool| {
        let mut runner = gpu_runner(
            &config,
            &weights,
            &GpuOptions {
                decode_ahead: ahead,
                ..options(Policy::Auto, ToolchainChoice::Newest, true, 64 << 20)
            },
        );
        let mut step = |tokens: &[u32], pos: usize, counter, prefill, want_logits| {
            let out = runner
                .step(&StepPlan {
                    seqs: vec![SeqStep {
                        slot: 0,
                        tokens,
                        start_pos: pos,
                        blocks: &blocks,
                        state_slot: None,
                        sample: Some(greedy(counter)),
                        prefill,
                        continues: true,
                    }],
                    want_logits,
                })
                .unwrap();
            (out.tokens[0].unwrap(), out.logits[0].clone())
        };
        let p = prompt.len();
        let (t0, _) = step(&prompt, 0, 0, true, false);
        let (t1, _) = step(&[t0], p, 1, false, false);
        let forced = (t1 + 1) % vocab;
        let (t2, l2) = step(&[forced], p + 1, 2, false, true);
        let (t3, _) = step(&[t2], p + 2, 3, false, false);
        let (t4, l4) = step(&[t3], p + 3, 4, false, true);
        (vec![t0, t1, t2, t3, t4], l2, l4, runner.stats())
    };
    let (wait, wl2, wl4, _) = drive(false);
    let (ahead, al2, al4, stats) = drive(true);
    eprintln!("tokens {ahead:?}; {stats:?}");
    assert_eq!(ahead, wait, "decode ahead changed the tokens");
    assert_eq!(
        al2, wl2,
        "the step after a token of the caller's: its logits differ"
    );
    assert_eq!(al4, wl4, "the adopted step's logits differ");
    // Queued ahead after the second and the fourth step; the fifth used its pass, the third not.
    assert_eq!(
        (stats.ahead_passes, stats.ahead_adopted),
        (2, 1),
        "{stats:?}"
    );
}
