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

use aot_kernels::device;
use aot_kernels::ops::attention::{CLUSTER_SPLITS, MAX_SPLITS};
use aot_kernels::ops::gemv::MAX_TOKENS;

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
                    device::begin_capture(&s).map_err(dev_err("beginning graph capture"))?;
                    let launched = self.launch_forward(m, depth, pipelined, cluster);
                    let graph = device::end_capture(&s);
                    launched.map_err(ops_err)?;
                    let graph = graph
                        .map_err(dev_err("capturing the forward pass"))?
                        .ok_or_else(|| {
                            RunnerError::Device("graph capture produced no graph".into())
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
}
