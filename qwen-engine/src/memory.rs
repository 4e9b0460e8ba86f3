//! The engine's memory, as bookkeeping: the paged KV cache's blocks (attention layers) and the
//! pool of recurrent-state slots (recurrent layers), what one request takes of each, and how many
//! fit a budget. Pure; the runners own the bytes, the scheduler owns each request's share.
//!
//! A request of a model with recurrent layers takes one state slot besides its KV blocks: the
//! state is fixed-size, so one slot serves the whole request, and it is zeroed when the request's
//! first step runs (a step that starts at position 0 starts from zero state).

use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;

use crate::model::ModelDesc;

/// Blocks needed to hold `tokens` positions.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(KV_BLOCK_TOKENS)
}

/// Bytes one block takes in bf16 (keys and values of every attention layer).
pub fn block_bytes(model: &ModelDesc) -> usize {
    model.kv_bytes_per_token * KV_BLOCK_TOKENS
}

/// How many blocks a budget of `bytes` holds.
pub fn blocks_in_budget(model: &ModelDesc, bytes: usize) -> usize {
    bytes / block_bytes(model).max(1)
}

/// The KV budget on a GPU: a fraction of the memory free after weights and buffers, so that the
/// driver, graphs and the allocator keep some room.
pub fn gpu_kv_budget(free_bytes: usize) -> usize {
    const HEADROOM: usize = 1 << 30;
    free_bytes.saturating_sub(HEADROOM) / 10 * 9
}

/// The KV blocks a GPU runner allocates: what `budget` holds (by default [`gpu_kv_budget`] of
/// `free`), at most `cap` (every slot at full context). Errors name `--kv-budget`: when the blocks
/// number none, or when the cache would not fit the `free` bytes (a budget past the GPU's memory,
/// which the allocation would otherwise report as a bare out-of-memory).
pub fn gpu_kv_blocks(
    model: &ModelDesc,
    budget: Option<usize>,
    free: usize,
    cap: usize,
) -> Result<usize, String> {
    let budget = budget.unwrap_or_else(|| gpu_kv_budget(free));
    let blocks = blocks_in_budget(model, budget).min(cap);
    let block = block_bytes(model);
    if blocks == 0 {
        return Err(format!(
            "the KV budget of {budget} bytes holds no {KV_BLOCK_TOKENS}-token block ({block} bytes); raise --kv-budget"
        ));
    }
    let bytes = blocks.saturating_mul(block);
    if bytes > free {
        return Err(format!(
            "a KV cache of {blocks} blocks ({bytes} bytes, from --kv-budget {budget}) does not fit the {free} bytes free on the GPU; lower --kv-budget"
        ));
    }
    Ok(blocks)
}

/// Free list of ids `0..total` (KV blocks, or recurrent-state slots).
#[derive(Debug, Clone)]
pub struct IdPool {
    free: Vec<u32>,
    total: usize,
}

impl IdPool {
    pub fn new(total: usize) -> Self {
        // Hand out low ids first (pop from the back of a descending list).
        IdPool {
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

    /// `n` ids, or `None` (and nothing taken) if fewer are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let at = self.free.len() - n;
        let mut ids = self.free.split_off(at);
        ids.reverse();
        Some(ids)
    }

    /// Returns ids to the pool.
    pub fn release(&mut self, ids: Vec<u32>) {
        debug_assert!(ids.iter().all(|&b| (b as usize) < self.total));
        self.free.extend(ids.into_iter().rev());
    }
}

/// What one request holds while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub blocks: Vec<u32>,
    /// Its recurrent-state slot (models with recurrent layers only).
    pub state: Option<u32>,
}

/// Why a request does not fit now or ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// The KV cache is smaller than the request, even empty.
    KvNever { needed: usize, total: usize },
    /// The model has recurrent layers and the runner holds no state slot.
    NoStateSlots,
    /// Not now: running requests hold what it needs.
    Busy,
}

/// KV blocks and recurrent-state slots together: a request is admitted only when both have room.
#[derive(Debug, Clone)]
pub struct Memory {
    blocks: IdPool,
    /// `None` for models without recurrent layers.
    states: Option<IdPool>,
}

impl Memory {
    /// `state_slots` is ignored (no pool) for a model without recurrent layers.
    pub fn new(kv_blocks: usize, state_slots: usize, model: &ModelDesc) -> Self {
        Memory {
            blocks: IdPool::new(kv_blocks),
            states: model
                .has_recurrent_state()
                .then(|| IdPool::new(state_slots)),
        }
    }

    pub fn blocks(&self) -> &IdPool {
        &self.blocks
    }

