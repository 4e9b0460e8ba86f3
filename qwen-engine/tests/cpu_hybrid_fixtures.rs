//! The CPU reference engine against transformers on the hybrid Qwen3.5/3.6-MoE fixtures
//! (`tests/fixtures-hybrid/`, made by `scripts/oracle/make_hybrid_fixtures.py`): token for token
//! in every config layout (text-only and the released checkpoint's) and weight layout (experts
//! fused or one by one), and the state rules: chunked prompts, a reused slot and a batch give the
//! tokens of a request alone.

mod common;

use common::driver::{run, run_one, Request};
use common::fixtures::{self, Fixture};
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::model::ModelConfig;
use qwen_engine::weights::Weights;

/// Logit tolerance against transformers' float32, as for the dense fixtures: both compute in
/// float32 on the same bf16 weights; the delta rule's order of sums differs (transformers runs
/// prompts through its chunked form, the reference token by token). The largest difference
/// measured over every fixture's top-5 logits is 7.6e-6, so this leaves a factor of 4.
const TOL: f32 = 3e-5;

fn runner(config: &ModelConfig, weights: &Weights, slots: usize) -> CpuRunner {
    CpuRunner::new(
        config,
        weights,
        CpuRunnerOptions {
            max_slots: slots,
            kv_blocks: 256,
        },
    )
    .unwrap()
}

fn runner_for(f: &Fixture, slots: usize) -> CpuRunner {
    let (config, weights) = f.load_model();
    runner(&config, &weights, slots)
}

#[test]
fn cpu_engine_reproduces_every_hybrid_fixture_token_for_token() {
    let all = fixtures::all_hybrid();
    assert!(all.len() >= 4, "{} hybrid fixtures", all.len());
    let mut worst = 0.0f32;
    for f in &all {
        let mut r = runner_for(f, 1);
        for prompt in &f.expected.prompts {
            let got = run_one(
                &mut r,
                Request::greedy(&prompt.ids, prompt.steps.len()),
                None,
            )
            .unwrap();
            let (_, rel) = fixtures::check_against_oracle(f, prompt, &got, TOL);
            worst = worst.max(rel);
        }
    }
    eprintln!("top-5 logits vs transformers float32: max |diff|/max(|logit|,1) {worst:e}");
}

#[test]
fn hybrid_fixtures_cover_both_config_layouts_and_both_expert_layouts() {
    let all = fixtures::all_hybrid();
    let layout = |f: &Fixture| {
        let (config, _) = f.load_model();
        let per_expert = f.name.ends_with("-per-expert");
        (config.model_type(), per_expert)
    };
    let seen: Vec<(&str, bool)> = all.iter().map(layout).collect();
    for want in [
        ("qwen3_5_moe_text", false),
        ("qwen3_5_moe_text", true),
        ("qwen3_5_moe", false),
        ("qwen3_5_moe", true),
    ] {
        assert!(
            seen.contains(&want),
            "no fixture in layout {want:?}: {seen:?}"
        );
    }
    let longest = all
        .iter()
        .flat_map(|f| f.expected.prompts.iter().map(|p| p.ids.len()))
        .max();
    assert!(longest > Some(512), "a prompt past 512 tokens");
}

#[test]
fn every_layout_of_one_model_loads_to_the_same_tensors() {
    let all = fixtures::all_hybrid();
    let family = |f: &Fixture| {
        f.name
            .trim_end_matches("-per-expert")
            .trim_end_matches("-fused")
            .trim_end_matches("-text")
            .trim_end_matches("-cond")
            .to_string()
    };
    let mut compared = 0;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if family(a) != family(b) {
                continue;
            }
            let (ca, wa) = a.load_model();
            let (cb, wb) = b.load_model();
            let (ta, tb) = (ca.tensor_table(), cb.tensor_table());
            assert_eq!(ta.len(), tb.len());
            for (k, (sa, sb)) in ta.iter().zip(&tb).enumerate() {
                let (ha, hb) = (
                    wa.host_tensor(sa, k).unwrap(),
                    wb.host_tensor(sb, k).unwrap(),
                );
                assert_eq!(sa.shape, sb.shape, "{} vs {}: {}", a.name, b.name, sa.name);
                assert!(
                    ha.bf16() == hb.bf16(),
                    "{} vs {}: `{}` and `{}` differ",
                    a.name,
                    b.name,
                    sa.name,
                    sb.name
                );
            }
            compared += 1;
        }
    }
    assert!(compared >= 2, "{compared} layout pairs compared");
}

#[test]
fn prompt_chunks_of_16_64_and_whole_give_the_same_bits() {
    let f = longest_prompt_fixture();
    let prompt = f.longest_prompt();
    let mut r = runner_for(&f, 1);
    let request = || Request::greedy(&prompt.ids, 8);
    let whole = run_one(&mut r, request(), None).unwrap();
    for chunk in [16, 64] {
        let chunked = run_one(&mut r, request(), Some(chunk)).unwrap();
        assert_eq!(chunked, whole, "{}: chunks of {chunk}", f.name);
    }
}

#[test]
fn two_requests_in_sequence_in_one_slot_give_the_tokens_of_each_alone() {
    let f = longest_prompt_fixture();
    let (a, b) = (&f.expected.prompts[0], &f.expected.prompts[1]);
    let alone = |p: &fixtures::Prompt| {
        let mut r = runner_for(&f, 1);
        run_one(&mut r, Request::greedy(&p.ids, 12), Some(16)).unwrap()
    };
    // One runner, one slot: b starts where a's state was left.
    let mut r = runner_for(&f, 1);
    let first = run_one(&mut r, Request::greedy(&a.ids, 12), Some(16)).unwrap();
    let second = run_one(&mut r, Request::greedy(&b.ids, 12), Some(16)).unwrap();
    assert_eq!(first, alone(a));
    assert_eq!(
        second,
        alone(b),
        "the reused slot saw the previous request's state"
    );
}

#[test]
fn a_batch_gives_each_requests_single_run_tokens() {
    for f in fixtures::all_hybrid()
        .into_iter()
        .filter(|f| f.name.ends_with("text-fused") || f.name.ends_with("cond-per-expert"))
    {
        let requests: Vec<Request> = f
            .expected
            .prompts
            .iter()
            .map(|p| Request::greedy(&p.ids, 10))
            .collect();
        let mut batched_runner = runner_for(&f, requests.len());
        let batched = run(&mut batched_runner, &requests, Some(64)).unwrap();
        for (req, got) in requests.iter().zip(&batched) {
            let mut r = runner_for(&f, 1);
            let alone = run_one(&mut r, req.clone(), Some(64)).unwrap();
            assert_eq!(got, &alone, "{}: batched differs from alone", f.name);
        }
    }
}

fn longest_prompt_fixture() -> Fixture {
    fixtures::all_hybrid()
        .into_iter()
        .max_by_key(|f| f.longest_prompt().ids.len())
        .expect("hybrid fixtures")
}
