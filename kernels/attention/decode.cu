// Decode attention over the paged KV cache (one new query token per sequence), GQA, split-KV,
// with the step before it fused in: from the raw qkv projection of the new token, each block
// builds its query heads (per-head RMSNorm with q_norm, NeoX RoPE at the token's position), and
// the block whose split holds that position also writes the token's key (k_norm, RoPE) and value
// into the paged cache before reading it.
//
//   o[q] = sum_t softmax_t(q . k_t / sqrt(d)) v_t      over the sequence's positions 0..pos
//
// Grid (kv_heads, rows, max_splits); a block reads the K and V of one KV head once for all the
// query heads that share it. Entries `_g2`, `_g4`, `_g8` are built for that many query heads per
// KV head: the per-head loops then have fixed trip counts, so the compiler unrolls them and keeps
// every head's state in registers; the plain entries take any group up to 8.
//
// At head dimension 64 and 128 each warp requests its first cache block before it prepares the
// query, and, launched programmatically where the caller allows it (`cache_before_wait`), before
// it waits for the qkv projection (so that the block streams while that kernel ends); the
// pipelined entries request its first two cache blocks there, into two register sets taken in
// turn, and then keep the next block streaming while they score the current one, so that a
// split's time is its stream's, not a round trip per block.
// That holds two blocks' keys and values in registers (about 230 at 128: two blocks an SM), which
// pays when the busy blocks of a launch fit in one wave; the `_np` entries load each later block
// and then score it (held to 128 registers: four blocks an SM), which pays when there are more.
// Both compute the same sums in the same order: the same bits.
// `attn_pipelined` in src/ops/attention.rs picks.
//
// A sequence's context is cut into `attn_splits(ctx)` ranges of whole 16-token cache blocks (a
// function of its own length only, so a sequence's result never depends on what else is in the
// batch); blocks past a sequence's split count return at once. A split's four warps take its cache
// blocks in turn (pipelined or not, see above; at 256 a block's registers leave no room for two),
// both products on tensor cores:
// q.k is S^T = K Q^T (a 16-token block against up to 8 query heads, one m16n8k16 mma per 16 dims)
// and p.v is O^T += V^T P^T (one mma per 16 dims, the probabilities rounded to bf16 as flash
// attention does). Each split keeps an online softmax (fp32, base 2) per query head; when a
// sequence has more than one split, the last block to finish merges the partials in split order.
//
// The `_cl` entries (sm_90+; the host launches them only from sm_90+ images, grid depth 8) run a
// sequence's splits as one thread-block cluster and merge them through distributed shared memory
// instead of the workspace (cluster_merge), the same bits; small launches only: clusters are placed
// within a GPC, and a short sequence's idle blocks hold their places until the merge.
//
// Cache layout per layer: [blocks][kv_heads][16][d] bf16 for K and for V.
#include "aot_common.cuh"
#include "aot_mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

// A named namespace: nvcc names anonymous-namespace symbols after a per-run unique id, which
// would make the PTX (and the lock) differ between builds.
namespace aot_attn_decode {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kBlockTokens = 16;
constexpr int kMaxGroup = 8;
constexpr int kMaxSplits = 32;
// The `_cl` entries (sm_90+) run a sequence's splits as one thread-block cluster of up to this many
// blocks (the portable cluster size), launched kClusterSplits deep; see cluster_merge.
constexpr int kClusterSplits = 8;
static_assert(kClusterSplits <= kMaxSplits, "a cluster launch holds every split of its sequences");
// Fewer, longer splits: a split's warps stream their cache blocks two deep (the pipelined entries), while
// every extra split costs the merge's round trips. The count is ctx / 128 rounded down, so that a
// full batch's blocks still fit one wave (rounding up spilled eight rows of 1089 tokens into a second).
constexpr int kTokensPerSplitMin = 128;
constexpr float kLog2e = 1.4426950408889634f;

// Mirrored by `AttnDecodeParams` in src/ops/attention.rs (repr(C)).
struct AttnDecodeParams {
    const __nv_bfloat16* qkv;      // [m][ld_qkv]: the new token's [q heads | k heads | v heads]
    const __nv_bfloat16* q_norm;   // [d]
    const __nv_bfloat16* k_norm;   // [d]
    const float* cos_sin;          // [max_pos][d]: cos half, then sin half
    __nv_bfloat16* k_cache;        // [blocks][kv_heads][16][d]
    __nv_bfloat16* v_cache;
    const int* block_table;        // [slots][ld_bt]
    const int* slot_of_row;        // [m]
    const int* positions;          // [m]: the new token's position; 0..pos are attended
    __nv_bfloat16* out;            // [m][q_heads * d]
    float* ws_ml;                  // [m][q_heads][kMaxSplits][2]: running max, sum
    float* ws_o;                   // [m][q_heads][kMaxSplits][d]
    unsigned* counters;            // [m][kv_heads], zero between launches
    int m, q_heads, kv_heads, ld_bt, ld_qkv, max_pos;
    float scale;                   // 1/sqrt(d)
    float eps;
    float norm_offset;             // 0: w, 1: (1 + w)
    // 1 (set only for a programmatic launch whose caller allows it, AttnDecode::overlap_previous):
    // the warps read the block table and request their first cache blocks before the wait for
    // qkv, and the query after it; 0: the query first, its round trip ahead of the cache blocks'
    // (without programmatic launch nothing overlaps the wait, and the other order only delays the query).
    int cache_before_wait;
};

// One head of the new token: lane holds dims j = lane + 32 i and j + d/2, i < d/64, as raw values
// (`head_load`), then through RMSNorm with `w` and NeoX RoPE at `pos` (`head_finish`), rounded to
// bf16 as the model stores them. The kernel requests the raw values first, so that their round
// trip overlaps the cache's addresses.
template <int D>
__device__ __forceinline__ void head_load(const __nv_bfloat16* raw, float (&x)[D / 32]) {
    constexpr int kHalf = D / 2;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < D / 64; ++i) {
        x[2 * i] = aot::to_f32(raw[lane + 32 * i]);
        x[2 * i + 1] = aot::to_f32(raw[lane + 32 * i + kHalf]);
    }
}

