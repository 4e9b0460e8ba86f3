//! The engine (scheduler + runner) on the CPU reference runner with the built-in tiny model:
//! continuous batching, the request queue, slot reuse, bad requests refused while the others keep
//! running, and the `qwen-decode run` command line. No GPU needed.

use aot_kernels::ops::sampling::SamplingParams;
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::model::{ModelConfig, Qwen3Config};
use qwen_engine::scheduler::{Event, FinishReason, RequestId, RequestSpec, SubmitError};
use qwen_engine::weights::Weights;

fn engine(slots: usize, kv_blocks: usize, chunk: usize) -> Engine {
    let config = ModelConfig::Qwen3(Qwen3Config::tiny());
    let runner = CpuRunner::new(
        &config,
        &Weights::Synthetic { seed: 5 },
        CpuRunnerOptions {
            max_slots: slots,
            kv_blocks,
        },
    )
    .unwrap();
    let model = config.describe();
    let mut options = EngineOptions::for_model(&model);
    options.prefill_chunk = chunk;
    Engine::new(Box::new(runner), &model, options)
}

fn spec(prompt: &[u32], new: usize, sampling: SamplingParams, seed: u64) -> RequestSpec {
    RequestSpec {
        prompt: prompt.to_vec(),
        max_new_tokens: new,
        sampling,
        seed,
        stop_at_eos: false,
    }
}

/// Runs until idle; returns every request's tokens.
fn drain(e: &mut Engine) -> std::collections::BTreeMap<RequestId, Vec<u32>> {
    let mut out: std::collections::BTreeMap<RequestId, Vec<u32>> = Default::default();
    e.run(|ev| {
        if let Event::Token { id, token, .. } = ev {
            out.entry(*id).or_default().push(*token);
        }
    })
    .unwrap();
    out
}

fn solo(prompt: &[u32], new: usize, sampling: SamplingParams, seed: u64) -> Vec<u32> {
    let mut e = engine(1, 64, 512);
    let id = e.submit(spec(prompt, new, sampling, seed)).unwrap();
    drain(&mut e).remove(&id).unwrap()
}

const A: &[u32] = &[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100];
const B: &[u32] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 300, 301,
];

#[test]
fn requests_joining_mid_way_produce_their_solo_tokens() {
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
    };
    let want_a = solo(A, 20, SamplingParams::GREEDY, 0);
    let want_b = solo(B, 12, sampled, 77);
    // A starts alone; B joins after A's third token and prefills in chunks of 5 while A decodes.
    let mut e = engine(4, 64, 5);
    let a = e.submit(spec(A, 20, SamplingParams::GREEDY, 0)).unwrap();
    let mut got_a = Vec::new();
    while got_a.len() < 3 {
        for ev in e.step().unwrap() {
            if let Event::Token { token, .. } = ev {
                got_a.push(token);
            }
        }
    }
    let b = e.submit(spec(B, 12, sampled, 77)).unwrap();
    let rest = drain(&mut e);
    got_a.extend(&rest[&a]);
    assert_eq!(got_a, want_a, "A is unaffected by B joining");
    assert_eq!(rest[&b], want_b, "B in a busy engine equals B alone");
    assert!(e.is_idle());
}

#[test]
fn a_reused_slot_never_sees_the_previous_request() {
    let want = solo(A, 16, SamplingParams::GREEDY, 0);
    let mut e = engine(1, 64, 512);
    // A long request fills slot 0 and many blocks, then finishes.
    e.submit(spec(B, 30, SamplingParams::GREEDY, 0)).unwrap();
    drain(&mut e);
    let id = e.submit(spec(A, 16, SamplingParams::GREEDY, 0)).unwrap();
    assert_eq!(drain(&mut e)[&id], want);
}

