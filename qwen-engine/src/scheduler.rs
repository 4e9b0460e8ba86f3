//! The request queue, slots, admission and continuous batching: which sequences run in each step
//! and what they feed. Pure bookkeeping (no device), so every decision is tested without a GPU.
//!
//! A submitted request is checked at once: one that can never run (bad tokens, too long for the
//! context, larger than the whole KV cache) is refused with the reason. Any other waits in a
//! first-come queue and is admitted, in order, when a slot and its memory are free: every KV
//! block it can ever need (prompt + max new tokens) and, for a model with recurrent layers, one
//! recurrent-state slot ([`crate::memory`]), so a running request never waits for memory. Each
//! step carries one prefill chunk of every request still reading its prompt and one token of
//! every request that is generating; requests join and finish independently. A finished
//! request's slot, blocks and state slot are free for the next one, whose state starts fresh (its
//! positions start at 0, attention reads only the positions it wrote, and the recurrent state is
//! zeroed by its first step).

use std::collections::VecDeque;

use aot_kernels::ops::sampling::SamplingParams;
use serde::Serialize;

use crate::memory::{Memory, Reservation, Shortfall};
use crate::model::ModelDesc;
use crate::runner::{SampleRequest, SeqStep, StepOutput, StepPlan};

/// What a caller asks for.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// Stop at an end-of-sequence token of the model.
    pub stop_at_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// Why a request was not admitted. The engine keeps serving the others.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty; give at least one token")]
    EmptyPrompt,
    #[error("max_new_tokens is 0; ask for at least one token")]
    NothingToGenerate,
    #[error("prompt token {token} at index {index} is outside the vocabulary (0..{vocab}); check the tokenizer matches the model")]
    TokenOutOfVocab {
        token: u32,
        index: usize,
        vocab: usize,
    },
    #[error("the prompt ({prompt} tokens) plus {new} new tokens exceeds the context of {context} tokens; shorten the prompt, lower --max-new-tokens, or raise --max-context where the model allows more")]
    TooLong {
        prompt: usize,
        new: usize,
        context: usize,
    },
    #[error("the KV cache is too small for this request: it needs {needed} blocks ({needed_mib:.1} MiB) and the cache has {total} in all; raise --kv-budget or shorten the request")]
    KvTooSmall {
        needed: usize,
        total: usize,
        needed_mib: f64,
    },
    #[error("the model has recurrent layers and the runner holds no recurrent-state slot; start it with at least one slot")]
    NoStateSlots,
    #[error("sampling: {0}")]
    Sampling(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Produced `max_new_tokens`.
    Length,
    /// Produced an end-of-sequence token.
    Eos,
}

/// What a step did for the callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Token {
        id: RequestId,
        token: u32,
        index: usize,
    },
    Finished {
        id: RequestId,
        reason: FinishReason,
    },
}

#[derive(Debug)]
struct Active {
    id: RequestId,
    spec: RequestSpec,
    memory: Reservation,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    generated: Vec<u32>,
}

impl Active {
    fn prefilling(&self) -> bool {
        self.prefilled < self.spec.prompt.len()
    }
}

/// Limits the scheduler works within.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerLimits {
    pub slots: usize,
    pub kv_blocks: usize,
    /// Recurrent-state slots (used only for a model with recurrent layers).
    pub state_slots: usize,
    pub max_context: usize,
    pub vocab: usize,
    /// Most prompt tokens one sequence feeds in a step.
    pub prefill_chunk: usize,
    /// Bytes of one KV block (for messages).
    pub block_bytes: usize,
}

#[derive(Debug)]
pub struct Scheduler {
    limits: SchedulerLimits,
    slots: Vec<Option<Active>>,
    /// Submitted requests not yet admitted, first come first.
    waiting: VecDeque<(RequestId, RequestSpec)>,
    memory: Memory,
    eos: Vec<u32>,
    next_id: u64,
}

/// One sequence of a scheduled step, with owned inputs (the plan borrows from it).
#[derive(Debug, Clone)]
pub struct Scheduled {
    pub slot: usize,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    pub sample: Option<SampleRequest>,
    /// A chunk of the prompt (not a generated token).
    pub prefill: bool,
    /// The request runs again next step unless it samples end-of-sequence ([`SeqStep::continues`]).
    pub continues: bool,
}

impl Scheduler {
    pub fn new(limits: SchedulerLimits, model: &ModelDesc) -> Self {
        Scheduler {
            slots: (0..limits.slots).map(|_| None).collect(),
            waiting: VecDeque::new(),
            memory: Memory::new(limits.kv_blocks, limits.state_slots, model),
            limits,
            eos: model.eos_token_ids.clone(),
            next_id: 0,
        }
    }