template <int D>
__device__ __forceinline__ void head_finish(const AttnDecodeParams& p, const __nv_bfloat16* w, int pos,
                                            float (&x)[D / 32]) {
    constexpr int kPer = D / 64;
    constexpr int kHalf = D / 2;
    const int lane = threadIdx.x & 31;
    // The norm weights and the rotary row are requested before the sum of squares waits on x.
    const float* cs = p.cos_sin + static_cast<int64_t>(pos) * D;
    float wl[kPer], wh[kPer], c[kPer], sn[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int j = lane + 32 * i;
        wl[i] = aot::to_f32(w[j]);
        wh[i] = aot::to_f32(w[j + kHalf]);
        c[i] = cs[j];
        sn[i] = cs[j + kHalf];
    }
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) sum_sq += x[2 * i] * x[2 * i] + x[2 * i + 1] * x[2 * i + 1];
    const float scale = rsqrtf(aot::warp_sum(sum_sq) / static_cast<float>(D) + p.eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const float x1 = aot::round_bf16((wl[i] + p.norm_offset) * aot::round_bf16(x[2 * i] * scale));
        const float x2 = aot::round_bf16((wh[i] + p.norm_offset) * aot::round_bf16(x[2 * i + 1] * scale));
        x[2 * i] = aot::round_bf16(x1 * c[i] - x2 * sn[i]);
        x[2 * i + 1] = aot::round_bf16(x2 * c[i] + x1 * sn[i]);
    }
}

// The split of a context of `ctx` tokens: `count` ranges of `tokens` tokens (a multiple of 16).
// src/ops/attention.rs::attn_splits is the host twin.
struct Splits {
    int count;
    int tokens;
};

__device__ __forceinline__ Splits attn_splits(int ctx) {
    int want = ctx / kTokensPerSplitMin;
    want = min(max(want, 1), kMaxSplits);
    int per = (ctx + want - 1) / want;
    per = (per + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    return Splits{(ctx + per - 1) / per, per};
}

// The tokens whose values lane t (= lane % 4) holds: 2t, 2t + 1, 2t + 8, 2t + 9, the columns of
// an m16n8k16 A fragment.
__device__ __forceinline__ int v_token(int t, int i) { return 2 * t + (i & 1) + 8 * (i >> 1); }

// One 16-token cache block as a lane holds it (g = lane / 4, t = lane % 4):
//   k[2c], k[2c + 1]: dims [32c + 8t, 32c + 8t + 8) of tokens g and g + 8, the A fragments of
//     S^T = K Q^T (see aot_mma.cuh: a dot product may permute its reduction index);
//   v[i][c]: dims [64c + 8g, 64c + 8g + 8) of token v_token(t, i), from which the A fragments of
//     O^T = V^T P^T are built with one byte permute each. Fragment row g of the mma for dims pair
//     j of chunk c is dim 64c + 8g + 2j, row g + 8 is dim 64c + 8g + 2j + 1: the output rows are a
//     permutation of the dims, undone when the lane stores its part of O.
template <int D>
struct KvRegs {
    uint4 k[D / 16];
    uint4 v[4][D / 64];
};

template <int D>
__device__ __forceinline__ void load_kv(const AttnDecodeParams& p, int64_t base, int n_tok, KvRegs<D>& r) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const uint4* klo = reinterpret_cast<const uint4*>(p.k_cache + (base + g) * D + (lane & 3) * 8);
    const uint4* khi = klo + kBlockTokens / 2 * D / 8;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        r.k[2 * c] = g < n_tok ? klo[4 * c] : zero;
        r.k[2 * c + 1] = g + 8 < n_tok ? khi[4 * c] : zero;
    }
    // Values past the block's last token are zero, not stale cache contents: their probability
    // is 0, and 0 x NaN would poison the mma.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int tok = v_token(lane & 3, i);
        const uint4* vrow = reinterpret_cast<const uint4*>(p.v_cache + (base + tok) * D + 8 * g);