#[test]
fn bad_requests_are_refused_and_the_running_ones_go_on() {
    let want = solo(A, 24, SamplingParams::GREEDY, 0);
    let mut e = engine(2, 64, 512);
    let a = e.submit(spec(A, 24, SamplingParams::GREEDY, 0)).unwrap();
    let mut got_a: Vec<u32> = e
        .step()
        .unwrap()
        .iter()
        .filter_map(|ev| match ev {
            Event::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    let refusals: Vec<(RequestSpec, &str)> = vec![
        (spec(&[], 4, SamplingParams::GREEDY, 0), "prompt is empty"),
        (
            spec(&[1, 5000], 4, SamplingParams::GREEDY, 0),
            "outside the vocabulary",
        ),
        (
            spec(&vec![1; 5000], 4, SamplingParams::GREEDY, 0),
            "exceeds the context",
        ),
        (
            spec(
                A,
                4,
                SamplingParams {
                    temperature: f32::NAN,
                    top_k: 0,
                    top_p: 1.0,
                },
                0,
            ),
            "temperature",
        ),
        (
            spec(
                A,
                4,
                SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 0.0,
                },
                0,
            ),
            "top_p",
        ),
    ];
    for (s, needle) in refusals {
        let err = e.submit(s).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // Fill the second slot; a third request waits for a free slot, then runs as it would alone.
    let b = e.submit(spec(B, 4, SamplingParams::GREEDY, 0)).unwrap();
    let c = e.submit(spec(A, 4, SamplingParams::GREEDY, 0)).unwrap();
    let out = drain(&mut e);
    got_a.extend(&out[&a]);
    assert_eq!(got_a, want);
    assert_eq!(out[&b].len(), 4);
    assert_eq!(out[&c], want[..4]);
}

#[test]
fn a_kv_cache_too_small_for_one_request_says_how_to_fix_it() {
    let mut e = engine(2, 2, 512);
    let err = e
        .submit(spec(A, 40, SamplingParams::GREEDY, 0))
        .unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::KvTooSmall {
                needed: 4,
                total: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--kv-budget"), "{err}");
    // The size it names is the CPU cache's: fp32 keys and values of the tiny model's 4 layers, 2
    // KV heads of 64 dims, 16 positions a block.
    let SubmitError::KvTooSmall { needed_mib, .. } = err else {
        unreachable!()
    };
    assert_eq!(
        needed_mib,
        (4 * 4 * 2 * 2 * 64 * 16 * 4) as f64 / (1 << 20) as f64
    );
    // A request that fits is still served.
    let id = e
        .submit(spec(&A[..4], 8, SamplingParams::GREEDY, 0))
        .unwrap();
    assert_eq!(drain(&mut e)[&id].len(), 8);
}

#[test]
fn seeded_sampling_is_reproducible_and_finish_reasons_are_reported() {
    let p = SamplingParams {
        temperature: 1.2,
        top_k: 0,
        top_p: 1.0,
    };
    assert_eq!(solo(A, 16, p, 1), solo(A, 16, p, 1));
    assert_ne!(
        solo(A, 16, p, 1),
        solo(A, 16, p, 2),
        "different seeds give different samples"
    );
    let mut e = engine(1, 64, 512);
    let id = e.submit(spec(A, 3, p, 1)).unwrap();
    let mut finished = None;
    e.run(|ev| {
        if let Event::Finished { id: f, reason } = ev {
            finished = Some((*f, *reason));
        }
    })
    .unwrap();
    assert_eq!(finished, Some((id, FinishReason::Length)));
}

#[test]
fn run_command_decodes_the_tiny_model_on_the_cpu() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args([
            "run",
            "--model",
            "tiny",
            "--weights-seed",
            "5",
            "--device",
            "cpu",
            "--prompt",
            "Hi there",
            "--max-new-tokens",
            "12",
            "--json",
            "--ignore-eos",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["device"], "cpu");
    assert_eq!(
        v["prompt_ids"].as_array().unwrap().len(),
        8,
        "bytes of `Hi there`"
    );
    assert_eq!(v["generated"].as_array().unwrap().len(), 12);
    let ids: Vec<u32> = v["generated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let prompt: Vec<u32> = b"Hi there".iter().map(|&b| u32::from(b)).collect();
    assert_eq!(
        ids,
        solo(&prompt, 12, SamplingParams::GREEDY, 0),
        "the CLI decodes what the engine decodes"
    );

    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args(["run", "--model", "/nonexistent/model", "--prompt-ids", "1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a folder"));
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args(["run", "--model", "tiny", "--device", "cpu"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("--prompt"));
}

/// A runner whose tables hold fewer positions than the model allows (as the GPU runner's do
/// under `--max-context`): the CPU runner with a lower `max_context`.
struct ShortRunner(CpuRunner, usize);

impl qwen_engine::runner::Runner for ShortRunner {
    fn device(&self) -> qwen_engine::runner::DeviceKind {
        self.0.device()
    }
    fn kv_blocks(&self) -> usize {
        self.0.kv_blocks()
    }
    fn max_slots(&self) -> usize {
        self.0.max_slots()
    }
    fn max_context(&self) -> usize {
        self.1
    }
    fn step(
        &mut self,
        plan: &qwen_engine::runner::StepPlan<'_>,
    ) -> Result<qwen_engine::runner::StepOutput, qwen_engine::runner::RunnerError> {
        self.0.step(plan)
    }
    fn report(&self) -> serde_json::Value {
        self.0.report()
    }
}

#[test]
fn a_request_longer_than_the_runner_holds_is_refused_and_the_others_go_on() {
    let config = ModelConfig::Qwen3(Qwen3Config::tiny());
    let runner = CpuRunner::new(
        &config,
        &Weights::Synthetic { seed: 5 },
        CpuRunnerOptions {
            max_slots: 2,
            kv_blocks: 64,
        },
    )
    .unwrap();
    let model = config.describe();
    // The model allows more than the runner: the runner's limit is the one that counts.
    assert!(model.max_context > 64);
    let mut e = Engine::new(
        Box::new(ShortRunner(runner, 64)),
        &model,
        EngineOptions::for_model(&model),
    );
    let want = solo(A, 8, SamplingParams::GREEDY, 0);
    let a = e.submit(spec(A, 8, SamplingParams::GREEDY, 0)).unwrap();
    match e.submit(spec(&[1; 60], 8, SamplingParams::GREEDY, 0)) {
        Err(err @ SubmitError::TooLong { context: 64, .. }) => {
            assert!(err.to_string().contains("exceeds the context"), "{err}")
        }
        other => panic!("expected TooLong at 64 positions, got {other:?}"),
    }
    // 57 positions fit.
    let b = e
        .submit(spec(&[1; 50], 8, SamplingParams::GREEDY, 0))
        .unwrap();
    let out = drain(&mut e);
    assert_eq!(out[&a], want);
    assert_eq!(out[&b].len(), 8);
}

/// Without `--max-context` the CPU run sizes each slot for 4096 positions and serves what its
/// whole cache holds: on a model allowing 8192 positions (tiny-en's weights under a longer
/// context), a 4100-position request runs when a second slot's share is free, and with one slot
/// it is refused as too long, naming the flag that would let it run (a larger budget would not).
#[test]
fn the_cli_cpu_context_is_what_the_cache_holds() {
    let tiny_en = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-en");
    let dir = std::env::temp_dir().join(format!("aot-long-context-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = std::fs::read_to_string(tiny_en.join("config.json")).unwrap();
    let longer = config.replace(
        "\"max_position_embeddings\": 512",
        "\"max_position_embeddings\": 8192",
    );
    assert_ne!(config, longer, "tiny-en's config changed: update this test");
    std::fs::write(dir.join("config.json"), longer).unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny_en.join(f), dir.join(f)).unwrap();
    }
    let ids = vec!["7"; 4098].join(",");
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
            .args([
                "run",
                "--device",
                "cpu",
                "--max-new-tokens",
                "2",
                "--ignore-eos",
            ])
            .arg("--model")
            .arg(&dir)
            .args(["--prompt-ids", &ids])
            .args(extra)
            .output()
            .unwrap()
    };
    let one = run(&["--slots", "1"]);
    let two = run(&["--slots", "2"]);
    std::fs::remove_dir_all(&dir).ok();
    let stderr = String::from_utf8_lossy(&one.stderr);
    assert_eq!(one.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("context of 4096 tokens"), "{stderr}");
    assert!(stderr.contains("--max-context"), "{stderr}");
    assert!(
        two.status.success(),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
}