    pub fn limits(&self) -> &SchedulerLimits {
        &self.limits
    }

    pub fn active(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Requests submitted and not yet admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.active() == 0 && self.waiting.is_empty()
    }

    pub fn free_blocks(&self) -> usize {
        self.memory.blocks().free()
    }

    /// The slot a running request occupies.
    pub fn slot_of(&self, id: RequestId) -> Option<usize> {
        self.slots
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.id == id))
    }

    /// Queues a request, or refuses one that could never run and says why. It is admitted (in
    /// submission order) by the next [`Scheduler::schedule`] that finds a slot and its memory free.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<RequestId, SubmitError> {
        let l = self.limits;
        if spec.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if spec.max_new_tokens == 0 {
            return Err(SubmitError::NothingToGenerate);
        }
        if let Some((index, &token)) = spec
            .prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= l.vocab)
        {
            return Err(SubmitError::TokenOutOfVocab {
                token,
                index,
                vocab: l.vocab,
            });
        }
        spec.sampling.validate().map_err(SubmitError::Sampling)?;
        let positions = positions(&spec).unwrap_or(usize::MAX);
        if positions > l.max_context {
            return Err(SubmitError::TooLong {
                prompt: spec.prompt.len(),
                new: spec.max_new_tokens,
                context: l.max_context,
            });
        }
        match self.memory.fits_ever(positions) {
            Ok(()) => {}
            Err(Shortfall::KvNever { needed, total }) => {
                return Err(SubmitError::KvTooSmall {
                    needed,
                    total,
                    needed_mib: needed as f64 * l.block_bytes as f64 / (1 << 20) as f64,
                })
            }
            Err(Shortfall::NoStateSlots) => return Err(SubmitError::NoStateSlots),
            Err(Shortfall::Busy) => unreachable!("fits_ever never says busy"),
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back((id, spec));
        Ok(id)
    }

    /// Admits waiting requests in order while a slot and their memory are free; the first that
    /// does not fit waits, and so do the ones behind it (no request overtakes an earlier one).
    fn admit(&mut self) {
        while let Some((_, spec)) = self.waiting.front() {
            let Some(slot) = self.slots.iter().position(Option::is_none) else {
                return;
            };
            // `submit` checked that the positions fit the context.
            let positions = positions(spec).unwrap_or(usize::MAX);
            let Ok(memory) = self.memory.reserve(positions) else {
                return;
            };
            let (id, spec) = self.waiting.pop_front().expect("front exists");
            self.slots[slot] = Some(Active {
                id,
                spec,
                memory,
                prefilled: 0,
                generated: Vec::new(),
            });
        }
    }

    /// The blocks of the request in `slot` (for the runner's block table).
    pub fn blocks(&self, slot: usize) -> Option<&[u32]> {
        self.slots
            .get(slot)?
            .as_ref()
            .map(|a| a.memory.blocks.as_slice())
    }

    /// The recurrent-state slot of the request in `slot` (models with recurrent layers).
    pub fn state_slot(&self, slot: usize) -> Option<u32> {
        self.slots.get(slot)?.as_ref()?.memory.state
    }

    /// The next step, after admitting what fits of the queue: a prefill chunk for each request
    /// reading its prompt, one token for each generating request; slot order.
    pub fn schedule(&mut self) -> Vec<Scheduled> {
        self.admit();
        let mut out = Vec::new();
        for (slot, a) in self.slots.iter().enumerate() {
            let Some(a) = a else { continue };
            if a.prefilling() {
                let end = (a.prefilled + self.limits.prefill_chunk).min(a.spec.prompt.len());
                let last = end == a.spec.prompt.len();
                out.push(Scheduled {
                    slot,
                    tokens: a.spec.prompt[a.prefilled..end].to_vec(),
                    start_pos: a.prefilled,
                    sample: last.then(|| a.sample_request(0)),
                    prefill: true,
                    // After its last chunk the request generates on, unless one token is all.
                    continues: !last || a.spec.max_new_tokens > 1,
                });
            } else {
                let token = *a
                    .generated
                    .last()
                    .expect("a request past its prompt has sampled a token");
                out.push(Scheduled {
                    slot,
                    tokens: vec![token],
                    start_pos: a.spec.prompt.len() + a.generated.len() - 1,
                    sample: Some(a.sample_request(a.generated.len() as u64)),
                    prefill: false,
                    // This step's token is not its last.
                    continues: a.generated.len() + 1 < a.spec.max_new_tokens,
                });
            }
        }
        out
    }

    /// The runner's view of a schedule (borrowing its token lists and the slots' block tables).
    pub fn plan<'a>(&'a self, scheduled: &'a [Scheduled], want_logits: bool) -> StepPlan<'a> {
        StepPlan {
            seqs: scheduled
                .iter()
                .map(|s| SeqStep {
                    slot: s.slot,
                    tokens: &s.tokens,
                    start_pos: s.start_pos,
                    blocks: self.blocks(s.slot).unwrap_or(&[]),
                    state_slot: self.state_slot(s.slot),
                    sample: s.sample,
                    prefill: s.prefill,
                    continues: s.continues,
                })
                .collect(),
            want_logits,
        }
    }

    /// Applies what the runner produced: advances prompts, records tokens, finishes requests and
    /// frees their slots and blocks.
    pub fn commit(&mut self, scheduled: &[Scheduled], out: &StepOutput) -> Vec<Event> {
        let mut events = Vec::new();
        for (s, token) in scheduled.iter().zip(&out.tokens) {
            let Some(a) = self.slots[s.slot].as_mut() else {
                continue;
            };
            if a.prefilling() {
                a.prefilled += s.tokens.len();
            }
            let Some(token) = *token else { continue };
            a.generated.push(token);
            events.push(Event::Token {
                id: a.id,
                token,
                index: a.generated.len() - 1,
            });
            let reason = if a.spec.stop_at_eos && self.eos.contains(&token) {
                Some(FinishReason::Eos)
            } else if a.generated.len() >= a.spec.max_new_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                events.push(Event::Finished { id: a.id, reason });
                let done = self.slots[s.slot].take().expect("the slot is active");
                self.memory.release(done.memory);
            }
        }
        events
    }

    /// Drops every request, running or waiting (after a runner failure), freeing their memory.
    pub fn abort_all(&mut self) -> Vec<RequestId> {
        let mut ids = Vec::new();
        for slot in self.slots.iter_mut() {
            if let Some(a) = slot.take() {
                ids.push(a.id);
                self.memory.release(a.memory);
            }
        }
        ids.extend(self.waiting.drain(..).map(|(id, _)| id));
        ids
    }
}

