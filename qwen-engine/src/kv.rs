//! The paged KV cache's bookkeeping: which blocks are free and how many fit a memory budget.
//! Pure; the runners own the memory, the scheduler owns the blocks of each request.

use crate::config::Qwen3Config;
use crate::runner::KV_BLOCK_SIZE;

/// Blocks needed to hold `tokens` positions.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(KV_BLOCK_SIZE)
}

/// Bytes one block takes in bf16 (keys and values of every layer).
pub fn block_bytes(config: &Qwen3Config) -> usize {
    config.kv_bytes_per_token() * KV_BLOCK_SIZE
}

/// How many blocks a budget of `bytes` holds.
pub fn blocks_in_budget(config: &Qwen3Config, bytes: usize) -> usize {
    bytes / block_bytes(config).max(1)
}

/// The KV budget on a GPU: a fraction of the memory free after weights and buffers, so that the
/// driver, graphs and the allocator keep some room.
pub fn gpu_kv_budget(free_bytes: usize) -> usize {
    const HEADROOM: usize = 1 << 30;
    free_bytes.saturating_sub(HEADROOM) / 10 * 9
}

/// Free list of block ids `0..total`.
#[derive(Debug, Clone)]
pub struct BlockPool {
    free: Vec<u32>,
    total: usize,
}

impl BlockPool {
    pub fn new(total: usize) -> Self {
        // Hand out low ids first (pop from the back of a descending list).
        BlockPool {
            free: (0..total as u32).rev().collect(),
            total,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// `n` blocks, or `None` (and nothing taken) if fewer are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let at = self.free.len() - n;
        let mut blocks = self.free.split_off(at);
        blocks.reverse();
        Some(blocks)
    }

    /// Returns blocks to the pool.
    pub fn release(&mut self, blocks: Vec<u32>) {
        debug_assert!(blocks.iter().all(|&b| (b as usize) < self.total));
        self.free.extend(blocks.into_iter().rev());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_and_release_keep_every_block_once() {
        let mut p = BlockPool::new(10);
        let a = p.alloc(4).unwrap();
        assert_eq!(a, vec![0, 1, 2, 3]);
        let b = p.alloc(5).unwrap();
        assert!(p.alloc(2).is_none(), "only one left");
        assert_eq!(p.free(), 1);
        p.release(a);
        let c = p.alloc(5).unwrap();
        let mut all: Vec<u32> = b.iter().chain(&c).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10);
    }

    #[test]
    fn budget_arithmetic_for_qwen3_4b() {
        let c = Qwen3Config::qwen3_4b();
        assert_eq!(block_bytes(&c), 147_456 * 16);
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
        assert_eq!(blocks_in_budget(&c, 1 << 30), (1 << 30) / (147_456 * 16));
        assert_eq!(gpu_kv_budget(100), 0);
    }
}
