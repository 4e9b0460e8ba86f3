//! Decoding ahead: after queueing a decode pass, the runner queues the pass the engine will most
//! likely ask for next (the same sequences, one position on, fed the tokens this pass samples,
//! copied on the device) before it waits for this pass's tokens. The GPU then runs pass after
//! pass while the host reads tokens, schedules and uploads; without it the GPU idled for the
//! host's part of every step (docs/engine.md gives the measurement).
//!
//! The next step's plan is then checked against the pass queued ahead ([`adopt`]): each of its
//! generated-token rows must be one that pass computed exactly (the same slot, position, token,
//! sampling request and block-table entries). A row's result depends on that row alone, so a plan
//! that leaves rows out (a request that sampled end-of-sequence) is served too, and so is one that
//! also carries a new request's prompt chunk (run after it); such a step queues nothing ahead
//! itself, so the step after it waits once. A plan of other rows, or of a token the caller chose
//! itself, drops the pass and runs anew. For attention layers what the dropped pass wrote is
//! harmless: each row's key and value at its next position, in the block the row's table named
//! (the slot's own: the scheduler reserves a request's blocks for it alone, the contract
//! `SeqStep::continues` states), which the pass that does run that position overwrites, and the
//! scratch buffers every pass rewrites; stream order puts every later writer after it.
//!
//! Not so for recurrent layers: a pass advances a sequence's recurrent state in place, and a
//! dropped pass would leave it one token on, for good. So the runner decodes ahead only for
//! models without recurrent state (`ModelDesc::has_recurrent_state`); a hybrid family's forward
//! would need its state double-buffered (the pass ahead writing the other copy, adopted by
//! swapping) before it could decode ahead.
//!
//! The decisions here are pure; the runner (`gpu::GpuRunner::pass`) applies them.

use super::Row;

/// A pass queued ahead of the engine's next step.
#[derive(Debug, Clone)]
pub(crate) struct AheadPass {
    /// Its rows as queued; each token is the one the pass before sampled for that row (filled
    /// in once the host has read them).
    pub rows: Vec<Row>,
    /// The block-table entries each row's attention read (blocks `0..=pos / block_tokens`).
    pub tables: Vec<Vec<i32>>,
    /// The staging turn that receives its sampled tokens.
    pub turn: usize,
}

/// The pass after `rows` if it can be queued ahead: every row samples, goes on after this step
/// (`continues`, the scheduler's word), and its next position lies inside the context
/// (`max_pos`) and inside a block of its table (`block_of(slot, block)`, negative for none).
/// The rows keep their order (row j feeds on what row j samples); their tokens are left 0.
pub(crate) fn next_rows(
    rows: &[Row],
    continues: &[bool],
    max_pos: usize,
    block_tokens: usize,
    block_of: impl Fn(usize, usize) -> i32,
) -> Option<Vec<Row>> {
    if rows.is_empty() || continues.len() != rows.len() {
        return None;
    }
    rows.iter()
        .zip(continues)
        .map(|(r, &goes_on)| {
            let sample = r.sample?;
            let pos = r.pos + 1;
            (goes_on && pos < max_pos && block_of(r.slot, pos / block_tokens) >= 0).then_some(Row {
                token: 0,
                pos,
                slot: r.slot,
                sample: Some(crate::runner::SampleRequest {
                    counter: sample.counter + 1,
                    ..sample
                }),
            })
        })
        .collect()
}