/// The cache positions a request fills: the last generated token is never fed back, so prompt +
/// new - 1 (`None` past `usize`, which no context holds).
fn positions(spec: &RequestSpec) -> Option<usize> {
    spec.prompt
        .len()
        .checked_add(spec.max_new_tokens)
        .map(|n| n.saturating_sub(1))
}

impl Active {
    fn sample_request(&self, counter: u64) -> SampleRequest {
        SampleRequest {
            params: self.spec.sampling,
            seed: self.spec.seed,
            counter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SchedulerLimits {
        SchedulerLimits {
            slots: 2,
            kv_blocks: 10,
            state_slots: 0,
            max_context: 100,
            vocab: 50,
            prefill_chunk: 4,
            block_bytes: 1024,
        }
    }

    /// A dense model ending at `eos` (with `recurrent`, one whose first layer keeps a state).
    fn model(eos: &[u32], recurrent: bool) -> ModelDesc {
        use crate::model::LayerKind;
        ModelDesc {
            model_type: "test",
            vocab_size: 50,
            hidden_size: 8,
            max_context: 100,
            eos_token_ids: eos.to_vec(),
            layers: vec![
                if recurrent {
                    LayerKind::Recurrent
                } else {
                    LayerKind::Attention
                },
                LayerKind::Attention,
            ],
            kv_bytes_per_token: 64,
            state_bytes: if recurrent { 256 } else { 0 },
            parameter_count: 0,
        }
    }

    fn dense(l: SchedulerLimits, eos: &[u32]) -> Scheduler {
        Scheduler::new(l, &model(eos, false))
    }

    fn spec(prompt: &[u32], new: usize) -> RequestSpec {
        RequestSpec {
            prompt: prompt.to_vec(),
            max_new_tokens: new,
            sampling: SamplingParams::GREEDY,
            seed: 0,
            stop_at_eos: true,
        }
    }

    fn tokens(n: usize, t: u32) -> StepOutput {
        StepOutput {
            tokens: vec![Some(t); n],
            logits: vec![],
        }
    }

    #[test]
    fn prompts_are_chunked_then_decoded_one_token_at_a_time() {
        let mut s = dense(limits(), &[]);
        let id = s.submit(spec(&[1, 2, 3, 4, 5, 6], 3)).unwrap();
        let step = s.schedule();
        let slot = s.slot_of(id).unwrap();
        assert_eq!(
            (
                step[0].tokens.clone(),
                step[0].start_pos,
                step[0].sample.is_none()
            ),
            (vec![1, 2, 3, 4], 0, true)
        );
        let out = StepOutput {
            tokens: vec![None],
            logits: vec![],
        };
        assert!(s.commit(&step, &out).is_empty());
        let step = s.schedule();
        assert_eq!((step[0].tokens.clone(), step[0].start_pos), (vec![5, 6], 4));
        assert_eq!(step[0].sample.unwrap().counter, 0);
        let ev = s.commit(&step, &tokens(1, 9));
        assert_eq!(
            ev,
            vec![Event::Token {
                id,
                token: 9,
                index: 0
            }]
        );
        let step = s.schedule();
        assert_eq!(
            (
                step[0].tokens.clone(),
                step[0].start_pos,
                step[0].sample.unwrap().counter
            ),
            (vec![9], 6, 1)
        );
        s.commit(&step, &tokens(1, 8));
        let step = s.schedule();
        let ev = s.commit(&step, &tokens(1, 7));
        assert_eq!(
            ev[1],
            Event::Finished {
                id,
                reason: FinishReason::Length
            }
        );
        assert_eq!((s.active(), s.free_blocks()), (0, 10));
        assert!(s.blocks(slot).is_none());
    }

    #[test]
    fn every_step_says_whether_its_sequence_runs_again() {
        let mut s = dense(limits(), &[]);
        s.submit(spec(&[1, 2, 3, 4, 5, 6], 3)).unwrap();
        s.submit(spec(&[1, 2], 1)).unwrap();
        let mut seen = Vec::new();
        while !s.is_idle() {
            let step = s.schedule();
            seen.push(
                step.iter()
                    .map(|x| (x.slot, x.prefill, x.continues))
                    .collect::<Vec<_>>(),
            );
            let out = StepOutput {
                tokens: step.iter().map(|x| x.sample.map(|_| 9)).collect(),
                logits: vec![],
            };
            s.commit(&step, &out);
        }
        assert_eq!(
            seen,
            vec![
                // A prompt chunk goes on; the one-token request ends with its prompt's last chunk.
                vec![(0, true, true), (1, true, false)],
                // The last chunk, then two generated tokens fed back: the second is the last.
                vec![(0, true, true)],
                vec![(0, false, true)],
                vec![(0, false, false)],
            ]
        );
    }

    #[test]
    fn requests_join_and_leave_independently_and_slots_are_reused() {
        let mut s = dense(limits(), &[42]);
        let a = s.submit(spec(&[1], 5)).unwrap();
        let step = s.schedule();
        s.commit(&step, &tokens(1, 3));
        let b = s.submit(spec(&[1, 2], 5)).unwrap();
        let step = s.schedule();
        let slot_b = s.slot_of(b).unwrap();
        assert_eq!(step.len(), 2, "a decodes while b prefills");
        assert!(step[0].tokens.len() == 1 && step[1].start_pos == 0);
        // a hits EOS and leaves; b goes on; a new request takes a's slot.
        let ev = s.commit(
            &step,
            &StepOutput {
                tokens: vec![Some(42), Some(4)],
                logits: vec![],
            },
        );
        assert!(ev.contains(&Event::Finished {
            id: a,
            reason: FinishReason::Eos
        }));
        assert!(ev.contains(&Event::Token {
            id: b,
            token: 4,
            index: 0
        }));
        let c = s.submit(spec(&[7], 2)).unwrap();
        let d = s.submit(spec(&[1], 2)).unwrap();
        // The new request starts at position 0 in its own blocks; the one after it waits.
        let step = s.schedule();
        let slot_c = s.slot_of(c).expect("a's slot is free again");
        assert_ne!(slot_c, slot_b);
        assert_eq!((s.slot_of(d), s.waiting()), (None, 1));
        let c = step.iter().find(|x| x.slot == slot_c).unwrap();
        assert_eq!((c.start_pos, c.tokens.clone()), (0, vec![7]));
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        let mut s = dense(limits(), &[]);
        assert_eq!(
            s.submit(spec(&[], 1)).unwrap_err(),
            SubmitError::EmptyPrompt
        );
        assert_eq!(
            s.submit(spec(&[1], 0)).unwrap_err(),
            SubmitError::NothingToGenerate
        );
        assert!(matches!(
            s.submit(spec(&[1, 99], 1)).unwrap_err(),
            SubmitError::TokenOutOfVocab {
                token: 99,
                index: 1,
                ..
            }
        ));
        let long = vec![1; 90];
        assert!(matches!(
            s.submit(spec(&long, 20)).unwrap_err(),
            SubmitError::TooLong { .. }
        ));
        // A count of new tokens past usize is too long too, not a wrapped small request.
        assert!(matches!(
            s.submit(spec(&[1, 2], usize::MAX)).unwrap_err(),
            SubmitError::TooLong {
                new: usize::MAX,
                ..
            }
        ));
        // 10 blocks of 16 = 160 positions, but the context allows 100: ask for 95 positions (6 blocks) twice.
        let p = vec![1; 80];
        s.submit(spec(&p, 16)).unwrap();
        s.schedule();
        let mut small = dense(
            SchedulerLimits {
                kv_blocks: 2,
                ..limits()
            },
            &[],
        );
        let err = small.submit(spec(&p, 16)).unwrap_err();
        assert!(
            matches!(
                err,
                SubmitError::KvTooSmall {
                    needed: 6,
                    total: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--kv-budget"));
        let bad = RequestSpec {
            sampling: SamplingParams {
                temperature: -1.0,
                top_k: 0,
                top_p: 1.0,
            },
            ..spec(&[1], 1)
        };
        assert!(matches!(
            s.submit(bad).unwrap_err(),
            SubmitError::Sampling(_)
        ));
        assert_eq!(s.active(), 1, "refusals leave the running request alone");
    }

    #[test]
    fn requests_that_could_fit_later_wait_their_turn_in_order() {
        // 10 blocks: a 95-position request takes 6, so a second one waits for the first.
        let mut s = dense(limits(), &[]);
        let long = vec![1; 80];
        let a = s.submit(spec(&long, 16)).unwrap();
        let b = s.submit(spec(&long, 16)).unwrap();
        // A small request behind b would fit now, but does not overtake it.
        let c = s.submit(spec(&[1], 1)).unwrap();
        s.schedule();
        assert_eq!(
            (s.slot_of(a), s.slot_of(b), s.slot_of(c)),
            (Some(0), None, None)
        );
        assert_eq!(s.waiting(), 2);
        // Record the order in which requests first get a slot.
        let mut admitted = vec![a];
        while !s.is_idle() {
            let step = s.schedule();
            for id in [a, b, c] {
                if s.slot_of(id).is_some() && !admitted.contains(&id) {
                    admitted.push(id);
                }
            }
            let out = StepOutput {
                tokens: step.iter().map(|x| x.sample.map(|_| 9)).collect(),
                logits: vec![],
            };
            s.commit(&step, &out);
        }
        assert_eq!(admitted, vec![a, b, c], "admitted in submission order");
        assert_eq!(s.free_blocks(), 10);
    }

    #[test]
    fn forty_requests_on_eight_slots_all_run_eight_at_a_time() {
        let mut s = dense(
            SchedulerLimits {
                slots: 8,
                kv_blocks: 64,
                ..limits()
            },
            &[],
        );
        let ids: Vec<RequestId> = (0..40)
            .map(|_| s.submit(spec(&[1, 2], 3)).unwrap())
            .collect();
        let (mut done, mut widest) = (0, 0);
        while !s.is_idle() {
            let step = s.schedule();
            widest = widest.max(step.len());
            let out = StepOutput {
                tokens: step.iter().map(|x| x.sample.map(|_| 9)).collect(),
                logits: vec![],
            };
            done += s
                .commit(&step, &out)
                .iter()
                .filter(|e| matches!(e, Event::Finished { .. }))
                .count();
        }
        assert_eq!((done, widest, ids.len()), (40, 8, 40));
    }

    #[test]
    fn a_recurrent_model_admits_as_many_requests_as_state_slots() {
        let l = SchedulerLimits {
            slots: 4,
            state_slots: 2,
            ..limits()
        };
        let mut s = Scheduler::new(l, &model(&[], true));
        let ids: Vec<RequestId> = (0..3).map(|_| s.submit(spec(&[1], 4)).unwrap()).collect();
        let step = s.schedule();
        assert_eq!(step.len(), 2, "two state slots, two requests");
        let states: Vec<Option<u32>> = (0..2).map(|slot| s.state_slot(slot)).collect();
        assert_eq!(states, vec![Some(0), Some(1)]);
        let plan = s.plan(&step, false);
        assert_eq!(plan.seqs[1].state_slot, Some(1));
        assert_eq!(s.slot_of(ids[2]), None);
        let none = Scheduler::new(
            SchedulerLimits {
                state_slots: 0,
                ..l
            },
            &model(&[], true),
        )
        .submit(spec(&[1], 1))
        .unwrap_err();
        assert_eq!(none, SubmitError::NoStateSlots);
    }
}
