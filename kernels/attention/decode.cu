// Decode attention over the paged KV cache (one new query token per sequence), GQA, split-KV.
//
//   o[q] = sum_t softmax_t(q . k_t / sqrt(d)) v_t      over the sequence's positions 0..ctx-1
//
// Grid (kv_heads, rows, max_splits); a block reads the K and V of one KV head once for all the
// query heads that share it. A sequence's context is cut into `attn_splits(ctx)` ranges of whole
// 16-token cache blocks (a function of its own length only, so a sequence's result never depends
// on what else is in the batch); blocks past a sequence's split count return at once. Each split
// keeps an online softmax (fp32, base 2) per query head; when a sequence has more than one split,
// the last block to finish merges the partials in split order.
//
// Cache layout per layer: [blocks][kv_heads][16][d] bf16 for K and for V.
#include "aot_common.cuh"
#include "aot_mma.cuh"

// A named namespace: nvcc names anonymous-namespace symbols after a per-run unique id, which
// would make the PTX (and the lock) differ between builds.
namespace aot_attn_decode {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kBlockTokens = 16;
constexpr int kMaxGroup = 8;
constexpr int kMaxSplits = 32;
constexpr int kTokensPerSplitMin = 64;
constexpr float kLog2e = 1.4426950408889634f;

// Mirrored by `AttnDecodeParams` in src/ops/attention.rs (repr(C)).
struct AttnDecodeParams {
    const __nv_bfloat16* q;        // [m][q_heads * d]
    const __nv_bfloat16* k_cache;  // [blocks][kv_heads][16][d]
    const __nv_bfloat16* v_cache;
    const int* block_table;        // [slots][ld_bt]
    const int* slot_of_row;        // [m]
    const int* ctx_lens;           // [m]: positions 0..ctx-1 are in the cache
    __nv_bfloat16* out;            // [m][q_heads * d]
    float* ws_ml;                  // [m][q_heads][kMaxSplits][2]: running max, sum
    float* ws_o;                   // [m][q_heads][kMaxSplits][d]
    unsigned* counters;            // [m][kv_heads], zero between launches
    int m, q_heads, kv_heads, ld_bt;
    float scale;                   // 1/sqrt(d)
    int pad_;
};

// The split of a context of `ctx` tokens: `count` ranges of `tokens` tokens (a multiple of 16).
// src/ops/attention.rs::attn_splits is the host twin.
struct Splits {
    int count;
    int tokens;
};

__device__ __forceinline__ Splits attn_splits(int ctx) {
    int want = (ctx + kTokensPerSplitMin - 1) / kTokensPerSplitMin;
    want = min(max(want, 1), kMaxSplits);
    int per = (ctx + want - 1) / want;
    per = (per + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    return Splits{(ctx + per - 1) / per, per};
}

template <int D>
__device__ __forceinline__ void attn_decode(const AttnDecodeParams& p) {
    constexpr int kHalf = D / 2;
    constexpr int kQStride = D + 8;          // per head: [half 0 | pad 4 | half 1 | pad 4] in floats
    constexpr int kPerLane = D / 32;         // V dims per lane
    extern __shared__ float smem[];
    float* q_s = smem;                                   // [G][kQStride]
    float* p_s = q_s + kMaxGroup * kQStride;             // [warps][16][G]
    float* merge_o = p_s + kWarps * kBlockTokens * kMaxGroup;  // [warps][G][D]
    __shared__ float merge_m[kWarps][kMaxGroup];
    __shared__ float merge_l[kWarps][kMaxGroup];
    __shared__ unsigned is_last;

    const int kvh = blockIdx.x;
    const int row = blockIdx.y;
    const int split = blockIdx.z;
    const int group = p.q_heads / p.kv_heads;
    const int ctx = p.ctx_lens[row];
    const Splits sp = attn_splits(ctx);
    if (sp.count > static_cast<int>(gridDim.z) || ctx <= 0) __trap();
    if (split >= sp.count) return;
    const int t_begin = split * sp.tokens;
    const int t_end = min(ctx, t_begin + sp.tokens);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int slot = p.slot_of_row[row];
    const int* table = p.block_table + static_cast<int64_t>(slot) * p.ld_bt;
    if ((ctx - 1) / kBlockTokens >= p.ld_bt) __trap();

    // Query heads of this KV head, pre-scaled so that scores are in base 2.
    const int ld_q = p.q_heads * D;
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        const int h = i / D, d = i - h * D;
        const float v = __bfloat162float(p.q[static_cast<int64_t>(row) * ld_q + (kvh * group + h) * D + d]);
        q_s[h * kQStride + (d < kHalf ? d : d + 4)] = v * p.scale * kLog2e;
    }
    __syncthreads();

    float m_run[kMaxGroup], l_run[kMaxGroup], o[kMaxGroup][kPerLane];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
        m_run[h] = aot::neg_inf();
        l_run[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) o[h][e] = 0.0f;
    }

