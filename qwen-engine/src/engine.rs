//! The engine loop: a [`Scheduler`] deciding what runs, a [`Runner`] running it, and events for
//! the callers (tokens as they are made, and finished requests).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::memory::block_bytes;
use crate::model::ModelDesc;
use crate::runner::{Runner, RunnerError};
use crate::scheduler::{Event, RequestId, RequestSpec, Scheduler, SchedulerLimits, SubmitError};

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
    #[error("the device failed during a step ({aborted} request(s) aborted): {source}")]
    Runner { source: RunnerError, aborted: usize },
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
            block_bytes: block_bytes(model),
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
        let out = match out {
            Ok(out) => out,
            Err(source) => {
                let aborted = self.scheduler.abort_all().len();
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
