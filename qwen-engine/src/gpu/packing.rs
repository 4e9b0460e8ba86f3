//! How the prompt chunks of one engine step share prefill passes.
//!
//! A GEMM over a few hundred rows leaves most of a large GPU idle (Qwen3-4B's o_proj at 512 rows
//! is 40 tiles of 128 x 256 for 132 SMs), so the runner packs the chunks of every sequence that
//! is reading its prompt into passes of up to `budget` rows. Chunks go in order, each pass is
//! filled before the next begins, and a chunk longer than what a pass has left is cut, its pieces
//! in consecutive passes. That changes no bit of any result: a GEMM row depends only on its own
//! row, and attention runs per piece over the sequence's own cache, which earlier passes filled.

/// A run of one chunk's tokens inside a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Index of the chunk in the caller's list.
    pub seq: usize,
    /// First token of the piece within its chunk.
    pub from: usize,
    /// Tokens in the piece (at least one).
    pub len: usize,
    /// Row of the piece's first token in the pass.
    pub row: usize,
}

impl Piece {
    /// One past the piece's last token within its chunk.
    pub fn end(&self) -> usize {
        self.from + self.len
    }
}

/// Packs chunks of `lens` tokens, in order, into passes of at most `budget` rows (a budget of 0
/// counts as 1). Empty chunks get no piece.
pub(crate) fn pack(lens: &[usize], budget: usize) -> Vec<Vec<Piece>> {
    let budget = budget.max(1);
    let mut passes: Vec<Vec<Piece>> = Vec::new();
    let mut pass: Vec<Piece> = Vec::new();
    let mut rows = 0;
    for (seq, &len) in lens.iter().enumerate() {
        let mut from = 0;
        while from < len {
            if rows == budget {
                passes.push(std::mem::take(&mut pass));
                rows = 0;
            }
            let take = (len - from).min(budget - rows);
            pass.push(Piece {
                seq,
                from,
                len: take,
                row: rows,
            });
            rows += take;
            from += take;
        }
    }
    if !pass.is_empty() {
        passes.push(pass);
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token of every chunk lands exactly once, in order, at consecutive rows; no pass
    /// exceeds the budget and only the last pass may be short.
    fn check(lens: &[usize], budget: usize) -> Vec<Vec<Piece>> {
        let passes = pack(lens, budget);
        let mut next = vec![0usize; lens.len()];
        let mut last_seq = 0;
        for (i, pass) in passes.iter().enumerate() {
            let mut row = 0;
            for p in pass {
                assert!(p.len > 0, "{lens:?} / {budget}: empty piece {p:?}");
                assert_eq!(p.row, row, "{lens:?} / {budget}: rows not consecutive");
                assert_eq!(
                    p.from, next[p.seq],
                    "{lens:?} / {budget}: {p:?} out of order"
                );
                assert!(
                    p.seq >= last_seq,
                    "{lens:?} / {budget}: chunks out of order"
                );
                last_seq = p.seq;
                next[p.seq] = p.end();
                row += p.len;
            }
            assert!(
                row <= budget.max(1),
                "{lens:?} / {budget}: pass {i} has {row} rows"
            );
            if i + 1 < passes.len() {
                assert_eq!(row, budget.max(1), "{lens:?} / {budget}: pass {i} not full");
            }
        }
        assert_eq!(next, lens, "{lens:?} / {budget}: tokens lost");
        passes
    }

    #[test]
    fn chunks_that_fit_share_one_pass() {
        let passes = check(&[512, 512, 300], 4096);
        assert_eq!(passes.len(), 1);
        let rows: Vec<usize> = passes[0].iter().map(|p| p.row).collect();
        assert_eq!(rows, [0, 512, 1024]);
    }

    #[test]
    fn a_chunk_past_the_budget_is_cut_across_passes() {
        let passes = check(&[3000, 3000], 4096);
        assert_eq!(passes.len(), 2);
        assert_eq!(
            passes[0][1],
            Piece {
                seq: 1,
                from: 0,
                len: 1096,
                row: 3000
            }
        );
        assert_eq!(
            passes[1][0],
            Piece {
                seq: 1,
                from: 1096,
                len: 1904,
                row: 0
            }
        );
        let passes = check(&[10_000], 4096);
        let lens: Vec<usize> = passes.iter().map(|p| p[0].len).collect();
        assert_eq!(lens, [4096, 4096, 1808]);
    }

    #[test]
    fn empty_chunks_and_odd_budgets() {
        assert!(check(&[], 16).is_empty());
        assert!(check(&[0, 0], 16).is_empty());
        let passes = check(&[0, 3, 0, 2], 16);
        assert_eq!(passes.len(), 1);
        assert_eq!(passes[0].iter().map(|p| p.seq).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(
            check(&[3, 2], 0).len(),
            5,
            "a zero budget counts as one row"
        );
        for budget in 1..12 {
            check(&[7, 1, 0, 13, 4], budget);
        }
    }
}