    const int tl = lane & 15;   // the token this lane scores
    const int part = lane >> 4; // which half of d it reads
    float* my_p = p_s + warp * kBlockTokens * kMaxGroup;
    for (int b = t_begin / kBlockTokens + warp; b * kBlockTokens < t_end; b += kWarps) {
        const int blk = table[b];
        if (blk < 0) __trap();
        const int64_t base = (static_cast<int64_t>(blk) * p.kv_heads + kvh) * kBlockTokens;
        const int pos = b * kBlockTokens + tl;
        const bool valid = pos < t_end;  // t_begin is block-aligned

        // Scores: each lane dots half a key with every query head; the two halves meet by shuffle.
        float sc[kMaxGroup];
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) sc[h] = 0.0f;
        const uint4* krow = reinterpret_cast<const uint4*>(p.k_cache + (base + tl) * D + part * kHalf);
#pragma unroll 4
        for (int c = 0; c < kHalf / 8; ++c) {
            float kf[8];
            aot::unpack8(valid ? __ldg(krow + c) : make_uint4(0, 0, 0, 0), kf);
#pragma unroll
            for (int h = 0; h < kMaxGroup; ++h) {
                if (h < group) {
                    const float4* qv = reinterpret_cast<const float4*>(q_s + h * kQStride + part * (kHalf + 4) + c * 8);
                    const float4 a = qv[0], bq = qv[1];
                    sc[h] += kf[0] * a.x + kf[1] * a.y + kf[2] * a.z + kf[3] * a.w + kf[4] * bq.x + kf[5] * bq.y +
                             kf[6] * bq.z + kf[7] * bq.w;
                }
            }
        }
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
            if (h < group) {
                sc[h] += __shfl_xor_sync(0xffffffffu, sc[h], 16);
                if (!valid) sc[h] = aot::neg_inf();
            }
        }

        // Online softmax per head over these 16 tokens.
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
            if (h >= group) continue;
            float bmax = sc[h];
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, off));
            const float m_new = fmaxf(m_run[h], bmax);
            const float alpha = m_run[h] == aot::neg_inf() ? 0.0f : exp2f(m_run[h] - m_new);
            const float pr = valid ? exp2f(sc[h] - m_new) : 0.0f;
            float bsum = pr;
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) bsum += __shfl_xor_sync(0xffffffffu, bsum, off);
            l_run[h] = l_run[h] * alpha + bsum;
            m_run[h] = m_new;
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) o[h][e] *= alpha;
            if (lane < kBlockTokens) my_p[lane * kMaxGroup + h] = pr;
        }
        __syncwarp();

        // o += p v: lane owns kPerLane consecutive dims of every query head.
        const __nv_bfloat16* vbase = p.v_cache + base * D + lane * kPerLane;
        const int n_tok = min(kBlockTokens, t_end - b * kBlockTokens);
        for (int tk = 0; tk < n_tok; ++tk) {
            float vf[kPerLane];
            const __nv_bfloat16* vp = vbase + tk * D;
            if constexpr (kPerLane == 8) {
                aot::unpack8(__ldg(reinterpret_cast<const uint4*>(vp)), vf);
            } else if constexpr (kPerLane == 4) {
                const uint2 raw = __ldg(reinterpret_cast<const uint2*>(vp));
                vf[0] = aot::bf16_lo(raw.x); vf[1] = aot::bf16_hi(raw.x);
                vf[2] = aot::bf16_lo(raw.y); vf[3] = aot::bf16_hi(raw.y);
            } else {
                const unsigned raw = __ldg(reinterpret_cast<const unsigned*>(vp));
                vf[0] = aot::bf16_lo(raw); vf[1] = aot::bf16_hi(raw);
            }
#pragma unroll
            for (int h = 0; h < kMaxGroup; ++h) {
                if (h < group) {
                    const float pr = my_p[tk * kMaxGroup + h];
#pragma unroll
                    for (int e = 0; e < kPerLane; ++e) o[h][e] += pr * vf[e];
                }
            }
        }
        __syncwarp();
    }

    // Merge the warps in order.
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
        if (h >= group) continue;
        if (lane == 0) {
            merge_m[warp][h] = m_run[h];
            merge_l[warp][h] = l_run[h];
        }
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) merge_o[(warp * kMaxGroup + h) * D + lane * kPerLane + e] = o[h][e];
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

    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* counter = p.counters + row * p.kv_heads + kvh;
        is_last = atomicAdd(counter, 1u) == static_cast<unsigned>(sp.count - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int i = threadIdx.x; i < group * D; i += kThreads) {
        const int h = i / D, d = i - h * D;
        const int qh = kvh * group + h;
        const int64_t cell0 = (static_cast<int64_t>(row) * p.q_heads + qh) * kMaxSplits;
        float mm = aot::neg_inf();
        for (int s = 0; s < sp.count; ++s) mm = fmaxf(mm, __ldcg(p.ws_ml + (cell0 + s) * 2));
        float ll = 0.0f, oo = 0.0f;
        for (int s = 0; s < sp.count; ++s) {
            const float f = exp2f(__ldcg(p.ws_ml + (cell0 + s) * 2) - mm);
            ll += __ldcg(p.ws_ml + (cell0 + s) * 2 + 1) * f;
            oo += __ldcg(p.ws_o + (cell0 + s) * D + d) * f;
        }
        p.out[static_cast<int64_t>(row) * ld_q + qh * D + d] = __float2bfloat16_rn(oo / ll);
    }
    if (threadIdx.x == 0) p.counters[row * p.kv_heads + kvh] = 0;
}

}  // namespace aot_attn_decode

using namespace aot_attn_decode;

extern "C" __global__ void __launch_bounds__(kThreads) attn_decode_d64(const AttnDecodeParams p) {
    attn_decode<64>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) attn_decode_d128(const AttnDecodeParams p) {
    attn_decode<128>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) attn_decode_d256(const AttnDecodeParams p) {
    attn_decode<256>(p);
}