    pub fn states(&self) -> Option<&IdPool> {
        self.states.as_ref()
    }

    /// Whether a request of `positions` could ever run here (with nothing else running).
    pub fn fits_ever(&self, positions: usize) -> Result<(), Shortfall> {
        let needed = blocks_for(positions);
        if needed > self.blocks.total() {
            return Err(Shortfall::KvNever {
                needed,
                total: self.blocks.total(),
            });
        }
        if self.states.as_ref().is_some_and(|s| s.total() == 0) {
            return Err(Shortfall::NoStateSlots);
        }
        Ok(())
    }

    /// Takes what a request of `positions` needs, or nothing.
    pub fn reserve(&mut self, positions: usize) -> Result<Reservation, Shortfall> {
        self.fits_ever(positions)?;
        let needed = blocks_for(positions);
        let state_free = self.states.as_ref().is_none_or(|s| s.free() > 0);
        if needed > self.blocks.free() || !state_free {
            return Err(Shortfall::Busy);
        }
        let blocks = self.blocks.alloc(needed).expect("checked free above");
        let state = self
            .states
            .as_mut()
            .map(|s| s.alloc(1).expect("checked free above")[0]);
        Ok(Reservation { blocks, state })
    }

    pub fn release(&mut self, r: Reservation) {
        self.blocks.release(r.blocks);
        if let (Some(pool), Some(slot)) = (self.states.as_mut(), r.state) {
            pool.release(vec![slot]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, Qwen35MoeConfig, Qwen3Config};

    #[test]
    fn alloc_and_release_keep_every_block_once() {
        let mut p = IdPool::new(10);
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
        let d = ModelConfig::Qwen3(Qwen3Config::qwen3_4b()).describe();
        assert_eq!(block_bytes(&d), 147_456 * 16);
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
        assert_eq!(blocks_in_budget(&d, 1 << 30), (1 << 30) / (147_456 * 16));
        assert_eq!(gpu_kv_budget(100), 0);
    }

    #[test]
    fn the_gpu_cache_is_what_the_budget_holds_capped_and_errors_name_the_flag() {
        let d = ModelConfig::Qwen3(Qwen3Config::qwen3_4b()).describe();
        let block = block_bytes(&d);
        let free = 10 << 30;
        assert_eq!(gpu_kv_blocks(&d, Some(block * 7 + 1), free, 100), Ok(7));
        assert_eq!(gpu_kv_blocks(&d, Some(block * 7), free, 5), Ok(5));
        assert_eq!(
            gpu_kv_blocks(&d, None, free, usize::MAX),
            Ok(gpu_kv_budget(free) / block)
        );
        let none = gpu_kv_blocks(&d, Some(block - 1), free, 100).unwrap_err();
        assert!(none.contains("raise --kv-budget"), "{none}");
        let past = gpu_kv_blocks(&d, Some(2 * free), free, usize::MAX).unwrap_err();
        assert!(
            past.contains("lower --kv-budget") && past.contains(&free.to_string()),
            "{past}"
        );
        // A budget past free memory is fine where the cap keeps the cache inside it.
        assert_eq!(gpu_kv_blocks(&d, Some(2 * free), free, 3), Ok(3));
    }

    #[test]
    fn a_dense_model_needs_blocks_only() {
        let d = ModelConfig::Qwen3(Qwen3Config::tiny()).describe();
        let mut m = Memory::new(4, 0, &d);
        let r = m.reserve(40).unwrap();
        assert_eq!((r.blocks.len(), r.state), (3, None));
        assert_eq!(m.reserve(17), Err(Shortfall::Busy));
        assert_eq!(
            m.reserve(80),
            Err(Shortfall::KvNever {
                needed: 5,
                total: 4
            })
        );
        m.release(r);
        assert_eq!(m.blocks().free(), 4);
    }

    #[test]
    fn a_hybrid_model_needs_a_state_slot_too() {
        let d = ModelConfig::Qwen35Moe(Qwen35MoeConfig::tiny()).describe();
        let mut m = Memory::new(100, 2, &d);
        let a = m.reserve(10).unwrap();
        let b = m.reserve(10).unwrap();
        assert_eq!((a.state, b.state), (Some(0), Some(1)));
        // Blocks are free, but both state slots are taken.
        assert_eq!(m.reserve(10), Err(Shortfall::Busy));
        m.release(a);
        assert_eq!(m.reserve(10).unwrap().state, Some(0), "the slot is reused");
        assert_eq!(
            Memory::new(100, 0, &d).fits_ever(1),
            Err(Shortfall::NoStateSlots)
        );
    }
}