/// Where each row of `plan` sits in the pass queued ahead, if that pass computed exactly what
/// the plan asks of every one of them (`table(slot)`: the slot's block-table row now); `None`
/// if any row differs or is missing.
pub(crate) fn adopt<'t>(
    ahead: &AheadPass,
    plan: &[Row],
    table: impl Fn(usize) -> &'t [i32],
) -> Option<Vec<usize>> {
    if plan.is_empty() {
        return None;
    }
    let mut index = Vec::with_capacity(plan.len());
    for r in plan {
        let j = ahead.rows.iter().position(|a| a.slot == r.slot)?;
        let a = &ahead.rows[j];
        let used = &ahead.tables[j];
        let now = table(r.slot);
        if a.pos != r.pos
            || a.token != r.token
            || a.sample != r.sample
            || r.sample.is_none()
            || index.contains(&j)
            || now.len() < used.len()
            || now[..used.len()] != used[..]
        {
            return None;
        }
        index.push(j);
    }
    Some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::SampleRequest;
    use aot_kernels::ops::sampling::SamplingParams;

    fn row(slot: usize, pos: usize, token: u32, counter: u64) -> Row {
        Row {
            token,
            pos,
            slot,
            sample: Some(SampleRequest {
                params: SamplingParams {
                    temperature: 0.7,
                    top_k: 20,
                    top_p: 0.9,
                },
                seed: 40 + slot as u64,
                counter,
            }),
        }
    }

    /// Block tables of four blocks for slots 0..4, slot s owning blocks 10 s.. 10 s + 3.
    fn table(slot: usize) -> Vec<i32> {
        (0..4).map(|b| (10 * slot + b) as i32).collect()
    }

    #[test]
    fn the_next_pass_moves_every_row_one_position_and_one_draw_on() {
        let rows = [row(0, 20, 5, 4), row(3, 47, 9, 30)];
        let next = next_rows(&rows, &[true, true], 64, 16, |s, b| table(s)[b]).unwrap();
        assert_eq!(next.len(), 2);
        for (n, r) in next.iter().zip(&rows) {
            assert_eq!((n.slot, n.pos, n.token), (r.slot, r.pos + 1, 0));
            let (ns, rs) = (n.sample.unwrap(), r.sample.unwrap());
            assert_eq!(
                (ns.params, ns.seed, ns.counter),
                (rs.params, rs.seed, rs.counter + 1)
            );
        }
    }

    #[test]
    fn no_pass_is_queued_ahead_unless_every_row_can_go_on() {
        let rows = [row(0, 20, 5, 4), row(1, 31, 9, 30)];
        let tables = |s: usize, b: usize| table(s)[b];
        // A row that ends at this step.
        assert!(next_rows(&rows, &[true, false], 64, 16, tables).is_none());
        // A row that samples nothing.
        let mut quiet = rows;
        quiet[1].sample = None;
        assert!(next_rows(&quiet, &[true, true], 64, 16, tables).is_none());
        // The context's end: position 31 is the last of a 32-position context.
        assert!(next_rows(&rows, &[true, true], 32, 16, tables).is_none());
        // No block for the next position (slot 1's position 32 would be in its block 2).
        let short = |s: usize, b: usize| if s == 1 && b >= 2 { -1 } else { table(s)[b] };
        assert!(next_rows(&rows, &[true, true], 64, 16, short).is_none());
        // A hint for another number of rows.
        assert!(next_rows(&rows, &[true], 64, 16, tables).is_none());
        assert!(next_rows(&[], &[], 64, 16, tables).is_none());
    }

    fn ahead(rows: Vec<Row>) -> AheadPass {
        let tables = rows
            .iter()
            .map(|r| table(r.slot)[..=r.pos / 16].to_vec())
            .collect();
        AheadPass {
            rows,
            tables,
            turn: 1,
        }
    }

    #[test]
    fn a_plan_of_the_rows_queued_ahead_or_of_some_of_them_is_adopted() {
        let tables: Vec<Vec<i32>> = (0..4).map(table).collect();
        let a = ahead(vec![row(0, 21, 5, 5), row(2, 40, 7, 9), row(3, 48, 1, 31)]);
        assert_eq!(adopt(&a, &a.rows, |s| &tables[s][..]), Some(vec![0, 1, 2]));
        // Slot 2 sampled end-of-sequence: the others are still exactly what was computed.
        let plan = [a.rows[0], a.rows[2]];
        assert_eq!(adopt(&a, &plan, |s| &tables[s][..]), Some(vec![0, 2]));
        // A table that grew past what the pass read changes nothing.
        let grown: Vec<Vec<i32>> = (0..4).map(|s| [table(s), vec![99]].concat()).collect();
        assert_eq!(adopt(&a, &a.rows, |s| &grown[s][..]), Some(vec![0, 1, 2]));
    }

    #[test]
    fn a_plan_that_differs_in_anything_a_row_computes_is_not_adopted() {
        let tables: Vec<Vec<i32>> = (0..4).map(table).collect();
        let look = |s: usize| &tables[s][..];
        let a = ahead(vec![row(0, 21, 5, 5), row(2, 40, 7, 9)]);
        let changed = |f: &dyn Fn(&mut Row)| {
            let mut plan = a.rows.clone();
            f(&mut plan[1]);
            adopt(&a, &plan, look)
        };
        assert!(
            changed(&|r| r.token = 8).is_none(),
            "another token (teacher forcing)"
        );
        assert!(changed(&|r| r.pos = 41).is_none(), "another position");
        assert!(
            changed(&|r| r.slot = 1).is_none(),
            "a row the pass did not run"
        );
        assert!(changed(&|r| r.sample = None).is_none(), "no sample");
        assert!(
            changed(&|r| r.sample.as_mut().unwrap().counter += 1).is_none(),
            "another draw"
        );
        assert!(
            changed(&|r| r.sample.as_mut().unwrap().params.top_k = 5).is_none(),
            "other sampling parameters"
        );
        // A row twice.
        assert!(adopt(&a, &[a.rows[0], a.rows[0]], look).is_none());
        // A block the pass read now holds another id.
        let mut moved = tables.clone();
        moved[2][1] = 77;
        assert!(adopt(&a, &a.rows, |s| &moved[s][..]).is_none());
        assert!(adopt(&a, &[], look).is_none());
    }
}
