//! CUDA graphs of the forward pass: when a pass replays one and when it launches eagerly (one
//! pure predicate, [`graph_decision`]), and the capture and replay themselves.
//!
//! A forward pass over `rows` token rows (1..=8) is captured once per key: the row count and the
//! decode attention kind, pipelined or not (`aot_kernels::ops::attention::attn_pipelined`) and
//! its splits merged in thread-block clusters or not (`attn_cluster`). Every per-step input
//! (tokens, positions, slots, context lengths, sampling parameters) sits in fixed device buffers
//! refilled before each replay. The captured attention launch has the full split depth of its
//! kind ([`MAX_SPLITS`], or [`CLUSTER_SPLITS`] for a cluster graph), so it serves any context
//! length its kind covers: each sequence's split count is computed in the kernel from its own
//! length. Replay and eager launch run the same kernels with the same shapes, so they give the
//! same bits.

use std::sync::Arc;

use aot_kernels::device::{self, CudaGraph, CudaStream};
use aot_kernels::ops::attention::{CLUSTER_SPLITS, MAX_SPLITS};
use aot_kernels::ops::gemv::MAX_TOKENS;
use aot_kernels::ops::OpsError;

use super::{dev_err, ops_err, GpuRunner};
use crate::runner::RunnerError;

/// Why a pass ran eagerly (reported in the runner's statistics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphDecision {
    /// Replay (capturing first if this row count and attention kind have no graph yet).
    Replay,
    /// Graphs are turned off (`--no-graphs`).
    Disabled,
    /// More rows than one pass carries.
    TooManyRows,
    /// The first pass of a row count and kind runs eagerly; the graph is captured on the next one, so
    /// that one-off work (lazy module loading, attribute setting) stays out of the capture.
    Warmup,
    /// The pass carries prompt rows (the hybrid family, whose prompt chunks share its passes):
    /// its launches depend on every chunk's length and position, so it runs eagerly.
    PromptRows,
}

/// The predicate: replay when graphs are on, the pass has 1..=8 rows, and this row count (with
/// this attention kind) has run eagerly once before.
pub fn graph_decision(enabled: bool, rows: usize, seen_before: bool) -> GraphDecision {
    if !enabled {
        GraphDecision::Disabled
    } else if rows == 0 || rows > MAX_TOKENS {
        GraphDecision::TooManyRows
    } else if !seen_before {
        GraphDecision::Warmup
    } else {
        GraphDecision::Replay
    }
}

/// The hybrid family's predicate: a pass of decode rows only is [`graph_decision`]'s; a pass
/// with prompt rows runs eagerly. The key is the row count alone: the decode attention of a
/// captured pass has the full split depth ([`MAX_SPLITS`]), every other launch depends on the
/// row count only, and the per-pass inputs (rows, sequences, state slots) sit in fixed buffers.
pub fn hybrid_graph_decision(
    enabled: bool,
    decode: bool,
    rows: usize,
    seen_before: bool,
) -> GraphDecision {
    match graph_decision(enabled, rows, seen_before) {
        GraphDecision::Replay | GraphDecision::Warmup if !decode => GraphDecision::PromptRows,
        d => d,
    }
}

/// Captures what `launch` queues on `stream` into a graph (the capture ends whether or not the
/// launches succeeded); `what` names it in errors.
pub(super) fn capture(
    stream: &Arc<CudaStream>,
    what: &str,
    launch: impl FnOnce() -> Result<(), OpsError>,
) -> Result<CudaGraph, RunnerError> {
    device::begin_capture(stream).map_err(dev_err("beginning graph capture"))?;
    let launched = launch();
    let graph = device::end_capture(stream);
    launched.map_err(ops_err)?;
    graph
        .map_err(dev_err(what))?
        .ok_or_else(|| RunnerError::Device(format!("{what}: the capture produced no graph")))
}

impl GpuRunner {
    /// Runs the forward pass over the first `m` rows of the pass buffers: a replay of the graph
    /// of its key (captured now if it has none), or launches (see [`graph_decision`]);
    /// `max_splits` is the deepest split count of its rows.
    pub(super) fn run_forward(
        &mut self,
        m: usize,
        pipelined: bool,
        cluster: bool,
        max_splits: usize,
    ) -> Result<(), RunnerError> {
        let s = self.kernels.stream().clone();
        let key = (m, pipelined, cluster);
        let kind = usize::from(pipelined) + 2 * usize::from(cluster);
        let depth = if cluster { CLUSTER_SPLITS } else { MAX_SPLITS };
        match graph_decision(self.graphs_on, m, self.seen[m.min(MAX_TOKENS)][kind]) {
            GraphDecision::Replay => {
                if !self.graphs.contains_key(&key) {
                    let graph = capture(&s, "capturing the forward pass", || {
                        self.launch_forward(m, depth, pipelined, cluster)
                    })?;
                    self.graphs.insert(key, graph);
                    self.stats.graph_captures += 1;
                }
                self.graphs[&key]
                    .launch()
                    .map_err(dev_err("replaying the forward pass"))?;
                self.stats.graph_replays += 1;
            }
            _ => {
                let grid = if cluster { CLUSTER_SPLITS } else { max_splits };
                self.launch_forward(m, grid, pipelined, cluster)
                    .map_err(ops_err)?;
                self.seen[m.min(MAX_TOKENS)][kind] = true;
                self.stats.eager_passes += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        assert_eq!(graph_decision(false, 4, true), GraphDecision::Disabled);
        assert_eq!(graph_decision(true, 9, true), GraphDecision::TooManyRows);
        assert_eq!(graph_decision(true, 4, false), GraphDecision::Warmup);
        assert_eq!(graph_decision(true, 1, true), GraphDecision::Replay);
        assert_eq!(graph_decision(true, 8, true), GraphDecision::Replay);
    }

    #[test]
    fn hybrid_decisions() {
        assert_eq!(
            hybrid_graph_decision(true, true, 8, true),
            GraphDecision::Replay
        );
        assert_eq!(
            hybrid_graph_decision(true, true, 3, false),
            GraphDecision::Warmup
        );
        for seen in [false, true] {
            assert_eq!(
                hybrid_graph_decision(true, false, 5, seen),
                GraphDecision::PromptRows
            );
        }
        assert_eq!(
            hybrid_graph_decision(false, true, 1, true),
            GraphDecision::Disabled
        );
        assert_eq!(
            hybrid_graph_decision(true, true, 9, true),
            GraphDecision::TooManyRows
        );
    }
}
