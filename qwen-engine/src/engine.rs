//! The engine loop: a [`Scheduler`] deciding what runs, a [`Runner`] running it, and events for
//! the callers (tokens as they are made, and finished requests).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::memory::block_bytes;
use crate::model::ModelDesc;
use crate::runner::{Runner, RunnerError, StepOutput};
use crate::scheduler::{
    Event, RequestId, RequestSpec, Scheduled, Scheduler, SchedulerLimits, SubmitError,
};

/// Engine settings beyond what the runner fixes.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// Longest sequence (prompt + generated) a request may reach.
    pub max_context: usize,
    /// Most prompt tokens a sequence feeds in one step.
    pub prefill_chunk: usize,
}

impl EngineOptions {
    pub fn for_model(model: &ModelDesc) -> Self {
        EngineOptions {
            max_context: model.max_context,
            prefill_chunk: 512,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "the device failed during a step ({}): {source}",
        aborted_list(aborted)
    )]
    Runner {
        source: RunnerError,
        /// Every request that was running or waiting: none of them goes on.
        aborted: Vec<RequestId>,
    },
}

/// "aborted requests 3, 4 and 7" for [`EngineError::Runner`] (the first 16 ids, then a count).
fn aborted_list(ids: &[RequestId]) -> String {
    const SHOWN: usize = 16;
    let n: Vec<String> = ids.iter().take(SHOWN).map(|id| id.0.to_string()).collect();
    match ids.len() {
        0 => "no request was running or waiting".into(),
        1 => format!("aborted request {}", n[0]),
        len if len <= SHOWN => format!(
            "aborted requests {} and {}",
            n[..len - 1].join(", "),
            n[len - 1]
        ),
        len => format!("aborted requests {} and {} more", n.join(", "), len - SHOWN),
    }
}

/// A runner's output has a token exactly where the plan asked for a sample (`Runner` is a public
/// trait: a short or misplaced output would leave a prompt's progress, or a request's tokens,
/// wrong).
fn output_fits(scheduled: &[Scheduled], out: StepOutput) -> Result<StepOutput, RunnerError> {
    if out.tokens.len() != scheduled.len() {
        return Err(RunnerError::Device(format!(
            "the runner returned {} results for a step of {} sequences",
            out.tokens.len(),
            scheduled.len()
        )));
    }
    if let Some((s, t)) = scheduled
        .iter()
        .zip(&out.tokens)
        .find(|(s, t)| s.sample.is_some() != t.is_some())
    {
        let what = match t {
            Some(_) => "a token where the plan asked for no sample",
            None => "no token where the plan asked for a sample",
        };
        return Err(RunnerError::Device(format!(
            "slot {}: the runner returned {what}",
            s.slot
        )));
    }
    Ok(out)
}

/// Time spent by kind of step, for reports.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StepTimes {
    pub steps: usize,
    pub prefill_steps: usize,
    pub prefill_s: f64,
    pub decode_steps: usize,
    pub decode_s: f64,
}

pub struct Engine {
    runner: Box<dyn Runner>,
    scheduler: Scheduler,
    times: StepTimes,
    last_logits: Vec<(RequestId, Vec<f32>)>,
    keep_logits: bool,
}

impl Engine {
    pub fn new(runner: Box<dyn Runner>, model: &ModelDesc, options: EngineOptions) -> Self {
        let limits = SchedulerLimits {
            slots: runner.max_slots(),
            kv_blocks: runner.kv_blocks(),
            state_slots: runner.state_slots(),
            max_context: options
                .max_context
                .min(model.max_context)
                .min(runner.max_context()),
            vocab: model.vocab_size,
            prefill_chunk: options.prefill_chunk.max(1),
            block_bytes: runner
                .kv_block_bytes()
                .unwrap_or_else(|| block_bytes(model)),
        };
        Engine {
            runner,
            scheduler: Scheduler::new(limits, model),
            times: StepTimes::default(),
            last_logits: Vec::new(),
            keep_logits: false,
        }
    }

    /// Keep the logits each sampled token was drawn from (tests, teacher forcing).
    pub fn keep_logits(&mut self, on: bool) {
        self.keep_logits = on;
    }