#pragma unroll
        for (int c = 0; c < D / 64; ++c) r.v[i][c] = tok < n_tok ? vrow[8 * c] : zero;
    }
}

// Word j (0..3) of a uint4, for indices fixed at compile time.
__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// The merge of a sequence's splits in a cluster launch (grid z = cluster z = kClusterSplits, rank =
// split): every split left its block's partial in its own shared memory (o sums in warp 0's slot
// of merge_o, [group][D]; (max, sum) per head in part_ml); after a cluster barrier each split merges
// a slice of the elements, reading every split's partial through distributed shared memory, with
// the same operations in the same split order as the last block's merge through the workspace
// (the same bits); a second barrier keeps every block's partials alive until all are read. This
// replaces the workspace's writes, the fence, the counter and the re-reads (L2 round trips on the
// critical path of the launch) with two barriers and reads from neighbouring SMs.
template <int D>
__device__ __forceinline__ void cluster_merge(const AttnDecodeParams& p, int n, int group, int split, int row,
                                              int kvh, const float* merge_o, const float2* part_ml,
                                              float* w_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (static_cast<int>(threadIdx.x) < group) {
        float2 v[kClusterSplits];
#pragma unroll
        for (int s = 0; s < kClusterSplits; ++s) {
            if (s < n) v[s] = *cluster.map_shared_rank(part_ml + threadIdx.x, s);
        }
        // Unrolled with a guard (v stays in registers); the order is the split order either way.
        float mm = aot::neg_inf();
#pragma unroll
        for (int s = 0; s < kClusterSplits; ++s) {
            if (s < n) mm = fmaxf(mm, v[s].x);
        }
        float ll = 0.0f;
#pragma unroll
        for (int s = 0; s < kClusterSplits; ++s) {
            if (s < n) {
                const float f = exp2f(v[s].x - mm);
                w_split[threadIdx.x * kClusterSplits + s] = f;
                ll += v[s].y * f;
            }
        }
        w_split[group * kClusterSplits + threadIdx.x] = ll;
    }
    __syncthreads();
    const int elems = group * D;
    const int per = (elems + n - 1) / n;
    const int end = min(elems, (split + 1) * per);
    const int ld_q = p.q_heads * D;
    for (int i = split * per + threadIdx.x; i < end; i += kThreads) {
        const int h = i / D, d = i - h * D;
        float x[kClusterSplits];
#pragma unroll
        for (int s = 0; s < kClusterSplits; ++s) x[s] = s < n ? cluster.map_shared_rank(merge_o, s)[i] : 0.0f;
        float oo = 0.0f;
#pragma unroll
        for (int s = 0; s < kClusterSplits; ++s) {
            if (s < n) oo += x[s] * w_split[h * kClusterSplits + s];
        }
        const int qh = kvh * group + h;
        p.out[static_cast<int64_t>(row) * ld_q + qh * D + d] = __float2bfloat16_rn(oo / w_split[group * kClusterSplits + h]);
    }
    cluster.sync();
#else
    __trap();  // the host launches the _cl entries only from sm_90+ images
#endif
}

// A block of a cluster launch whose split is past its sequence's count: it holds no partial, but
// it takes part in both cluster barriers of a merge (a sequence of one split has none).
__device__ __forceinline__ void cluster_idle(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n > 1) {
        cooperative_groups::this_cluster().sync();
        cooperative_groups::this_cluster().sync();
    }
#else
    __trap();
#endif
}

