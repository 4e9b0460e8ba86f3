//! The CPU reference runner against the oracle fixtures (transformers, float32, on the same bf16
//! weights): every greedy token, and the top-5 logits within a measured tolerance. Plus the
//! properties the GPU runner is held to as well: prefill chunking and batching change nothing.

mod common;

use common::driver::{run, run_one, Request};
use common::fixtures::{self, check_against_oracle, Fixture};
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::runner::Runner;

/// Logit tolerance against transformers' float32: `|cpu - oracle| <= TOL * max(|oracle|, 1)`.
/// Both compute in float32 on the same bf16 weights and differ only in summation order and in
/// last-bit differences of exp/sin/cos; the largest difference measured over every fixture's
/// top-5 logits is 8.9e-6 (README, "Correctness oracle"), so this leaves a factor of 3.
const TOL: f32 = 3e-5;

fn runner_for(f: &Fixture) -> CpuRunner {
    let (config, weights) = f.load_model();
    CpuRunner::new(
        &config,
        &weights,
        CpuRunnerOptions {
            max_slots: 4,
            kv_blocks: 256,
        },
    )
    .unwrap()
}

#[test]
fn cpu_runner_reproduces_every_fixture_token_for_token() {
    let all = fixtures::all();
    assert!(all.len() >= 3);
    let (mut worst_abs, mut worst_rel) = (0.0f32, 0.0f32);
    for f in &all {
        let mut runner = runner_for(f);
        for prompt in &f.expected.prompts {
            let got = run_one(
                &mut runner,
                Request::greedy(&prompt.ids, prompt.steps.len()),
                Some(64),
            )
            .unwrap();
            assert_eq!(got.tokens.len(), f.expected.steps_per_prompt);
            let (a, r) = check_against_oracle(f, prompt, &got, TOL);
            worst_abs = worst_abs.max(a);
            worst_rel = worst_rel.max(r);
        }
    }
    eprintln!(
        "top-5 logits vs transformers float32: max |diff| {worst_abs:e}, max |diff|/max(|logit|,1) {worst_rel:e}"
    );
}

#[test]
fn fixtures_cover_the_promised_shapes() {
    let all = fixtures::all();
    let configs: Vec<_> = all
        .iter()
        .map(|f| f.load_model().0.as_qwen3().expect("dense fixtures").clone())
        .collect();
    let has = |p: &dyn Fn(&qwen_engine::model::Qwen3Config) -> bool| configs.iter().any(p);
    assert!(has(&|c| c.head_dim == 64) && has(&|c| c.head_dim == 128));
    for group in [1, 2, 4] {
        assert!(has(&|c| c.gqa_group() == group), "GQA {group}:1");
    }
    assert!(has(&|c| c.tie_word_embeddings) && has(&|c| !c.tie_word_embeddings));
    assert!(configs.iter().all(|c| !c.hidden_size.is_power_of_two()));
    assert!(all.iter().any(|f| f.expected.config_style == "4.x"));
    for f in &all {
        assert!(f.longest_prompt().ids.len() > 512, "{}", f.name);
    }
}

#[test]
fn prefill_chunk_size_does_not_change_a_bit() {
    for f in fixtures::all() {
        let mut runner = runner_for(&f);
        let prompt = f.longest_prompt();
        let request = Request::greedy(&prompt.ids, 4);
        let whole = run_one(&mut runner, request.clone(), None).unwrap();
        for chunk in [1, 7, 64] {
            let chunked = run_one(&mut runner, request.clone(), Some(chunk)).unwrap();
            assert_eq!(chunked, whole, "{}: chunk {chunk}", f.name);
        }
        assert_eq!(whole.tokens, prompt.generated[..4], "{}", f.name);
    }
}

