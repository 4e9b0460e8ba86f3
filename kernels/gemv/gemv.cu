// Decode GEMV on tensor cores, with the stages around a projection fused in:
//
//   y[m, n] = sum_k x[m, k] * W[n, k]        (W row-major [n, k] as Hugging Face stores it; m <= 8)
//
// One mma.m16n8k16 tile covers 16 weight rows x 8 tokens, so batches of 1 to 8 tokens cost the
// same weight traffic; every weight byte is read once with a 16-byte streaming load.
//
// Work: units of 16 rows (one mma tile) x a K range (`splits` ranges per row). Every warp streams
// its own units with no block-wide barrier: a unit's weight rows are read in 32-element chunks,
// eight chunks in flight. Partial sums of a split-K unit go to a workspace; the last warp to finish
// an epilogue group (16 rows, or a whole attention head) adds the partials in split order and runs
// the epilogue. The order of every sum is fixed by the launch shape, never by timing, and a
// token's result never depends on the other tokens of the batch.
//
// Prologue (`gemv_norm_bf16`): x is the residual stream h; every block builds
// `bf16(w * bf16(h * rsqrt(ssq / k + eps)))` in shared memory, ssq being the per-group sums of
// squares the producer of h wrote. That fuses the RMSNorm before qkv, gate_up and lm_head.
//
// Epilogues (on each group of rows, per token):
//   store_bf16 / store_f32   y
//   residual                 h = bf16(h + bf16(y)); ssq[group] = sum h^2 (o_proj, down_proj)
//   silu_mul                 act = bf16(bf16(silu(bf16(gate))) * bf16(up)); a group's first 8 rows
//                            are gate rows, the last 8 up rows (virtual rows, see pair_offset)
//   qkv_rope                 per head: q/k RMSNorm, NeoX RoPE; q -> q_out, k and v -> paged cache
#include "aot_common.cuh"
#include "aot_mma.cuh"

// A named namespace: nvcc names anonymous-namespace symbols after a per-run unique id, which
// would make the PTX (and the lock) differ between builds.
namespace aot_gemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 16;
constexpr int kMaxTokens = 8;
constexpr int kMaxGroupRows = 256;
constexpr int kUnroll = 8;
constexpr int kXPad = 32;  // shared-memory row padding (elements): spreads rows over the banks
constexpr int kBlockTokens = 16;  // KV-cache block size

enum Epilogue : int { kStoreBf16 = 0, kStoreF32 = 1, kResidual = 2, kSiluMul = 3, kQkvRope = 4 };

// Mirrored field for field by `GemvParams` in src/ops/gemv.rs (repr(C)).
struct GemvParams {
    const __nv_bfloat16* w;       // [rows, k]
    const __nv_bfloat16* x;       // [m][ld_x] input (the residual stream h in the norm variant)
    const float* ssq;             // norm: [ssq_groups][8] sums of squares of h
    const __nv_bfloat16* norm_w;  // norm: [k]
    float* ws;                    // split-K partials [splits][m][n]
    unsigned* counters;           // per group; zero between launches (the last unit resets its own)
    void* out;                    // bf16 or f32 [m][ld_out]; qkv_rope: q [m][ld_out]
    __nv_bfloat16* residual;      // residual: h [m][ld_res], updated in place
    float* ssq_out;               // residual: [groups][8]
    const __nv_bfloat16* q_norm_w;
    const __nv_bfloat16* k_norm_w;
    const float* cos_sin;         // [max_pos][head_dim]: cos half, then sin half
    __nv_bfloat16* k_cache;       // [blocks][kv_heads][16][head_dim]
    __nv_bfloat16* v_cache;
    const int* block_table;       // [slots][ld_bt]
    const int* slot_of_row;       // [m]
    const int* positions;         // [m]
    int n, k, m;
    int ld_x, ld_out, ld_res;
    int ssq_groups;
    float eps;
    float norm_offset;            // 0: w, 1: (1 + w)
    int splits, k_per_split;      // k_per_split is a multiple of 32
    int group_rows;
    int epilogue;
    int pair_offset;              // > 0: the MLP width I; virtual rows pair gate and up rows
    int q_heads, kv_heads, head_dim, max_pos, ld_bt;
    int pad_;
};

