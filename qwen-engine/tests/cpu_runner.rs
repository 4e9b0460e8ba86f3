//! The CPU runner on the built-in tiny model (synthetic weights): seeded sampling through the
//! backend's reference sampler, reuse of KV blocks by a new request, logits only when asked, and
//! a model too large for this machine refused before any memory is spent.

mod common;

use aot_kernels::ops::sampling::{sample_reference, SamplingParams};
use common::driver::{run, run_one, Request};
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::model::{ModelConfig, Qwen3Config};
use qwen_engine::runner::{Runner, SampleRequest, SeqStep, StepPlan};
use qwen_engine::weights::Weights;

fn tiny_runner(seed: u64) -> CpuRunner {
    CpuRunner::new(
        &ModelConfig::Qwen3(Qwen3Config::tiny()),
        &Weights::Synthetic { seed },
        CpuRunnerOptions {
            max_slots: 4,
            kv_blocks: 64,
        },
    )
    .unwrap()
}

const PROMPT: &[u32] = &[104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10];

#[test]
fn sampled_tokens_are_the_reference_samplers_choice_and_follow_the_seed() {
    let mut runner = tiny_runner(7);
    // The tiny model's logits spread over tens of units: a high temperature makes draws vary.
    let params = SamplingParams {
        temperature: 4.0,
        top_k: 50,
        top_p: 0.95,
    };
    let request = |seed| Request {
        params,
        seed,
        ..Request::greedy(PROMPT, 16)
    };
    let a = run_one(&mut runner, request(1), Some(5)).unwrap();
    for (i, (token, logits)) in a.tokens.iter().zip(&a.logits).enumerate() {
        assert_eq!(*token, sample_reference(logits, &params, 1, i as u64));
    }
    assert_eq!(run_one(&mut runner, request(1), None).unwrap(), a);
    let b = run_one(&mut runner, request(2), None).unwrap();
    assert_ne!(a.tokens, b.tokens, "another seed, another continuation");
    // Different synthetic weights give different logits for the same prompt.
    let other = run_one(&mut tiny_runner(8), request(1), None).unwrap();
    assert_ne!(other.logits[0], a.logits[0]);
}

#[test]
fn a_new_request_in_reused_blocks_sees_nothing_of_the_old_one() {
    let fresh = run_one(
        &mut tiny_runner(3),
        Request::greedy(&PROMPT[3..], 8),
        Some(4),
    )
    .unwrap();
    let mut runner = tiny_runner(3);
    // A longer request fills blocks 0.. first; the next one starts over in the same blocks.
    let long: Vec<u32> = (0..40).map(|i| (i * 7 % 256) as u32).collect();
    run_one(&mut runner, Request::greedy(&long, 8), None).unwrap();
    let reused = run_one(&mut runner, Request::greedy(&PROMPT[3..], 8), Some(4)).unwrap();
    assert_eq!(reused, fresh);
}

#[test]
fn batched_decode_of_many_sequences_equals_each_alone() {
    let prompts: [&[u32]; 4] = [
        &PROMPT[..3],
        PROMPT,
        &PROMPT[5..],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9],
    ];
    let requests: Vec<Request> = prompts.iter().map(|p| Request::greedy(p, 10)).collect();
    let mut runner = tiny_runner(11);
    let together = run(&mut runner, &requests, Some(4)).unwrap();
    for (r, got) in requests.iter().zip(together) {
        assert_eq!(got, run_one(&mut tiny_runner(11), r.clone(), None).unwrap());
    }
}

#[test]
fn logits_only_when_asked_and_only_for_sampling_sequences() {
    let mut runner = tiny_runner(5);
    let blocks = [0u32];
    let blocks2 = [1u32];
    let plan = |want_logits| StepPlan {
        seqs: vec![
            SeqStep {
                slot: 0,
                tokens: &PROMPT[..4],
                start_pos: 0,
                blocks: &blocks,
                state_slot: None,
                sample: None,
                prefill: true,
                continues: false,
            },
            SeqStep {
                slot: 1,
                tokens: &PROMPT[..4],
                start_pos: 0,
                blocks: &blocks2,
                state_slot: None,
                sample: Some(SampleRequest {
                    params: SamplingParams::GREEDY,
                    seed: 0,
                    counter: 0,
                }),
                prefill: true,
                continues: false,
            },
        ],
        want_logits,
    };
    let out = runner.step(&plan(false)).unwrap();
    assert_eq!(out.tokens.len(), 2);
    assert_eq!(out.tokens[0], None);
    assert!(out.logits.iter().all(Vec::is_empty));
    let out = runner.step(&plan(true)).unwrap();
    assert!(out.logits[0].is_empty());
    assert_eq!(out.logits[1].len(), Qwen3Config::tiny().vocab_size);
    assert_eq!(
        out.tokens[1],
        Some(aot_kernels::ops::sampling::argmax_reference(&out.logits[1]))
    );
    let report = runner.report();
    assert_eq!(report["device"], "cpu");
    assert_eq!(report["steps"], 2);
    assert_eq!(report["tokens_processed"], 16);
}

#[test]
fn bad_sampling_parameters_and_a_model_too_large_are_refused() {
    let mut runner = tiny_runner(5);
    let mut request = Request::greedy(PROMPT, 2);
    request.params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.0,
    };
    let err = run_one(&mut runner, request, None).unwrap_err().to_string();
    assert!(err.contains("slot 0") && err.contains("top_p"), "{err}");

    // Far more than any machine's memory: refused before a weight is generated.
    let huge = ModelConfig::Qwen3(Qwen3Config {
        num_hidden_layers: 100_000,
        ..Qwen3Config::qwen3_4b()
    });
    let err = CpuRunner::new(
        &huge,
        &Weights::Synthetic { seed: 1 },
        CpuRunnerOptions {
            max_slots: 1,
            kv_blocks: 1,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("memory available") && err.contains("--device cuda"),
        "{err}"
    );
}