#[test]
fn batched_sequences_equal_their_single_runs() {
    // Every prompt of a fixture at once: prefill chunks and decode steps of different
    // sequences share steps, yet each sequence gets exactly its single-request result.
    for f in fixtures::all() {
        let mut runner = runner_for(&f);
        let requests: Vec<Request> = f
            .expected
            .prompts
            .iter()
            .map(|p| Request::greedy(&p.ids, 12))
            .collect();
        let together = run(&mut runner, &requests, Some(100)).unwrap();
        for (r, got) in requests.iter().zip(&together) {
            let alone = run_one(&mut runner, r.clone(), Some(100)).unwrap();
            assert_eq!(got, &alone, "{}: prompt of {} ids", f.name, r.prompt.len());
        }
    }
}

#[test]
fn teacher_forcing_feeds_the_oracle_tokens() {
    let f = fixtures::by_name("hd128-gqa2-untied");
    let mut runner = runner_for(&f);
    let prompt = &f.expected.prompts[0];
    let mut request = Request::greedy(&prompt.ids, prompt.steps.len());
    request.teacher = Some(&prompt.generated);
    let forced = run_one(&mut runner, request, None).unwrap();
    check_against_oracle(&f, prompt, &forced, TOL);
    // Forcing other tokens changes what follows.
    let wrong: Vec<u32> = prompt.generated.iter().map(|t| (t + 1) % 512).collect();
    let mut request = Request::greedy(&prompt.ids, 4);
    request.teacher = Some(&wrong);
    let other = run_one(&mut runner, request, None).unwrap();
    assert_eq!(other.tokens[0], prompt.generated[0]);
    assert_ne!(other.logits[1], forced.logits[1]);
}

#[test]
fn plan_errors_name_the_slot_and_the_problem() {
    use qwen_engine::runner::{SeqStep, StepPlan};
    let f = fixtures::by_name("hd64-gqa4-tied");
    let mut runner = runner_for(&f);
    let step = |slot, tokens: &'static [u32], start_pos, blocks: &'static [u32]| SeqStep {
        slot,
        tokens,
        start_pos,
        blocks,
        state_slot: None,
        sample: None,
        prefill: true,
        continues: false,
    };
    let cases: Vec<(Vec<SeqStep>, &str)> = vec![
        (vec![step(9, &[1], 0, &[0])], "slot 9 does not exist"),
        (
            vec![step(0, &[1], 0, &[0]), step(0, &[2], 0, &[1])],
            "appears twice",
        ),
        (vec![step(1, &[], 0, &[0])], "at least one token"),
        (
            vec![SeqStep {
                prefill: false,
                ..step(1, &[1, 2], 0, &[0])
            }],
            "a generated-token step feeds one token, this one 2",
        ),
        (
            vec![step(1, &[1000], 0, &[0])],
            "token 1000 is outside the vocabulary",
        ),
        (vec![step(1, &[1; 17], 0, &[0])], "need 2 KV blocks"),
        (
            vec![step(1, &[1], 0, &[999])],
            "KV block 999 does not exist",
        ),
        (vec![step(1, &[1; 17], 0, &[3, 3])], "names a block twice"),
        (
            vec![step(1, &[1; 33], 0, &[3, 70, 3])],
            "names a block twice",
        ),
        (
            vec![step(0, &[1], 0, &[5]), step(1, &[2], 0, &[5])],
            "another sequence",
        ),
        (
            vec![step(1, &[1], 2048, &[0])],
            "exceed the context of 2048",
        ),
        (
            (0..5).map(|s| step(s, &[1], 0, &[0])).collect(),
            "5 sequences in one step",
        ),
    ];
    for (seqs, want) in cases {
        let err = runner
            .step(&StepPlan {
                seqs,
                want_logits: false,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "expected `{want}` in: {err}");
    }
    // Sequences may share a block they only read (the duplicate check is per sequence), and a
    // refused plan leaves nothing behind for the next.
    runner
        .step(&StepPlan {
            seqs: vec![step(0, &[1], 16, &[5, 6]), step(1, &[2], 16, &[5, 7])],
            want_logits: false,
        })
        .unwrap();
}