// G: query heads per KV head when fixed at build time, 0 for any group up to kMaxGroup. kPipelined:
// stream the next cache block while scoring the current one (head dimensions up to 128).
// kCluster: the sequence's splits are one cluster and merge through distributed shared memory.
template <int D, int G, bool kPipelined, bool kCluster = false>
__device__ __forceinline__ void attn_decode(const AttnDecodeParams& p) {
    constexpr int kHalf = D / 2;
    constexpr int kQFloats = D + 8;          // floats per query head the host reserves (bf16 q uses half)
    constexpr bool kPrefetch = kPipelined && D <= 128;  // registers for a whole cache block up front
    // The warp's first cache block is requested before the query's preparation at 64 and 128,
    // pipelined or not (the unpipelined entries then score it from those registers).
    constexpr bool kFirstEarly = D <= 128;
    extern __shared__ float smem[];
    // The query heads in bf16, [kMaxGroup][D]: the B operand of the score mma.
    __nv_bfloat16* q_b = reinterpret_cast<__nv_bfloat16*>(smem);
    float* p_s = smem + kMaxGroup * kQFloats;            // [warps][16][kMaxGroup]
    float* merge_o = p_s + kWarps * kBlockTokens * kMaxGroup;  // [warps][G][D]
    __shared__ float merge_m[kWarps][kMaxGroup];
    __shared__ float merge_l[kWarps][kMaxGroup];
    __shared__ unsigned is_last;
    __shared__ float2 part_ml[kMaxGroup];  // cluster launch: this split's (max, sum) per head
    // The new token's key and value as written to the cache, for the warp that scores its block.
    __shared__ __align__(16) __nv_bfloat16 new_kv[2][D];

    const int kvh = blockIdx.x;
    const int row = blockIdx.y;
    const int split = blockIdx.z;
    const int group = G > 0 ? G : p.q_heads / p.kv_heads;
    // Positions and slots are the host's (copied before the step), never written by a kernel that
    // may still be running: they may be read before pdl_wait; so may the block table and the
    // cache's earlier positions with cache_before_wait (src/ops/attention.rs, AttnDecode::slot_of_row
    // and AttnDecode::overlap_previous, state the contracts).
    const int pos = p.positions[row];
    const int slot = p.slot_of_row[row];
    const int ctx = pos + 1;
    const Splits sp = attn_splits(ctx);
    if (sp.count > static_cast<int>(gridDim.z) || pos < 0 || pos >= p.max_pos || pos / kBlockTokens >= p.ld_bt ||
        (G > 0 && p.q_heads != G * p.kv_heads)) {
        __trap();
    }
    aot::pdl_launch_dependents();
    if (split >= sp.count) {
        if (kCluster) cluster_idle(sp.count);
        return;
    }
    const int t_begin = split * sp.tokens;
    const int t_end = min(ctx, t_begin + sp.tokens);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int* table = p.block_table + static_cast<int64_t>(slot) * p.ld_bt;
    const __nv_bfloat16* raw = p.qkv + static_cast<int64_t>(row) * p.ld_qkv;
    const int ld_q = p.q_heads * D;  // out rows

    // The raw values of this warp's first query head and, in warps 0 and 1 of the split holding
    // the new position, of the new key or value, after the wait for the qkv projection that wrote
    // them: requested before the cache block below, or, with cache_before_wait, after it (which
    // the wait then follows); either way the two round trips overlap.
    const bool writer = split == sp.count - 1 && warp < 2;
    float q_first[D / 32], kv_new[D / 32];
    int new_blk = 0;
    auto load_new = [&]() {
        aot::pdl_wait();
        if (warp < group) head_load<D>(raw + (kvh * group + warp) * D, q_first);
        if (writer) head_load<D>(raw + (p.q_heads + (warp == 0 ? 0 : p.kv_heads) + kvh) * D, kv_new);
        new_blk = writer ? table[pos / kBlockTokens] : 0;
    };
    if (!p.cache_before_wait) load_new();

    // This warp's first cache block, requested before the query's preparation so that its latency
    // overlaps it, and with cache_before_wait, before the wait (the cache's earlier positions and
    // the block table are then written by no kernel that may still be running; the new token's
    // key and value, which this kernel writes, are patched in below).
    const int b0 = t_begin / kBlockTokens + warp;
    // Lane j holds the cache block of this warp's iteration j (blocks b0 + 4 j): one round trip
    // for the whole table slice instead of one before every block.
    const int lane_b = b0 + (threadIdx.x & 31) * kWarps;
    const int lane_blk = lane_b * kBlockTokens < t_end ? table[lane_b] : -1;
    // The tokens of the split's cache block b, and its load from cache block `blk` (a negative
    // id, a hole in the table, traps).
    auto block_tokens = [&](int b) { return min(kBlockTokens, t_end - b * kBlockTokens); };
    auto load_block = [&](int blk, int b, KvRegs<D>& r) {
        if (blk < 0) __trap();
        load_kv<D>(p, (static_cast<int64_t>(blk) * p.kv_heads + kvh) * kBlockTokens, block_tokens(b), r);
    };
    // The cache block of the warp's iteration `it` (block b of the split), from the lane that
    // holds it or, past 32 iterations, from the table.
    auto fetch = [&](int it, int b, KvRegs<D>& r) {
        if (b * kBlockTokens < t_end) load_block(it < 32 ? __shfl_sync(0xffffffffu, lane_blk, it) : table[b], b, r);
    };
    // The pipelined entries request the warp's first two cache blocks here, into two register
    // sets that the loop below then takes in turn; the others the first only.
    KvRegs<D> pre, pre2;
    if (kFirstEarly) fetch(0, b0, pre);
    if (kPrefetch) fetch(1, b0 + kWarps, pre2);

    if (p.cache_before_wait) load_new();

    // Query heads of this KV head (warp w builds heads w, w + 4), normed and rotated; bf16 as the
    // model rounds them, so storing them as bf16 loses nothing.
    for (int h = warp; h < group; h += kWarps) {
        float x[D / 32];
        if (h == warp) {
#pragma unroll
            for (int i = 0; i < D / 32; ++i) x[i] = q_first[i];
        } else {
            head_load<D>(raw + (kvh * group + h) * D, x);
        }
        head_finish<D>(p, p.q_norm, pos, x);
#pragma unroll
        for (int i = 0; i < D / 64; ++i) {
            const int j = lane + 32 * i;
            q_b[h * D + j] = __float2bfloat16_rn(x[2 * i]);
            q_b[h * D + j + kHalf] = __float2bfloat16_rn(x[2 * i + 1]);
        }
    }
    // The split holding the new position writes its key (normed, rotated) and value into the
    // cache, and into shared memory for the warp whose block holds them.
    if (writer) {
        if (new_blk < 0) __trap();
        const bool is_k = warp == 0;
        if (is_k) head_finish<D>(p, p.k_norm, pos, kv_new);
        __nv_bfloat16* dst = (is_k ? p.k_cache : p.v_cache) +
                             ((static_cast<int64_t>(new_blk) * p.kv_heads + kvh) * kBlockTokens + pos % kBlockTokens) * D;
#pragma unroll
        for (int i = 0; i < D / 64; ++i) {
            const int j = lane + 32 * i;
            const __nv_bfloat16 lo = __float2bfloat16_rn(kv_new[2 * i]);
            const __nv_bfloat16 hi = __float2bfloat16_rn(kv_new[2 * i + 1]);
            dst[j] = lo;
            dst[j + kHalf] = hi;
            new_kv[warp][j] = lo;
            new_kv[warp][j + kHalf] = hi;
        }
    }
    // Makes the query and the written key/value visible to the whole block.
    __syncthreads();

    // Scores on tensor cores: S[16 tokens][8 heads] = K (A, rows g and g + 8) x Q^T (B, column g
    // = head g, zero past the group), one mma.m16n8k16 per 16 dims. The lane then holds tokens g
    // and g + 8 of heads 2t and 2t + 1, and keeps the running max and sum of those two heads.
    const int g = lane >> 2;
    const int t = lane & 3;
    uint4 qf[D / 32];
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
        qf[c] = g < group ? *reinterpret_cast<const uint4*>(q_b + g * D + 32 * c + 8 * t) : make_uint4(0, 0, 0, 0);
    }
    const float qscale = p.scale * kLog2e;  // scores in base 2
    float m_run[2] = {aot::neg_inf(), aot::neg_inf()};
    float l_run[2] = {0.0f, 0.0f};
    // O^T accumulators, one mma tile per dims pair j of chunk c: [0], [1] = heads 2t, 2t + 1 at dim
    // 64c + 8g + 2j; [2], [3] = the same heads at the next dim. The lane's heads are those of its
    // running max and sum.
    float o[D / 64][4][4];
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[c][j][e] = 0.0f;
        }
    }

    float* my_p = p_s + warp * kBlockTokens * kMaxGroup;
    // The new token's key and value, written after the warp's first block (the pipelined entries:
    // first two) was requested: patched into it from shared memory.
    auto patch_new = [&](KvRegs<D>& cur, int b) {
        if (b == pos / kBlockTokens) {
            const int q = pos % kBlockTokens;
            if (g == q || g + 8 == q) {
                const uint4* krow = reinterpret_cast<const uint4*>(new_kv[0] + 8 * t);
#pragma unroll
                for (int c = 0; c < D / 32; ++c) {
                    const uint4 fresh = krow[4 * c];
                    if (g == q) {
                        cur.k[2 * c] = fresh;
                    } else {
                        cur.k[2 * c + 1] = fresh;
                    }
                }
            }
            const uint4* vrow = reinterpret_cast<const uint4*>(new_kv[1] + 8 * g);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (v_token(t, i) == q) {  // constant indices keep the block in registers
#pragma unroll
                    for (int c = 0; c < D / 64; ++c) cur.v[i][c] = vrow[8 * c];
                }
            }
        }
    };
    // Scores, online softmax and O^T += V^T P^T for one cache block of n_tok tokens.
    auto score = [&](const KvRegs<D>& cur, int n_tok) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < D / 32; ++c) aot::mma_chunk32(acc, cur.k[2 * c], cur.k[2 * c + 1], qf[c]);
        const bool valid_lo = g < n_tok;
        const bool valid_hi = g + 8 < n_tok;

        // Online softmax of heads 2t + j over these 16 tokens: the 8 lanes that share t hold them.
        float alpha[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float s_lo = valid_lo ? acc[j] * qscale : aot::neg_inf();
            const float s_hi = valid_hi ? acc[2 + j] * qscale : aot::neg_inf();
            float bmax = fmaxf(s_lo, s_hi);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, off));
            const float m_new = fmaxf(m_run[j], bmax);
            alpha[j] = m_run[j] == aot::neg_inf() ? 0.0f : exp2f(m_run[j] - m_new);
            const float p_lo = valid_lo ? exp2f(s_lo - m_new) : 0.0f;
            const float p_hi = valid_hi ? exp2f(s_hi - m_new) : 0.0f;
            float bsum = p_lo + p_hi;
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) bsum += __shfl_xor_sync(0xffffffffu, bsum, off);
            l_run[j] = l_run[j] * alpha[j] + bsum;
            m_run[j] = m_new;
            my_p[g * kMaxGroup + 2 * t + j] = p_lo;
            my_p[(g + 8) * kMaxGroup + 2 * t + j] = p_hi;
        }
        __syncwarp();

        // O^T = O^T * alpha + V^T P^T: P^T (16 tokens x 8 heads) is the B fragment, tokens 2t,
        // 2t + 1, 2t + 8, 2t + 9 of head g, rounded to bf16.
        const uint32_t pb0 = aot::pack_bf16x2(my_p[2 * t * kMaxGroup + g], my_p[(2 * t + 1) * kMaxGroup + g]);
        const uint32_t pb1 = aot::pack_bf16x2(my_p[(2 * t + 8) * kMaxGroup + g], my_p[(2 * t + 9) * kMaxGroup + g]);
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                o[c][j][0] *= alpha[0];
                o[c][j][1] *= alpha[1];
                o[c][j][2] *= alpha[0];
                o[c][j][3] *= alpha[1];
                // Rows g / g + 8 are the low / high bf16 of word j; columns the four tokens.
                const uint32_t w0 = word(cur.v[0][c], j), w1 = word(cur.v[1][c], j);
                const uint32_t w2 = word(cur.v[2][c], j), w3 = word(cur.v[3][c], j);
                aot::mma_bf16_16816(o[c][j], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                                    __byte_perm(w2, w3, 0x5410), __byte_perm(w2, w3, 0x7632), pb0, pb1);
            }
        }
        __syncwarp();
    };
    if constexpr (kPrefetch) {
        // Two register sets in turn, never copied into each other (a copy waits for its loads):
        // while the block of one is scored, the block after it is already streaming into the
        // other, and the block after that is requested as soon as the first set is free. Both
        // of the first two were requested before the query's preparation, so before the new key
        // and value were written: both are patched.
        int b = b0, it = 0;
        if (b * kBlockTokens < t_end) {
            patch_new(pre, b);
            patch_new(pre2, b + kWarps);
        }
        while (b * kBlockTokens < t_end) {
            score(pre, block_tokens(b));
            b += kWarps;
            ++it;
            if (b * kBlockTokens >= t_end) break;
            fetch(it + 1, b + kWarps, pre);
            score(pre2, block_tokens(b));
            b += kWarps;
            ++it;
            fetch(it + 1, b + kWarps, pre2);
        }
    } else {
        // One block at a time; the first, at 64 and 128, from the registers it was requested into
        // before the query's preparation (its own scope, so that they are free for the rest).
        int b = b0;
        if (kFirstEarly && b * kBlockTokens < t_end) {
            KvRegs<D> cur = pre;
            patch_new(cur, b);
            score(cur, block_tokens(b));
            b += kWarps;
        }
        for (; b * kBlockTokens < t_end; b += kWarps) {
            KvRegs<D> cur;
            load_block(table[b], b, cur);
            score(cur, block_tokens(b));
        }
    }

    // Merge the warps in order.
    if (g == 0) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (2 * t + j < group) {
                merge_m[warp][2 * t + j] = m_run[j];
                merge_l[warp][2 * t + j] = l_run[j];
            }
        }
    }
