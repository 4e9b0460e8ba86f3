//! A minimal driver for any [`Runner`] (until the engine's scheduler exists, and for tests that
//! must control chunking exactly): request `i` gets slot `i` and its own consecutive KV blocks;
//! each step carries, for every unfinished request, its next prefill chunk or its one decode token.

use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;
use aot_kernels::ops::sampling::SamplingParams;
use qwen_engine::runner::{Runner, RunnerError, SampleRequest, SeqStep, StepPlan};

#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub prompt: &'a [u32],
    pub new_tokens: usize,
    pub params: SamplingParams,
    pub seed: u64,
    /// Teacher forcing: feed these tokens (the oracle's) instead of the sampled ones, so the
    /// logits stay comparable after a divergence.
    pub teacher: Option<&'a [u32]>,
}

impl<'a> Request<'a> {
    pub fn greedy(prompt: &'a [u32], new_tokens: usize) -> Self {
        Request {
            prompt,
            new_tokens,
            params: SamplingParams::GREEDY,
            seed: 0,
            teacher: None,
        }
    }
}

/// What a request produced: the sampled tokens and the logits each was drawn from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

/// KV blocks one request needs.
pub fn blocks_for(r: &Request<'_>) -> usize {
    (r.prompt.len() + r.new_tokens).div_ceil(KV_BLOCK_TOKENS)
}

/// Runs `requests` together to completion; prefill chunks of `chunk` tokens (`None`: the whole
/// prompt in one step). Returns one generation per request, with logits.
pub fn run(
    runner: &mut dyn Runner,
    requests: &[Request<'_>],
    chunk: Option<usize>,
) -> Result<Vec<Generation>, RunnerError> {
    assert!(
        requests.len() <= runner.max_slots(),
        "more requests than slots"
    );
    let mut tables = Vec::with_capacity(requests.len());
    let mut next_block = 0u32;
    for r in requests {
        assert!(!r.prompt.is_empty() && r.new_tokens > 0);
        let n = blocks_for(r) as u32;
        tables.push((next_block..next_block + n).collect::<Vec<u32>>());
        next_block += n;
    }
    assert!(
        next_block as usize <= runner.kv_blocks(),
        "KV cache too small"
    );

    // A runner with recurrent state gives request `i` state slot `i`.
    let stateful = runner.state_slots() > 0;
    let mut fed = vec![0usize; requests.len()];
    let mut gens = vec![Generation::default(); requests.len()];
    loop {
        // Each unfinished request's input for this step (owned, so the plan can borrow it).
        let mut inputs: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let g = &gens[i];
            if g.tokens.len() == r.new_tokens {
                continue;
            }
            if fed[i] < r.prompt.len() {
                let end = chunk.map_or(r.prompt.len(), |c| (fed[i] + c).min(r.prompt.len()));
                inputs.push((i, r.prompt[fed[i]..end].to_vec(), end == r.prompt.len()));
            } else {
                let k = g.tokens.len() - 1;
                let last = r.teacher.map_or(g.tokens[k], |t| t[k]);
                inputs.push((i, vec![last], true));
            }
        }
        if inputs.is_empty() {
            return Ok(gens);
        }
        let plan = StepPlan {
            seqs: inputs
                .iter()
                .map(|(i, tokens, sample)| {
                    let r = &requests[*i];
                    SeqStep {
                        slot: *i,
                        tokens,
                        start_pos: fed[*i],
                        blocks: &tables[*i],
                        state_slot: stateful.then_some(*i as u32),
                        sample: sample.then_some(SampleRequest {
                            params: r.params,
                            seed: r.seed,
                            counter: gens[*i].tokens.len() as u64,
                        }),
                        prefill: fed[*i] < r.prompt.len(),
                        // Another step follows unless this one samples the last token.
                        continues: !sample || gens[*i].tokens.len() + 1 < r.new_tokens,
                    }
                })
                .collect(),
            want_logits: true,
        };
        let out = runner.step(&plan)?;
        for (k, (i, tokens, sample)) in inputs.iter().enumerate() {
            fed[*i] += tokens.len();
            if *sample {
                let token = out.tokens[k].expect("a sampling sequence gets a token");
                gens[*i].tokens.push(token);
                gens[*i].logits.push(out.logits[k].clone());
            }
        }
    }
}

/// One request alone.
pub fn run_one(
    runner: &mut dyn Runner,
    request: Request<'_>,
    chunk: Option<usize>,
) -> Result<Generation, RunnerError> {
    Ok(run(runner, &[request], chunk)?.remove(0))
}
