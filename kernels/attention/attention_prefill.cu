// Causal prefill attention over the paged KV cache, for the T query tokens of one sequence at
// positions start_pos .. start_pos + T - 1. Query t attends to cache positions 0 ..= its position
// (earlier chunks included); GQA with G = Hq / Hkv query heads per KV head; scale s (1/sqrt(D));
// fp32 scores and online softmax (flash attention 2), tensor cores (mma.sync m16n8k16) for
// Q K^T and P V.
//   q: [T, Hq, D] bf16, o: [T, Hq, D] bf16, caches: [num_blocks][Hkv][16][D] bf16 (aot_paged_kv.cuh).
//
// A CTA takes 64 "rows" of one KV head: row r = (token r / G, query head r % G of that KV head),
// so the G heads that share K and V read them once. 4 warps of 16 rows. Keys come in tiles of BN
// positions aligned to absolute positions (tile j = positions [j BN, (j + 1) BN)), always from
// tile 0 upwards, double-buffered through cp.async.
//
// Determinism across chunkings: a row's result depends only on its own query and the keys and
// values at positions <= its position, visited in the same tiles in the same order whatever T,
// start_pos and the row's place in the CTA are (mma rows are independent; every reduction
// across a row's lanes is a fixed butterfly). A tile that is entirely past a row's position (the
// CTA serves later rows) leaves the row's state bit-identical: its scores are -inf, the running max
// does not move, the rescale factor is exactly 1 (taken, not computed), its probabilities are 0,
// its row sum adds +0 and P V adds zero products. Positions past the CTA's last query are never
// read (zero-filled), so stale cache contents cannot leak in as NaN. A zero output is written as
// +0, so the sign of an exact zero cannot depend on the chunking either.
//
// Float arithmetic outside the mma uses explicit round-to-nearest intrinsics so that SASS and the
// PTX fallback give the same bits.
#include "aot_common.cuh"
#include "aot_mma.cuh"
#include "aot_paged_kv.cuh"

// Dynamic shared memory, declared at file scope: a declaration inside the anonymous namespace
// would carry a path-dependent name into the PTX, and the image would change with the folder.
extern __shared__ __align__(128) uint8_t attention_prefill_smem[];