struct Shared {
    float tile[kWarps][kMaxTokens][kTileRows];  // a unit's result, when it is a whole group
    float vals[kWarps][kMaxGroupRows];          // one token of a group, summed over the splits
    float scale[kMaxTokens];
};

// The weight row behind virtual row `v`, or null past the end. With pair_offset (= I, the MLP
// width), group g's first half maps to gate rows g*half.., its second half to up rows
// I + g*half..; rows past I in the last group are null (I need not be a multiple of half).
__device__ __forceinline__ const __nv_bfloat16* weight_row(const GemvParams& p, int v) {
    if (v >= p.n) return nullptr;
    int row = v;
    if (p.pair_offset > 0) {
        const int half = p.group_rows / 2;
        const int grp = v / p.group_rows;
        const int r = v - grp * p.group_rows;
        const int j = grp * half + (r < half ? r : r - half);
        if (j >= p.pair_offset) return nullptr;
        row = r < half ? j : p.pair_offset + j;
    }
    return p.w + static_cast<int64_t>(row) * p.k;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Per-head RMSNorm and RoPE of one token's head, then the store. One warp per token.
__device__ void qkv_head(const GemvParams& p, int head, int token, const float* v) {
    const int lane = threadIdx.x & 31;
    const int d = p.head_dim;
    const int half = d / 2;
    const bool is_q = head < p.q_heads;
    const bool is_k = !is_q && head < p.q_heads + p.kv_heads;
    const int pos = p.positions[token];
    if (pos < 0 || pos >= p.max_pos || pos / kBlockTokens >= p.ld_bt) __trap();

    constexpr int kMaxPer = kMaxGroupRows / 64;
    float x[2 * kMaxPer];  // this lane's elements: j = lane + 32 i for i < d/64, and their partners j + half
    const int per = half / 32;
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) {
        if (i >= per) break;
        const float a = aot::round_bf16(v[lane + 32 * i]);
        const float b = aot::round_bf16(v[lane + 32 * i + half]);
        x[2 * i] = a;
        x[2 * i + 1] = b;
        sum_sq += a * a + b * b;
    }
    __nv_bfloat16* dst;
    if (is_q) {
        dst = reinterpret_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(token) * p.ld_out +
              static_cast<int64_t>(head) * d;
    } else {
        const int kvh = is_k ? head - p.q_heads : head - p.q_heads - p.kv_heads;
        const int slot = p.slot_of_row[token];
        const int blk = p.block_table[static_cast<int64_t>(slot) * p.ld_bt + pos / kBlockTokens];
        if (blk < 0) __trap();
        __nv_bfloat16* cache = is_k ? p.k_cache : p.v_cache;
        dst = cache + ((static_cast<int64_t>(blk) * p.kv_heads + kvh) * kBlockTokens + pos % kBlockTokens) * d;
    }
    if (is_q || is_k) {
        const float scale = rsqrtf(aot::warp_sum(sum_sq) / static_cast<float>(d) + p.eps);
        const __nv_bfloat16* nw = is_q ? p.q_norm_w : p.k_norm_w;
        const float* cs = p.cos_sin + static_cast<int64_t>(pos) * d;
#pragma unroll
        for (int i = 0; i < kMaxPer; ++i) {
            if (i >= per) break;
            const int j = lane + 32 * i;
            const float x1 = aot::round_bf16((__bfloat162float(nw[j]) + p.norm_offset) * aot::round_bf16(x[2 * i] * scale));
            const float x2 =
                aot::round_bf16((__bfloat162float(nw[j + half]) + p.norm_offset) * aot::round_bf16(x[2 * i + 1] * scale));
            const float c = cs[j];
            const float s = cs[j + half];
            dst[j] = __float2bfloat16_rn(x1 * c - x2 * s);
            dst[j + half] = __float2bfloat16_rn(x2 * c + x1 * s);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kMaxPer; ++i) {
            if (i >= per) break;
            const int j = lane + 32 * i;
            dst[j] = __float2bfloat16_rn(x[2 * i]);
            dst[j + half] = __float2bfloat16_rn(x[2 * i + 1]);
        }
    }
}

