// EXPERIMENT (decode-chain only, not in the manifest): decode GEMV whose weights stream through a
// shared-memory ring filled by bulk copies (cp.async.bulk, sm_90+), one block an SM.
//
//   y[m, n] = sum_k x[m, k] * W[n, k]        (m <= 8)
//
// A producer warp copies 16-row x 512-element stages of W into a ring of `slots` slots (one
// bulk copy per row, completion counted on the slot's mbarrier); eight consumer warps take the
// stages in turn (stage s of a tile: warp s % 8), multiply them against x on tensor cores and give
// the slot back. The producer reads nothing an earlier kernel wrote, so it never waits for the
// previous kernel (no griddepcontrol.wait): under programmatic launch it fills the ring while that
// kernel drains. Rows are dealt evenly to the blocks (row granularity, not 16-row tiles); a block's
// rows are cut into tiles of at most 16 (at most 8 gate/up pairs under silu_mul), as even as can be.
// A tile's sums are added in warp order: the bits depend on the shapes and the grid, never timing.
#include "aot_common.cuh"
#include "aot_mma.cuh"
#ifdef RING_TMA_2D
#include <cuda.h>  // CUtensorMap
#endif

namespace aot_gemv_ring {

constexpr int kCWarps = 8;                      // consumer warps
constexpr int kThreads = (kCWarps + 1) * 32;    // + one producer warp
constexpr int kTileRows = 16;
constexpr int kMaxTokens = 8;
#ifndef RING_STAGE_K
#define RING_STAGE_K 512
#endif
constexpr int kStageK = RING_STAGE_K;           // elements of K a stage holds per row
#ifdef RING_TMA_2D
// 2-D tensor-map variant: a stage is kStageK / 256 boxes of [16 rows][256 columns], dense (the
// tensor copy's layout without swizzle), one request a box (two of 8 rows under silu_mul).
constexpr int kBoxCols = 256;
constexpr int kBoxBytes = kTileRows * kBoxCols * 2;
constexpr int kSlotBytes = (kStageK / kBoxCols) * kBoxBytes;
static_assert(kStageK % kBoxCols == 0, "whole boxes a stage");
__device__ __forceinline__ int stage_offset(int row, int col) {
    return (col / kBoxCols) * kBoxBytes + row * (kBoxCols * 2) + (col % kBoxCols) * 2;
}
#else
constexpr int kRowStride = kStageK * 2 + 64;    // bytes: rows 64 mod 128 apart, no bank conflicts
constexpr int kSlotBytes = kTileRows * kRowStride;
__device__ __forceinline__ int stage_offset(int row, int col) { return row * kRowStride + col * 2; }
#endif
constexpr int kMaxSlots = 8;
constexpr int kXPad = 32;
constexpr int kChunksPerWarp = kStageK / 32 / kCWarps;  // of a stage's 32-element chunks
static_assert(kChunksPerWarp * 32 * kCWarps == kStageK, "a stage splits evenly over the consumer warps");

enum Epilogue : int { kStoreBf16 = 0, kStoreF32 = 1, kResidual = 2, kSiluMul = 3 };

struct RingParams {
    const __nv_bfloat16* w;       // [rows, k]
    const __nv_bfloat16* x;       // [m][ld_x] (the residual stream h under the norm prologue)
    const float* ssq;             // norm: [ssq_groups][8]
    const __nv_bfloat16* norm_w;  // norm: [k]
    void* out;
    __nv_bfloat16* residual;
    float* ssq_out;               // residual: [gridDim.x * max_tiles][8]
    int n, k, m;
    int ld_x, ld_out, ld_res;
    int ssq_groups;
    float eps;
    float norm_offset;
    int epilogue;
    int pair_offset;              // silu_mul: I (units are gate/up pairs)
    int slots;
    int max_tiles;                // residual: ssq groups per block
    int pad_;
    volatile int* dbg;            // debug trace (host-mapped) or null: [block][16]
#ifdef RING_TMA_2D
    int tiles_total;              // 16-row tiles (8 pairs under silu_mul), dealt evenly to the blocks
    int pad2_[13];
    CUtensorMap tmap;             // W as [rows][k], box [16 or 8 rows][256]
#endif
};

struct Tile {
    int base;   // first unit (row, or pair)
    int count;  // units
};

__device__ __forceinline__ int units(const RingParams& p) { return p.pair_offset > 0 ? p.pair_offset : p.n; }
__device__ __forceinline__ int per_tile(const RingParams& p) { return p.pair_offset > 0 ? kTileRows / 2 : kTileRows; }

__device__ __forceinline__ void block_range(const RingParams& p, int& u0, int& u1, int& tiles) {
#ifdef RING_TMA_2D
    // Whole aligned tiles: block b takes tiles [b T / G, (b + 1) T / G).
    {
        const int T = per_tile(p);
        const int64_t tt = p.tiles_total;
        const int t0 = static_cast<int>(tt * blockIdx.x / gridDim.x);
        const int t1 = static_cast<int>(tt * (blockIdx.x + 1) / gridDim.x);
        u0 = t0 * T;
        u1 = min(units(p), t1 * T);
        tiles = t1 - t0;
        return;
    }
#endif
    const int64_t u = units(p);
    u0 = static_cast<int>(u * blockIdx.x / gridDim.x);
    u1 = static_cast<int>(u * (blockIdx.x + 1) / gridDim.x);
    const int T = per_tile(p);
    tiles = (u1 - u0 + T - 1) / T;
}

__device__ __forceinline__ Tile tile_at(const RingParams& p, int u0, int u1, int tiles, int t) {
#ifdef RING_TMA_2D
    (void)tiles;
    const int T = per_tile(p);
    const int a = u0 + t * T;
    return Tile{a, min(u1, a + T) - a};
#else
    (void)p;
    const int r = u1 - u0;
    const int a = u0 + static_cast<int>(static_cast<int64_t>(r) * t / tiles);
    const int b = u0 + static_cast<int>(static_cast<int64_t>(r) * (t + 1) / tiles);
    return Tile{a, b - a};
#endif
}

// The weight row behind tile row r (0..15), or -1.
__device__ __forceinline__ int tile_row(const RingParams& p, const Tile& tl, int r) {
    if (p.pair_offset > 0) {
        const int j = r < 8 ? r : r - 8;
        if (j >= tl.count) return -1;
        return r < 8 ? tl.base + j : p.pair_offset + tl.base + j;
    }
    return r < tl.count ? tl.base + r : -1;
}

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

#ifdef RING_TMA_2D
__device__ __forceinline__ void tensor_copy(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
        : "memory");
}
#endif