#pragma unroll
    for (int jh = 0; jh < 2; ++jh) {
        const int h = 2 * t + jh;
        if (h >= group) continue;
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float* dst = merge_o + (warp * kMaxGroup + h) * D + 64 * c + 8 * g + 2 * j;
                *reinterpret_cast<float2*>(dst) = make_float2(o[c][j][jh], o[c][j][2 + jh]);
            }
        }
    }
    __syncthreads();
    const bool single = sp.count == 1;
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        const int h = i / D, d = i - h * D;
        float mm = aot::neg_inf();
        for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, merge_m[w][h]);
        float ll = 0.0f, oo = 0.0f;
        for (int w = 0; w < kWarps; ++w) {
            if (merge_m[w][h] == aot::neg_inf()) continue;
            const float f = exp2f(merge_m[w][h] - mm);
            ll += merge_l[w][h] * f;
            oo += merge_o[(w * kMaxGroup + h) * D + d] * f;
        }
        const int qh = kvh * group + h;
        if (single) {
            p.out[static_cast<int64_t>(row) * ld_q + qh * D + d] = __float2bfloat16_rn(oo / ll);
        } else if (kCluster) {
            // Warp 0's slot of element i: only this thread reads it, and it has.
            merge_o[i] = oo;
            if (d == 0) part_ml[h] = make_float2(mm, ll);
        } else {
            const int64_t cell = (static_cast<int64_t>(row) * p.q_heads + qh) * kMaxSplits + split;
            p.ws_o[cell * D + d] = oo;
            if (d == 0) {
                p.ws_ml[cell * 2] = mm;
                p.ws_ml[cell * 2 + 1] = ll;
            }
        }
    }
    if (single) return;
    if (kCluster) {
        // p_s (the probabilities) is free: every warp is past the barrier above.
        cluster_merge<D>(p, sp.count, group, split, row, kvh, merge_o, part_ml, p_s);
        return;
    }

    // The block's partials are stored (the barrier makes them thread 0's to order); one acq_rel
    // add releases them and, in the last block, acquires every other block's (as the GEMV's
    // residual_norm_tail and cooperative groups' grid barrier do): no separate fences.
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* counter = p.counters + row * p.kv_heads + kvh;
        unsigned before;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
        is_last = before == static_cast<unsigned>(sp.count - 1);
    }
    __syncthreads();
    if (!is_last) return;
    // The last block merges the splits. Every load it needs goes out before any is used: thread
    // tid takes elements (head, dim) = tid, tid + 128, ... and requests its first kChunk splits' o
    // partials, threads below the group size every split's (max, sum) pair, all in one round trip
    // (loaded as they were used, they made a chain of about seven L2 round trips after the counter).
    constexpr int kElems = ((G > 0 ? G : kMaxGroup) * D + kThreads - 1) / kThreads;
    constexpr int kChunk = kElems > 4 ? 2 : 8;  // splits per round of o loads (registers: kElems x kChunk)
    const int elems = group * D;
    const int64_t o_row = static_cast<int64_t>(row) * p.q_heads + kvh * group;  // first head's cell row
    float x[kElems][kChunk];
    auto load_o = [&](int s0) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int i = threadIdx.x + e * kThreads;
            const int h = i / D, d = i - h * D;
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
                x[e][j] = i < elems && s0 + j < sp.count ? __ldcg(p.ws_o + ((o_row + h) * kMaxSplits + s0 + j) * D + d)
                                                         : 0.0f;
            }
        }
    };
    load_o(0);
    // Every split's (max, sum) pair of every head into shared memory, then per query head the
    // running max over splits and each split's weight (reusing merge_m / merge_l is not possible:
    // the splits outnumber the warps; merge_o is free again).
    float* w_split = merge_o;  // [group][kMaxSplits] weights, then [group] totals
    float2* ml_s = reinterpret_cast<float2*>(merge_o + kMaxGroup * (kMaxSplits + 1));  // [group][kMaxSplits]
    {
        constexpr int kPairs = (kMaxGroup * kMaxSplits + kThreads - 1) / kThreads;
        const float2* ml = reinterpret_cast<const float2*>(p.ws_ml) + o_row * kMaxSplits;
#pragma unroll
        for (int q = 0; q < kPairs; ++q) {
            const int i = threadIdx.x + q * kThreads;
            if (i < group * kMaxSplits && i % kMaxSplits < sp.count) ml_s[i] = __ldcg(ml + i);
        }
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < group) {
        const float2* v = ml_s + threadIdx.x * kMaxSplits;
        float mm = aot::neg_inf();
        for (int s = 0; s < sp.count; ++s) mm = fmaxf(mm, v[s].x);
        float ll = 0.0f;
        for (int s = 0; s < sp.count; ++s) {
            const float f = exp2f(v[s].x - mm);
            w_split[threadIdx.x * kMaxSplits + s] = f;
            ll += v[s].y * f;
        }
        w_split[group * kMaxSplits + threadIdx.x] = ll;
    }
    __syncthreads();
    float oo[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) oo[e] = 0.0f;
    for (int s0 = 0; s0 < sp.count; s0 += kChunk) {
        if (s0 > 0) load_o(s0);
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int h = (threadIdx.x + e * kThreads) / D;
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
                if (s0 + j < sp.count && h < group) oo[e] += x[e][j] * w_split[h * kMaxSplits + s0 + j];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
        const int i = threadIdx.x + e * kThreads;
        if (i >= elems) break;
        const int h = i / D, d = i - h * D;
        const int qh = kvh * group + h;
        p.out[static_cast<int64_t>(row) * ld_q + qh * D + d] = __float2bfloat16_rn(oo[e] / w_split[group * kMaxSplits + h]);
    }
    if (threadIdx.x == 0) p.counters[row * p.kv_heads + kvh] = 0;
}

}  // namespace aot_attn_decode