namespace {

constexpr int kBM = 64;
constexpr int kThreads = 128;

// Byte offset of 16-byte chunk c of row r in a [rows][D] bf16 tile: the low 3 bits of the chunk
// are XORed with the row, so 8 consecutive rows at one chunk hit 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t swizzle(int r, int c) {
    return static_cast<uint32_t>(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

template <int D, int BN>
__device__ __forceinline__ void attention_prefill(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ q,
                                                  const __nv_bfloat16* __restrict__ k_cache,
                                                  const __nv_bfloat16* __restrict__ v_cache,
                                                  const int* __restrict__ block_table, int table_len, int num_blocks,
                                                  int tokens, int num_q_heads, int num_kv_heads, int start_pos,
                                                  float softmax_scale) {
    constexpr int kChunks = D / 8;  // 16-byte chunks per row
    constexpr int kQBytes = kBM * D * 2;
    constexpr int kKvBytes = BN * D * 2;
    const uint32_t q_base = aot::smem_addr(attention_prefill_smem);
    // Stage s: K at q_base + kQBytes + s * 2 * kKvBytes, V right after it.
    auto k_stage = [&](int s) { return q_base + kQBytes + static_cast<uint32_t>(s * 2 * kKvBytes); };

    const int group = num_q_heads / num_kv_heads;
    const int rows = tokens * group;
    const int row_tiles = (rows + kBM - 1) / kBM;
    const int tile = row_tiles - 1 - static_cast<int>(blockIdx.x);  // the longest tiles first
    const int kv_head = blockIdx.y;
    const int r0 = tile * kBM;
    const int last_pos = start_pos + (min(rows, r0 + kBM) - 1) / group;
    const int key_tiles = last_pos / BN + 1;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    for (int i = tid; i < kBM * kChunks; i += kThreads) {
        const int row = i / kChunks;
        const int c = i % kChunks;
        const int r = r0 + row;
        const bool ok = r < rows;
        const int64_t head = static_cast<int64_t>(r / group) * num_q_heads + kv_head * group + r % group;
        aot::cp_async_16(q_base + swizzle<D>(row, c), ok ? q + head * D + c * 8 : q, ok);
    }
    aot::cp_async_commit();

    auto load_kv = [&](int j) {
        const uint32_t k_dst = k_stage(j & 1);
        const uint32_t v_dst = k_dst + kKvBytes;
        for (int i = tid; i < BN * kChunks; i += kThreads) {
            const int key = i / kChunks;
            const int c = i % kChunks;
            const int position = j * BN + key;
            const bool ok = position <= last_pos;
            int64_t at = 0;
            if (ok) {
                const int block = aot::kv_block(block_table, table_len, num_blocks, position);
                at = aot::kv_offset(block, kv_head, position % aot::kKvBlockTokens, num_kv_heads, D) + c * 8;
            }
            aot::cp_async_16(k_dst + swizzle<D>(key, c), k_cache + at, ok);
            aot::cp_async_16(v_dst + swizzle<D>(key, c), v_cache + at, ok);
        }
    };
    load_kv(0);
    aot::cp_async_commit();

    // This lane's two rows (g and g + 8 of the warp's 16) and their positions.
    const int g = lane >> 2;
    const int t4 = lane & 3;
    int position[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) position[h] = start_pos + (r0 + warp * 16 + g + h * 8) / group;

    const float scale_log2 = __fmul_rn(softmax_scale, 1.44269504088896340736f);
    float m[2] = {aot::neg_inf(), aot::neg_inf()};
    float l[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dn][e] = 0.0f;

    for (int j = 0; j < key_tiles; ++j) {
        if (j + 1 < key_tiles) {
            load_kv(j + 1);
            aot::cp_async_commit();
            aot::cp_async_wait<1>();
        } else {
            aot::cp_async_wait<0>();
        }
        __syncthreads();
        const uint32_t k_base = k_stage(j & 1);
        const uint32_t v_base = k_base + kKvBytes;

        // S = Q K^T for this warp's 16 rows and the tile's BN keys.
        float s[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            uint32_t a[4];
            aot::ldmatrix_x4(a, q_base + swizzle<D>(warp * 16 + (lane & 15), kd * 2 + (lane >> 4)));
#pragma unroll
            for (int nb = 0; nb < BN / 16; ++nb) {
                uint32_t b[4];
                aot::ldmatrix_x4(b, k_base + swizzle<D>(nb * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                        kd * 2 + ((lane >> 3) & 1)));
                aot::mma_bf16_16816(s[2 * nb], a, b[0], b[1]);
                aot::mma_bf16_16816(s[2 * nb + 1], a, b[2], b[3]);
            }
        }

        // Causal mask, log2-domain scale, the running max. Element e of tile nt is row g + 8 (e / 2),
        // key j BN + nt 8 + 2 t4 + e % 2.
        float tile_max[2] = {aot::neg_inf(), aot::neg_inf()};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = j * BN + nt * 8 + 2 * t4 + (e & 1);
                const float x = key <= position[e >> 1] ? __fmul_rn(s[nt][e], scale_log2) : aot::neg_inf();
                s[nt][e] = x;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
            }
        }
        float alpha[2];
        float m_use[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
            const float m_new = fmaxf(m[h], tile_max[h]);
            // Exactly 1 when the max does not move (a fully masked tile among them).
            alpha[h] = m_new == m[h] ? 1.0f : exp2f(__fsub_rn(m[h], m_new));
            m[h] = m_new;
            m_use[h] = m_new == aot::neg_inf() ? 0.0f : m_new;
        }

        // P = bf16(exp2(x - m)), packed as the A operand of P V (the C layout of two adjacent n8
        // tiles is the A layout of one k16 step); the row sum adds the rounded values P V uses.
        uint32_t p[BN / 16][4];
        float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float p0 = exp2f(__fsub_rn(s[nt][2 * h], m_use[h]));
                const float p1 = exp2f(__fsub_rn(s[nt][2 * h + 1], m_use[h]));
                const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
                row_sum[h] = __fadd_rn(row_sum[h], aot::to_f32x2(pb).x);
                row_sum[h] = __fadd_rn(row_sum[h], aot::to_f32x2(pb).y);
                p[nt / 2][(nt & 1) * 2 + h] = *reinterpret_cast<const uint32_t*>(&pb);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            row_sum[h] = __fadd_rn(row_sum[h], __shfl_xor_sync(0xffffffffu, row_sum[h], 1));
            row_sum[h] = __fadd_rn(row_sum[h], __shfl_xor_sync(0xffffffffu, row_sum[h], 2));
            l[h] = __fmaf_rn(l[h], alpha[h], row_sum[h]);
        }
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[dn][e] = __fmul_rn(acc[dn][e], alpha[e >> 1]);