// The consumer warps' barrier (named barrier 1; the producer never takes part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kCWarps * 32) : "memory"); }

__device__ __forceinline__ uint4 lds16(const char* ptr) { return *reinterpret_cast<const uint4*>(ptr); }

__device__ __forceinline__ uint4 norm8(const uint4& h, const float (&w)[8], float scale, float offset) {
    float f[8];
    aot::unpack8(h, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = (w[j] + offset) * aot::round_bf16(f[j] * scale);
    return aot::pack8(f);
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

struct Shared {
    uint64_t full[kMaxSlots];
    uint64_t empty[kMaxSlots];
    float red[2][kCWarps][32][4];
    float tile[kCWarps][kMaxTokens][kTileRows];
    float scale[kMaxTokens];
};

// The epilogue of one tile from its sums t[token][r]; one warp.
__device__ void epilogue(const RingParams& p, const Tile& tl, int group, const float (*t)[kTileRows]) {
    const int lane = threadIdx.x & 31;
    switch (p.epilogue) {
        case kStoreBf16:
        case kStoreF32:
#pragma unroll
            for (int q = 0; q < kMaxTokens * kTileRows / 32; ++q) {
                const int idx = lane + 32 * q;
                const int token = idx / kTileRows, r = idx % kTileRows;
                if (token < p.m && r < tl.count) {
                    const int64_t at = static_cast<int64_t>(token) * p.ld_out + tl.base + r;
                    if (p.epilogue == kStoreBf16) {
                        reinterpret_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(t[token][r]);
                    } else {
                        reinterpret_cast<float*>(p.out)[at] = t[token][r];
                    }
                }
            }
            break;
        case kResidual: {
            float old[kMaxTokens / 2];
#pragma unroll
            for (int q = 0; q < kMaxTokens / 2; ++q) {
                const int token = 2 * q + (lane >> 4), r = lane & 15;
                old[q] = token < p.m && r < tl.count
                             ? aot::to_f32(p.residual[static_cast<int64_t>(token) * p.ld_res + tl.base + r])
                             : 0.0f;
            }
#pragma unroll
            for (int q = 0; q < kMaxTokens / 2; ++q) {
                const int token = 2 * q + (lane >> 4), r = lane & 15;
                float sq = 0.0f;
                if (token < p.m && r < tl.count) {
                    const float nv = aot::round_bf16(aot::round_bf16(t[token][r]) + old[q]);
                    p.residual[static_cast<int64_t>(token) * p.ld_res + tl.base + r] = __float2bfloat16_rn(nv);
                    sq = nv * nv;
                }
#pragma unroll
                for (int off = 8; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
                if ((lane & 15) == 0 && token < p.m) p.ssq_out[group * kMaxTokens + token] = sq;
            }
            break;
        }
        case kSiluMul: {
            constexpr int half = kTileRows / 2;
#pragma unroll
            for (int q = 0; q < kMaxTokens * half / 32; ++q) {
                const int idx = lane + 32 * q;
                const int token = idx / half, j = idx % half;
                if (token < p.m && j < tl.count) {
                    const float gate = aot::round_bf16(t[token][j]);
                    const float up = aot::round_bf16(t[token][half + j]);
                    const float act = aot::round_bf16(silu(gate));
                    reinterpret_cast<__nv_bfloat16*>(p.out)[static_cast<int64_t>(token) * p.ld_out + tl.base + j] =
                        __float2bfloat16_rn(act * up);
                }
            }
            break;
        }
        default:
            __trap();
    }
}

template <bool kNormX>
__device__ __forceinline__ void ring_body(const RingParams& p) {
    extern __shared__ __align__(128) char dyn[];
    __shared__ Shared s;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int x_stride = kNormX ? p.k + kXPad : p.ld_x;
    const size_t x_bytes = kNormX ? (static_cast<size_t>(p.m) * x_stride * 2 + 127) / 128 * 128 : 0;
    __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(dyn);
    // Tensor copies want 128-byte aligned destinations (the host adds 128 bytes for this).
    char* ring = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(dyn + x_bytes) + 127) & ~static_cast<uintptr_t>(127));
    const int S = p.slots;

    int u0, u1, tiles;
    block_range(p, u0, u1, tiles);
    const int ns = (p.k + kStageK - 1) / kStageK;
    const int total = tiles * ns;

    if (threadIdx.x == 0) {
        for (int j = 0; j < S; ++j) {
            mbar_init(&s.full[j], 1);
            mbar_init(&s.empty[j], kCWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    aot::pdl_launch_dependents();

    if (warp == kCWarps) {
        // Producer: weights only, nothing an earlier kernel wrote (no pdl_wait).
        for (int i = 0; i < total; ++i) {
            const int slot = i % S;
            const int use = i / S;
            if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 0] = 2 * i;
            if (use > 0) mbar_wait(&s.empty[slot], (use - 1) & 1);
            if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 0] = 2 * i + 1;
            const Tile tl = tile_at(p, u0, u1, tiles, i / ns);
            const int k0 = (i % ns) * kStageK;
            const int len = min(kStageK, p.k - k0);
#ifdef RING_TMA_2D
            // One request a box: [16 rows][256] (plain) or [8 gate rows] and [8 up rows] (pairs),
            // full boxes counted (rows past the matrix come as zeros).
            const int boxes = (len + kBoxCols - 1) / kBoxCols;
            if (lane == 0) {
                mbar_arrive_expect_tx(&s.full[slot], boxes * kBoxBytes);
                char* dst = ring + static_cast<size_t>(slot) * kSlotBytes;
                for (int b = 0; b < boxes; ++b) {
                    const int col = k0 + b * kBoxCols;
                    if (p.pair_offset > 0) {
                        tensor_copy(dst + b * kBoxBytes, &p.tmap, col, tl.base, &s.full[slot]);
                        tensor_copy(dst + b * kBoxBytes + kBoxBytes / 2, &p.tmap, col, p.pair_offset + tl.base,
                                    &s.full[slot]);
                    } else {
                        tensor_copy(dst + b * kBoxBytes, &p.tmap, col, tl.base, &s.full[slot]);
                    }
                }
            }
            __syncwarp();
#else
            const int row = lane < kTileRows ? tile_row(p, tl, lane) : -1;
            const unsigned valid = __popc(__ballot_sync(0xffffffffu, row >= 0));
            if (lane == 0) mbar_arrive_expect_tx(&s.full[slot], valid * len * 2);
            __syncwarp();
            if (row >= 0) {
                bulk_copy(ring + static_cast<size_t>(slot) * kSlotBytes + lane * kRowStride,
                          p.w + static_cast<int64_t>(row) * p.k + k0, len * 2, &s.full[slot]);
            }
#endif
        }
        return;
    }

    // Consumers.
    if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 1 + warp] = -1;
    aot::pdl_wait();
    if constexpr (kNormX) {
        if (warp < p.m) {
            float sum = 0.0f;
            for (int i = lane; i < p.ssq_groups; i += 32) sum += p.ssq[i * kMaxTokens + warp];
            sum = aot::warp_sum(sum);
            if (lane == 0) s.scale[warp] = rsqrtf(sum / static_cast<float>(p.k) + p.eps);
        }
        consumers_sync();
        const int chunks = p.k / 8;
        const int all = p.m * chunks;
        for (int base = threadIdx.x; base < all; base += 4 * kCWarps * 32) {
            uint4 xv[4], wv[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = base + q * kCWarps * 32;
                if (i < all) {
                    const int r = i / chunks;
                    const int c = (i - r * chunks) * 8;
                    xv[q] = aot::ld_cached16(p.x + static_cast<int64_t>(r) * p.ld_x + c);
                    wv[q] = aot::ld_cached16(p.norm_w + c);
                }
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = base + q * kCWarps * 32;
                if (i >= all) break;
                const int r = i / chunks;
                const int c = (i - r * chunks) * 8;
                float wf[8];
                aot::unpack8(wv[q], wf);
                *reinterpret_cast<uint4*>(x_smem + r * x_stride + c) = norm8(xv[q], wf, s.scale[r], p.norm_offset);
            }
        }
        consumers_sync();
    }

    const int g = lane >> 2;
    const int t = lane & 3;
    const bool has_token = g < p.m;
    const __nv_bfloat16* xrow = kNormX ? x_smem + g * x_stride : p.x + static_cast<int64_t>(g) * p.ld_x;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int ti = 0; ti < tiles; ++ti) {
        const Tile tl = tile_at(p, u0, u1, tiles, ti);
        const bool lo_ok = tile_row(p, tl, g) >= 0;
        const bool hi_ok = tile_row(p, tl, g + 8) >= 0;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        // Every consumer warp takes every stage in order (a warp waiting on a slot two uses ahead
        // would read a parity that says done), chunks 2w and 2w + 1 of its 16.
        for (int ks = 0; ks < ns; ++ks) {
            const int i = ti * ns + ks;
            const int slot = i % S;
            const int k0 = ks * kStageK;
            const int len = min(kStageK, p.k - k0);
            const char* st = ring + static_cast<size_t>(slot) * kSlotBytes;
            uint4 xv[kChunksPerWarp];
#pragma unroll
            for (int j = 0; j < kChunksPerWarp; ++j) {
                const int kk = (warp * kChunksPerWarp + j) * 32 + t * 8;
                xv[j] = has_token && kk < len ? (kNormX ? *reinterpret_cast<const uint4*>(xrow + k0 + kk)
                                                        : aot::ld_cached16(xrow + k0 + kk))
                                              : zero;
            }
            if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 1 + warp] = 1000 + 2 * i;
            mbar_wait(&s.full[slot], (i / S) & 1);
            if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 1 + warp] = 1000 + 2 * i + 1;
#pragma unroll
            for (int j = 0; j < kChunksPerWarp; ++j) {
                const int kk = (warp * kChunksPerWarp + j) * 32 + t * 8;
                if (kk < len) {
                    const uint4 lo = lo_ok ? lds16(st + stage_offset(g, kk)) : zero;
                    const uint4 hi = hi_ok ? lds16(st + stage_offset(g + 8, kk)) : zero;
                    aot::mma_chunk32(acc, lo, hi, xv[j]);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&s.empty[slot]);
        }
        if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 1 + warp] = 100000 + ti;
        float(*red)[32][4] = s.red[ti & 1];