// Runs the epilogue of `group` for one token on its summed values `v[r]`, r < group_rows.
// One warp calls it.
__device__ void epilogue(const GemvParams& p, int group, int token, const float* v) {
    const int n0 = group * p.group_rows;
    const int rows = min(p.group_rows, p.n - n0);
    const int lane = threadIdx.x & 31;
    const int64_t row_base = static_cast<int64_t>(token) * p.ld_out + n0;
    switch (p.epilogue) {
        case kStoreBf16:
            for (int r = lane; r < rows; r += 32) {
                reinterpret_cast<__nv_bfloat16*>(p.out)[row_base + r] = __float2bfloat16_rn(v[r]);
            }
            break;
        case kStoreF32:
            for (int r = lane; r < rows; r += 32) reinterpret_cast<float*>(p.out)[row_base + r] = v[r];
            break;
        case kResidual: {
            // group_rows == 16
            float sq = 0.0f;
            if (lane < rows) {
                __nv_bfloat16* h = p.residual + static_cast<int64_t>(token) * p.ld_res + n0 + lane;
                const float nv = aot::round_bf16(aot::round_bf16(v[lane]) + __bfloat162float(*h));
                *h = __float2bfloat16_rn(nv);
                sq = nv * nv;
            }
            sq = aot::warp_sum(sq);
            if (lane == 0) p.ssq_out[group * kMaxTokens + token] = sq;
            break;
        }
        case kSiluMul: {
            const int half = p.group_rows / 2;
            const int j = group * half + lane;
            if (lane < half && j < p.pair_offset) {
                const float gate = aot::round_bf16(v[lane]);
                const float up = aot::round_bf16(v[half + lane]);
                const float act = aot::round_bf16(silu(gate));
                reinterpret_cast<__nv_bfloat16*>(p.out)[static_cast<int64_t>(token) * p.ld_out + j] =
                    __float2bfloat16_rn(act * up);
            }
            break;
        }
        case kQkvRope:
            qkv_head(p, group, token, v);
            break;
        default:
            __trap();
    }
}

