//! The CPU runner's paged KV cache, in fp32 with the GPU cache's layout: per layer, keys and
//! values each `[num_blocks][kv_heads][KV_BLOCK_TOKENS][head_dim]`. Position `p` of a sequence lives
//! in block `blocks[p / KV_BLOCK_TOKENS]` at row `p % KV_BLOCK_TOKENS`.

use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;

#[derive(Debug)]
pub struct PagedKvCache {
    num_blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Per layer: keys and values.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl PagedKvCache {
    pub fn new(layers: usize, num_blocks: usize, kv_heads: usize, head_dim: usize) -> Self {
        let per_layer = num_blocks * kv_heads * KV_BLOCK_TOKENS * head_dim;
        PagedKvCache {
            num_blocks,
            kv_heads,
            head_dim,
            keys: (0..layers).map(|_| vec![0.0; per_layer]).collect(),
            values: (0..layers).map(|_| vec![0.0; per_layer]).collect(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|l| l.len() * 4)
            .sum()
    }

    /// Start of (`head`, position `pos`) in a layer's array; `blocks` is the sequence's table.
    fn offset(&self, blocks: &[u32], pos: usize, head: usize) -> usize {
        let block = blocks[pos / KV_BLOCK_TOKENS] as usize;
        ((block * self.kv_heads + head) * KV_BLOCK_TOKENS + pos % KV_BLOCK_TOKENS) * self.head_dim
    }

    pub fn write(
        &mut self,
        layer: usize,
        blocks: &[u32],
        pos: usize,
        head: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let o = self.offset(blocks, pos, head);
        let d = self.head_dim;
        self.keys[layer][o..o + d].copy_from_slice(k);
        self.values[layer][o..o + d].copy_from_slice(v);
    }

    pub fn key(&self, layer: usize, blocks: &[u32], pos: usize, head: usize) -> &[f32] {
        let o = self.offset(blocks, pos, head);
        &self.keys[layer][o..o + self.head_dim]
    }

    pub fn value(&self, layer: usize, blocks: &[u32], pos: usize, head: usize) -> &[f32] {
        let o = self.offset(blocks, pos, head);
        &self.values[layer][o..o + self.head_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_land_in_their_block_row() {
        let mut c = PagedKvCache::new(1, 4, 2, 8);
        let blocks = [3u32, 1];
        let k = [1.0f32; 8];
        let v = [2.0f32; 8];
        // Position 17: block table entry 1 -> physical block 1, row 1; head 1.
        c.write(0, &blocks, 17, 1, &k, &v);
        let want = ((2 + 1) * KV_BLOCK_TOKENS + 1) * 8;
        assert_eq!(c.keys[0][want..want + 8], k);
        assert_eq!(c.values[0][want..want + 8], v);
        assert_eq!(c.key(0, &blocks, 17, 1), &k);
        assert_eq!(c.key(0, &blocks, 16, 1), &[0.0; 8]);
        assert_eq!(c.bytes(), 2 * 4 * 2 * KV_BLOCK_TOKENS * 8 * 4);
    }
}