using namespace aot_attn_decode;

#define AOT_ATTN_DECODE(name, d, g, pipelined)                                              \
    extern "C" __global__ void __launch_bounds__(kThreads) name(const AttnDecodeParams p) { \
        attn_decode<d, g, pipelined>(p);                                                    \
    }
// The unpipelined entries at 64 and 128, held to 128 registers: four blocks an SM, the point of
// them (their first cache block, requested before the query's preparation, would take them to
// 132-139 unbounded; bounded, nothing spills on sm_90, 4-36 bytes on sm_80, sm_100 and sm_120).
#define AOT_ATTN_DECODE_NP(name, d, g)                                                          \
    extern "C" __global__ void __launch_bounds__(kThreads, 4) name(const AttnDecodeParams p) { \
        attn_decode<d, g, false>(p);                                                            \
    }
// The cluster entries: the kinds small launches take (pipelined at 64 and 128, and 256), which
// is where the cluster merge pays (src/ops/attention.rs::attn_cluster).
#define AOT_ATTN_DECODE_CL(name, d, g, pipelined)                                               \
    extern "C" __global__ void __launch_bounds__(kThreads) name##_cl(const AttnDecodeParams p) { \
        attn_decode<d, g, pipelined, true>(p);                                                  \
    }
AOT_ATTN_DECODE(attn_decode_d64, 64, 0, true)
AOT_ATTN_DECODE(attn_decode_d64_g2, 64, 2, true)
AOT_ATTN_DECODE(attn_decode_d64_g4, 64, 4, true)
AOT_ATTN_DECODE(attn_decode_d64_g8, 64, 8, true)
AOT_ATTN_DECODE_NP(attn_decode_d64_np, 64, 0)
AOT_ATTN_DECODE_NP(attn_decode_d64_g2_np, 64, 2)
AOT_ATTN_DECODE_NP(attn_decode_d64_g4_np, 64, 4)
AOT_ATTN_DECODE_NP(attn_decode_d64_g8_np, 64, 8)
AOT_ATTN_DECODE(attn_decode_d128, 128, 0, true)
AOT_ATTN_DECODE(attn_decode_d128_g2, 128, 2, true)
AOT_ATTN_DECODE(attn_decode_d128_g4, 128, 4, true)
AOT_ATTN_DECODE(attn_decode_d128_g8, 128, 8, true)
AOT_ATTN_DECODE_NP(attn_decode_d128_np, 128, 0)
AOT_ATTN_DECODE_NP(attn_decode_d128_g2_np, 128, 2)
AOT_ATTN_DECODE_NP(attn_decode_d128_g4_np, 128, 4)
AOT_ATTN_DECODE_NP(attn_decode_d128_g8_np, 128, 8)
AOT_ATTN_DECODE(attn_decode_d256, 256, 0, false)
AOT_ATTN_DECODE(attn_decode_d256_g2, 256, 2, false)
AOT_ATTN_DECODE(attn_decode_d256_g4, 256, 4, false)
AOT_ATTN_DECODE(attn_decode_d256_g8, 256, 8, false)
AOT_ATTN_DECODE_CL(attn_decode_d64, 64, 0, true)
AOT_ATTN_DECODE_CL(attn_decode_d64_g2, 64, 2, true)
AOT_ATTN_DECODE_CL(attn_decode_d64_g4, 64, 4, true)
AOT_ATTN_DECODE_CL(attn_decode_d64_g8, 64, 8, true)
AOT_ATTN_DECODE_CL(attn_decode_d128, 128, 0, true)
AOT_ATTN_DECODE_CL(attn_decode_d128_g2, 128, 2, true)
AOT_ATTN_DECODE_CL(attn_decode_d128_g4, 128, 4, true)
AOT_ATTN_DECODE_CL(attn_decode_d128_g8, 128, 8, true)
AOT_ATTN_DECODE_CL(attn_decode_d256, 256, 0, false)
AOT_ATTN_DECODE_CL(attn_decode_d256_g2, 256, 2, false)
AOT_ATTN_DECODE_CL(attn_decode_d256_g4, 256, 4, false)
AOT_ATTN_DECODE_CL(attn_decode_d256_g8, 256, 8, false)
#undef AOT_ATTN_DECODE_CL
#undef AOT_ATTN_DECODE_NP
#undef AOT_ATTN_DECODE
