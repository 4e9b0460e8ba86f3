//! When a step replays a CUDA graph and when it launches eagerly: one pure predicate.
//!
//! A forward pass over `rows` token rows (1..=8) is captured once per row count and decode
//! attention kind (pipelined or not, see `aot_kernels::ops::attention::attn_pipelined`), with every
//! per-step input (tokens, positions, slots, context lengths, sampling parameters) in fixed
//! device buffers that are refilled before each replay. The captured attention launch has the
//! full split depth ([`MAX_SPLITS`]), so it serves any context length: each sequence's split
//! count is computed in the kernel from its own length. Replay and eager launch run the same
//! kernels with the same shapes, so they give the same bits.
//!
//! [`MAX_SPLITS`]: aot_kernels::ops::attention::MAX_SPLITS

use aot_kernels::ops::gemv::MAX_TOKENS;

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