template <bool kNormX>
__device__ __forceinline__ void gemv_body(const GemvParams& p) {
    extern __shared__ uint4 dyn_smem[];
    __shared__ Shared s;
    __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(dyn_smem);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int x_stride = kNormX ? p.k + kXPad : p.ld_x;

    if (kNormX) {
        if (threadIdx.x < p.m) {
            float sum = 0.0f;
            for (int i = 0; i < p.ssq_groups; ++i) sum += p.ssq[i * kMaxTokens + threadIdx.x];
            s.scale[threadIdx.x] = rsqrtf(sum / static_cast<float>(p.k) + p.eps);
        }
        __syncthreads();
        const int chunks = p.k / 8;
        for (int i = threadIdx.x; i < p.m * chunks; i += kThreads) {
            const int r = i / chunks;
            const int c = (i - r * chunks) * 8;
            float xf[8], wf[8];
            aot::unpack8(aot::ld_cached16(p.x + static_cast<int64_t>(r) * p.ld_x + c), xf);
            aot::unpack8(aot::ld_cached16(p.norm_w + c), wf);
            const float scale = s.scale[r];
#pragma unroll
            for (int j = 0; j < 8; ++j) xf[j] = (wf[j] + p.norm_offset) * aot::round_bf16(xf[j] * scale);
            *reinterpret_cast<uint4*>(x_smem + r * x_stride + c) = aot::pack8(xf);
        }
        __syncthreads();
    }

    const int tiles = (p.n + kTileRows - 1) / kTileRows;
    const int units = tiles * p.splits;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float* vals = s.vals[warp];
    for (int u = blockIdx.x * kWarps + warp; u < units; u += gridDim.x * kWarps) {
        const int tile = u / p.splits;
        const int split = u - tile * p.splits;
        const int vrow = tile * kTileRows + g;
        const __nv_bfloat16* wlo = weight_row(p, vrow);
        const __nv_bfloat16* whi = weight_row(p, vrow + 8);
        const int k0 = split * p.k_per_split;
        const int k1 = min(p.k, k0 + p.k_per_split);
        const int chunks = (k1 - k0 + 31) / 32;
        const bool has_token = g < p.m;
        const __nv_bfloat16* xrow = kNormX ? x_smem + g * x_stride : p.x + static_cast<int64_t>(g) * p.ld_x;

        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c0 = 0; c0 < chunks; c0 += kUnroll) {
            uint4 lo[kUnroll], hi[kUnroll], xv[kUnroll];
#pragma unroll
            for (int j = 0; j < kUnroll; ++j) {
                const int kk = k0 + (c0 + j) * 32 + t * 8;
                const bool ok = c0 + j < chunks && kk < k1;
                lo[j] = (ok && wlo) ? aot::ld_stream16(wlo + kk) : zero;
                hi[j] = (ok && whi) ? aot::ld_stream16(whi + kk) : zero;
                if (ok && has_token) {
                    xv[j] = kNormX ? *reinterpret_cast<const uint4*>(xrow + kk) : aot::ld_cached16(xrow + kk);
                } else {
                    xv[j] = zero;
                }
            }
#pragma unroll
            for (int j = 0; j < kUnroll; ++j) aot::mma_chunk32(acc, lo[j], hi[j], xv[j]);
        }
        // acc: rows (g, g + 8) of the tile, tokens (2t, 2t + 1).
        const int group = tile * kTileRows / p.group_rows;
        if (p.splits == 1 && p.group_rows == kTileRows) {
            float(*tl)[kTileRows] = s.tile[warp];
            tl[2 * t][g] = acc[0];
            tl[2 * t + 1][g] = acc[1];
            tl[2 * t][g + 8] = acc[2];
            tl[2 * t + 1][g + 8] = acc[3];
            __syncwarp();
            for (int token = 0; token < p.m; ++token) epilogue(p, group, token, tl[token]);
            __syncwarp();
            continue;
        }
        const int row_lo = tile * kTileRows + g;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int token = 2 * t + (q & 1);
            const int row = row_lo + (q >> 1) * 8;
            if (token < p.m && row < p.n) p.ws[(static_cast<int64_t>(split) * p.m + token) * p.n + row] = acc[q];
        }
        __threadfence();
        __syncwarp();
        unsigned last = 0;
        if (lane == 0) {
            const int g0 = group * p.group_rows;
            const int rows_in_group = min(p.group_rows, p.n - g0);
            const unsigned arrivals = ((rows_in_group + kTileRows - 1) / kTileRows) * p.splits;
            last = atomicAdd(&p.counters[group], 1u) == arrivals - 1;
        }
        if (!__shfl_sync(0xffffffffu, last, 0)) continue;
        __threadfence();
        const int g0 = group * p.group_rows;
        const int rows_in_group = min(p.group_rows, p.n - g0);
        for (int token = 0; token < p.m; ++token) {
            for (int r = lane; r < p.group_rows; r += 32) {
                float sum = 0.0f;
                if (r < rows_in_group) {
                    for (int sp = 0; sp < p.splits; ++sp) {
                        sum += __ldcg(p.ws + (static_cast<int64_t>(sp) * p.m + token) * p.n + g0 + r);
                    }
                }
                vals[r] = sum;
            }
            __syncwarp();
            epilogue(p, group, token, vals);
            __syncwarp();
        }
        if (lane == 0) p.counters[group] = 0;
    }
}

}  // namespace aot_gemv

using namespace aot_gemv;

// x read from global memory (o_proj, down_proj, or any plain GEMV).
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_bf16(const GemvParams p) { gemv_body<false>(p); }

// x = RMSNorm(h) built in shared memory first (qkv, gate_up, lm_head).
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_norm_bf16(const GemvParams p) { gemv_body<true>(p); }