        // O += P V: V is stored [key][d]; ldmatrix.trans gives the B fragments (k = key, n = d).
#pragma unroll
        for (int kc = 0; kc < BN / 16; ++kc) {
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                aot::ldmatrix_x4_trans(b, v_base + swizzle<D>(kc * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                              dp * 2 + (lane >> 4)));
                aot::mma_bf16_16816(acc[2 * dp], p[kc], b[0], b[1]);
                aot::mma_bf16_16816(acc[2 * dp + 1], p[kc], b[2], b[3]);
            }
        }
        __syncthreads();  // the next iteration refills the stage just read
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = r0 + warp * 16 + g + h * 8;
        if (r >= rows) continue;
        const float inv = __fdiv_rn(1.0f, l[h]);
        const int64_t head = static_cast<int64_t>(r / group) * num_q_heads + kv_head * group + r % group;
        __nv_bfloat16* o = out + head * D;
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
            // + 0.0f turns a -0 into +0 (and changes nothing else).
            const float v0 = __fadd_rn(__fmul_rn(acc[dn][2 * h], inv), 0.0f);
            const float v1 = __fadd_rn(__fmul_rn(acc[dn][2 * h + 1], inv), 0.0f);
            *reinterpret_cast<__nv_bfloat162*>(o + dn * 8 + 2 * t4) = __floats2bfloat162_rn(v0, v1);
        }
    }
}

}  // namespace

// Grid (ceil(T * G / 64), Hkv), 128 threads; dynamic shared memory 64 D 2 + 2 stages x 2 BN D 2
// bytes: 40960 (D 64, BN 64), 81920 (D 128, BN 64), 98304 (D 256, BN 32).
#define AOT_ATTENTION_PREFILL_ENTRY(NAME, D, BN)                                                                \
    extern "C" __global__ void __launch_bounds__(kThreads)                                                      \
        NAME(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ q,                               \
             const __nv_bfloat16* __restrict__ k_cache, const __nv_bfloat16* __restrict__ v_cache,               \
             const int* __restrict__ block_table, int table_offset, int table_len, int num_blocks, int tokens,  \
             int num_q_heads, int num_kv_heads, int start_pos, float softmax_scale) {                           \
        attention_prefill<D, BN>(out, q, k_cache, v_cache, block_table + table_offset, table_len, num_blocks,  \
                                 tokens, num_q_heads, num_kv_heads, start_pos, softmax_scale);                 \
    }

AOT_ATTENTION_PREFILL_ENTRY(attention_prefill_d64, 64, 64)
AOT_ATTENTION_PREFILL_ENTRY(attention_prefill_d128, 128, 64)
AOT_ATTENTION_PREFILL_ENTRY(attention_prefill_d256, 256, 32)