    pub fn runner(&self) -> &dyn Runner {
        self.runner.as_ref()
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn times(&self) -> StepTimes {
        self.times
    }

    /// Queues a request (it runs as soon as a slot and its memory are free, in submission
    /// order), or says why it can never be served (the others are not affected).
    pub fn submit(&mut self, spec: RequestSpec) -> Result<RequestId, SubmitError> {
        self.scheduler.submit(spec)
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.scheduler.is_idle()
    }

    /// The logits of the last step's samples, by request (with [`Engine::keep_logits`]).
    pub fn last_logits(&self) -> &[(RequestId, Vec<f32>)] {
        &self.last_logits
    }

    /// Runs one step for every active request.
    pub fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        let scheduled = self.scheduler.schedule();
        if scheduled.is_empty() {
            return Ok(Vec::new());
        }
        let prefill = scheduled.iter().any(|s| s.prefill);
        let started = Instant::now();
        let out = {
            let plan = self.scheduler.plan(&scheduled, self.keep_logits);
            self.runner.step(&plan)
        };
        let out = match out.and_then(|out| output_fits(&scheduled, out)) {
            Ok(out) => out,
            Err(source) => {
                let aborted = self.scheduler.abort_all();
                return Err(EngineError::Runner { source, aborted });
            }
        };
        let elapsed = started.elapsed().as_secs_f64();
        self.times.steps += 1;
        if prefill {
            self.times.prefill_steps += 1;
            self.times.prefill_s += elapsed;
        } else {
            self.times.decode_steps += 1;
            self.times.decode_s += elapsed;
        }
        let events = self.scheduler.commit(&scheduled, &out);
        if self.keep_logits {
            // Logits come per sampling sequence; the token events of this step name their requests.
            let ids = events.iter().filter_map(|e| match e {
                Event::Token { id, .. } => Some(*id),
                _ => None,
            });
            self.last_logits = ids
                .zip(out.logits.into_iter().filter(|l| !l.is_empty()))
                .collect();
        }
        Ok(events)
    }

    /// Steps until every request has finished, handing each event to `on_event`.
    pub fn run(&mut self, mut on_event: impl FnMut(&Event)) -> Result<Duration, EngineError> {
        let started = Instant::now();
        while !self.is_idle() {
            for e in self.step()? {
                on_event(&e);
            }
        }
        Ok(started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, Qwen3Config};
    use crate::runner::{DeviceKind, StepPlan};
    use aot_kernels::ops::sampling::SamplingParams;

    /// A runner that answers every plan with `answer(sequences)` tokens, all of them `Some(1)`.
    struct Miscounting {
        answer: fn(usize) -> usize,
    }

    impl Runner for Miscounting {
        fn device(&self) -> DeviceKind {
            DeviceKind::Cpu
        }
        fn kv_blocks(&self) -> usize {
            64
        }
        fn max_slots(&self) -> usize {
            4
        }
        fn step(&mut self, plan: &StepPlan<'_>) -> Result<StepOutput, RunnerError> {
            let n = (self.answer)(plan.seqs.len());
            Ok(StepOutput {
                tokens: vec![Some(1); n],
                logits: vec![Vec::new(); n],
            })
        }
        fn report(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    #[test]
    fn a_runner_output_that_does_not_fit_the_plan_aborts_with_the_ids_not_a_wrong_commit() {
        let model = ModelConfig::Qwen3(Qwen3Config::tiny()).describe();
        for (answer, says) in [
            (
                (|n| n - 1) as fn(usize) -> usize,
                "returned 1 results for a step of 2",
            ),
            (|n| n, "returned a token where the plan asked for no sample"),
        ] {
            let runner = Miscounting { answer };
            let mut options = EngineOptions::for_model(&model);
            options.prefill_chunk = 4;
            let mut engine = Engine::new(Box::new(runner), &model, options);
            let ids: Vec<RequestId> = (0..2)
                .map(|_| {
                    engine
                        .submit(RequestSpec {
                            prompt: vec![1; 9],
                            max_new_tokens: 3,
                            sampling: SamplingParams::GREEDY,
                            seed: 0,
                            stop_at_eos: false,
                        })
                        .unwrap()
                })
                .collect();
            let err = engine
                .step()
                .expect_err("a miscounted output must fail the step");
            assert!(
                err.to_string().contains("aborted requests 0 and 1"),
                "{err}"
            );
            let EngineError::Runner { source, aborted } = err;
            assert!(source.to_string().contains(says), "{source}");
            assert_eq!(aborted, ids);
            assert!(engine.is_idle());
        }
    }

    #[test]
    fn aborted_lists_name_the_requests() {
        let ids = |n: u64| (0..n).map(RequestId).collect::<Vec<_>>();
        assert_eq!(aborted_list(&[]), "no request was running or waiting");
        assert_eq!(aborted_list(&ids(1)), "aborted request 0");
        assert_eq!(aborted_list(&ids(3)), "aborted requests 0, 1 and 2");
        let many = aborted_list(&ids(20));
        assert!(many.starts_with("aborted requests 0, 1, "), "{many}");
        assert!(many.ends_with(", 15 and 4 more"), "{many}");
    }
}
