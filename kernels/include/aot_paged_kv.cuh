// The paged KV cache layout shared by the kernels that write and read it (src/ops/kv_cache.rs is
// the Rust side): per layer, k and v are [num_blocks][kv_heads][16][head_dim] bf16; a sequence
// owns the blocks its block-table row lists, position p at row p % 16 of block table[p / 16].
#pragma once

#include <stdint.h>

namespace aot {

constexpr int kKvBlockTokens = 16;

// Element offset of (position's row, kv_head, dim 0) in a cache layer, given the block id.
__device__ __forceinline__ int64_t kv_offset(int block, int kv_head, int row, int kv_heads, int head_dim) {
    return ((static_cast<int64_t>(block) * kv_heads + kv_head) * kKvBlockTokens + row) * head_dim;
}

// The cache block holding `position` for a sequence whose table has `table_len` entries. A
// position past the table or a block id outside the cache is a bug upstream that would touch
// memory that is not this sequence's: trap (the launch fails loudly) instead.
__device__ __forceinline__ int kv_block(const int* __restrict__ table, int table_len, int num_blocks, int position) {
    const int entry = position / kKvBlockTokens;
    if (position < 0 || entry >= table_len) __trap();
    const int block = table[entry];
    if (block < 0 || block >= num_blocks) __trap();
    return block;
}

}  // namespace aot