#pragma unroll
        for (int q = 0; q < 4; ++q) red[warp][lane][q] = acc[q];
        consumers_sync();
        if (warp == ti % kCWarps) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[q] = red[0][lane][q];
#pragma unroll
            for (int w = 1; w < kCWarps; ++w) {
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[q] += red[w][lane][q];
            }
            float(*tb)[kTileRows] = s.tile[warp];
            tb[2 * t][g] = acc[0];
            tb[2 * t + 1][g] = acc[1];
            tb[2 * t][g + 8] = acc[2];
            tb[2 * t + 1][g + 8] = acc[3];
            __syncwarp();
            epilogue(p, tl, blockIdx.x * p.max_tiles + ti, tb);
            __syncwarp();
        }
    }
    if (p.dbg && lane == 0) p.dbg[blockIdx.x * 16 + 1 + warp] = 999999;
    // Residual: the groups this block has no tile for hold zero.
    if (p.epilogue == kResidual && warp == 0) {
        for (int i = tiles * kMaxTokens + lane; i < p.max_tiles * kMaxTokens; i += 32) {
            p.ssq_out[static_cast<int64_t>(blockIdx.x) * p.max_tiles * kMaxTokens + i] = 0.0f;
        }
    }
}

}  // namespace aot_gemv_ring

#ifdef RING_TMA_2D
#define RING_PARAM const __grid_constant__ aot_gemv_ring::RingParams p
#else
#define RING_PARAM const aot_gemv_ring::RingParams p
#endif
extern "C" __global__ void __launch_bounds__(aot_gemv_ring::kThreads, 2) gemv_ring_bf16(RING_PARAM) {
    aot_gemv_ring::ring_body<false>(p);
}
extern "C" __global__ void __launch_bounds__(aot_gemv_ring::kThreads, 2)
    gemv_ring_norm_bf16(RING_PARAM) {
    aot_gemv_ring::ring_body<true>(p);
}
