// Decode GEMV on tensor cores, with the stages around a projection fused in:
//
//   y[m, n] = sum_k x[m, k] * W[n, k]        (W row-major [n, k] as Hugging Face stores it; m <= 8)
//
// One mma.m16n8k16 tile covers 16 weight rows x 8 tokens, so batches of 1 to 8 tokens cost the
// same weight traffic; every weight byte is read once with a 16-byte streaming load, eight 32-
// element chunks in flight per warp.
//
// Work comes in 16-row tiles, in one of two shapes (the host picks by the number of tiles):
//   wide    many tiles (gate_up, lm_head): each warp takes whole tiles, all of K, and runs the
//           epilogue itself: no barrier anywhere in the stream.
//   narrow  few tiles (qkv, o_proj, down): blocks take tiles in turn (at most two blocks an SM, so
//           the norm prologue is paid once per block), two at a time with four warps on each and
//           a last odd one with all eight; a tile's warps split K, then add their partial sums in
//           shared memory in warp order. (Pairs: a block with two tiles streams each warp's 20
//           chunks of qkv in three rounds of loads instead of four, and pays one barrier and
//           reduction instead of two.)
// Staged (the `_staged` narrow entries, for launches the host lets overlap the kernel before them
// with programmatic dependent launch): before its pdl_wait every lane copies its first weight
// chunks (kStagePlain or kStageNorm of 32 elements, both row halves) into a lane-private slot of
// shared memory with cp.async, so that they stream while the previous kernel still runs; the
// warp's first batch then takes them from there. Weights are never written by a kernel the
// decode step runs, so reading them before the wait is safe (src/ops/gemv.rs states the contract).
// The same chunks in the same order: the staged entries compute the same bits as the plain ones.
// Only qkv and o_proj stage, and only overlapped: otherwise the stage's shared memory takes L1
// that the streaming loads use and costs more than it hides.
// Either way a tile's result is complete inside one warp or one block: no workspace, and the
// order of every sum is fixed by the launch layout (the shapes and the SM count: whether a narrow
// tile is split four or eight ways depends on the block count), never by timing. A token's result
// never depends on the other tokens of the batch.
//
// The residual_norm epilogue is the one place blocks meet: each block, its tiles done, counts
// itself in `arrived` (one acq_rel atomic after a block barrier), and the last to arrive,
// which then sees every block's h and sums, adds each token's group sums in a fixed order, writes
// `bf16((w + offset) * bf16(h * rsqrt(ssq / n + eps)))` for every token and sets `arrived` back
// to zero for the next launch. Which block comes last changes nothing in the result.
//
// Prologue (the `_norm_` entries): x is the residual stream h; every block builds
// `bf16((w + offset) * bf16(h * rsqrt(ssq / k + eps)))` in shared memory, ssq being the per-group
// sums of squares the producer of h wrote. That fuses the RMSNorm before qkv, gate_up and lm_head.
//
// Epilogues (per 16-row group, every token):
//   store_bf16 / store_f32   y
//   store_parts              y's rows cut into up to four outputs (the first at out, the others at
//                            parts[i] from weight row part_start[i], part_ld[i] apart): one launch
//                            for projections that share their input (a DeltaNet layer's four)
//   residual                 h = bf16(h + bf16(y)); ssq[group] = sum h^2 (o_proj, down_proj)
//   residual_norm            residual, then out = RMSNorm(h) by the last block to finish (below):
//                            a layer's output projection, the add and the norm after it in one
//                            launch, for a consumer that reads x rather than h and its sums
//                            (plain-input entries only)
//   silu_mul                 act = bf16(bf16(silu(bf16(gate))) * bf16(up)); a group's first 8 rows
//                            are gate rows, the last 8 up rows (virtual rows, see pair_offset)
//   store_parts_conv         store_parts whose first part is a DeltaNet layer's conv channels
//                            [q | k | v] in a decode pass (one token per sequence): each value goes
//                            through the causal depthwise conv of width 4 over its sequence's conv
//                            state, then SiLU, in the instructions of the Triton module gdn_conv1d
//                            (so its bits), and the state shifts by the token. A (token, channel)
//                            is one lane's, so the state needs no ordering between blocks.
#include "aot_common.cuh"
#include "aot_mma.cuh"

// A named namespace: nvcc names anonymous-namespace symbols after a per-run unique id, which
// would make the PTX (and the lock) differ between builds.
namespace aot_gemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 16;
constexpr int kMaxTokens = 8;
constexpr int kUnroll = 8;
constexpr int kXPad = 32;  // shared-memory row padding (elements): spreads rows over the banks

constexpr int kStagePlain = 8;  // chunks staged per lane: all of the first batch
constexpr int kStageNorm = 6;   // less beside the norm kernels' x (the host stages only where two blocks fit an SM)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

enum Epilogue : int {
    kStoreBf16 = 0,
    kStoreF32 = 1,
    kResidual = 2,
    kSiluMul = 3,
    kStoreParts = 4,
    kResidualNorm = 5,
    kStorePartsConv = 6,
};
constexpr int kConvWidth = 4;  // store_parts_conv: the conv's taps (the state keeps the last 3 inputs)
constexpr int kMoreParts = 3;  // parts after the first

// Mirrored field for field by `GemvParams` in src/ops/gemv.rs (repr(C)).
struct GemvParams {
    const __nv_bfloat16* w;       // [rows, k]
    const __nv_bfloat16* x;       // [m][ld_x] input (the residual stream h in the norm variant)
    const float* ssq;             // norm: [ssq_groups][8] sums of squares of h
    const __nv_bfloat16* norm_w;  // norm: [k]
    void* out;                    // bf16 or f32 [m][ld_out]
    __nv_bfloat16* residual;      // residual: h [m][ld_res], updated in place
    float* ssq_out;               // residual: [n / 16][8]
    __nv_bfloat16* parts[kMoreParts];  // store_parts: the outputs of the later parts (null: unused)
    int n, k, m;
    int ld_x, ld_out, ld_res;
    int ssq_groups;
    float eps;
    float norm_offset;            // 0: w, 1: (1 + w)
    int epilogue;
    int pair_offset;              // > 0: the MLP width I; virtual rows pair gate and up rows
    int part_start[kMoreParts];   // store_parts: each later part's first weight row (a multiple of 16)
    int part_ld[kMoreParts];      // store_parts: its row stride
    int pad_;
    const __nv_bfloat16* out_norm_w;  // residual_norm: [n], the norm's weight
    __nv_bfloat16* normed;            // residual_norm: [m][ld_out] RMSNorm(h)
    int* arrived;                     // residual_norm: blocks arrived; zero between launches
    float out_eps;                    // residual_norm
    float out_norm_offset;            // residual_norm: 0: w, 1: (1 + w)
    const __nv_bfloat16* conv_w;      // store_parts_conv: [conv_channels][kConvWidth]
    __nv_bfloat16* conv_state;        // store_parts_conv: [slots][kConvWidth - 1][conv_channels]
    const int* conv_slots;            // store_parts_conv: [m] each token's state slot (distinct)
    const int* conv_has_state;        // store_parts_conv: [m] 0: a new sequence, its slot ignored
    int conv_channels;                // store_parts_conv: the first part's width
    int pad2_;
};

struct Shared {
    float tile[kWarps][kMaxTokens][kTileRows];  // a tile's result, per warp
    float red[kWarps][32][4];                   // narrow: each warp's partial fragment
    float scale[kMaxTokens];
    int last;  // residual_norm: this block arrived last
};

// The weight row behind virtual row `v`, or null past the end. With pair_offset (= I, the MLP
// width), tile t's first 8 rows map to gate rows 8t.., its last 8 to up rows I + 8t..; rows past I
// in the last tile are null (I need not be a multiple of 8).
__device__ __forceinline__ const __nv_bfloat16* weight_row(const GemvParams& p, int v) {
    if (v >= p.n) return nullptr;
    int row = v;
    if (p.pair_offset > 0) {
        const int half = kTileRows / 2;
        const int grp = v / kTileRows;
        const int r = v - grp * kTileRows;
        const int j = grp * half + (r < half ? r : r - half);
        if (j >= p.pair_offset) return nullptr;
        row = r < half ? j : p.pair_offset + j;
    }
    return p.w + static_cast<int64_t>(row) * p.k;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// store_parts_conv's conv and SiLU of one value from its weights, its three older inputs and the
// new one (all widened from bf16). Every operation is gdn_conv1d's PTX instruction (its fma chain
// from zero, the bf16 rounding, and x / (1 + ex2.approx(-x log2 e)) with div.full), so the result
// is that module's, bit for bit.
__device__ __forceinline__ float conv_silu(const float2& w01, const float2& w23, float s0, float s1, float s2,
                                           float x3) {
    float acc;
    asm("{\n\t"
        "fma.rn.f32 %0, %1, %5, 0f00000000;\n\t"
        "fma.rn.f32 %0, %2, %6, %0;\n\t"
        "fma.rn.f32 %0, %3, %7, %0;\n\t"
        "fma.rn.f32 %0, %4, %8, %0;\n\t"
        "}"
        : "=&f"(acc)
        : "f"(w01.x), "f"(w01.y), "f"(w23.x), "f"(w23.y), "f"(s0), "f"(s1), "f"(s2), "f"(x3));
    const float conv = aot::round_bf16(acc);
    float act;
    asm("{\n\t"
        ".reg .f32 n, e;\n\t"
        "sub.f32 n, 0f00000000, %1;\n\t"
        "mul.f32 n, n, 0f3FB8AA3B;\n\t"
        "ex2.approx.f32 e, n;\n\t"
        "add.f32 e, e, 0f3F800000;\n\t"
        "div.full.f32 %0, %1, e;\n\t"
        "}"
        : "=f"(act)
        : "f"(conv));
    return act;
}

// store_parts_conv on a tile of the first part (the conv channels): lane l takes channel n0 + l % 16
// for tokens l / 16, + 2, + 4, + 6. Every load (the channel's weights, the tokens' slots, then
// their states) is issued before any store, since a store could alias a later load as far as the
// compiler knows: two round trips whatever the token count, not one a token.
__device__ __forceinline__ void conv_tile(const GemvParams& p, int n0, int rows, const float (*t)[kTileRows],
                                          __nv_bfloat16* out, int ld, int col) {
    constexpr int kQ = kMaxTokens * kTileRows / 32;
    const int lane = threadIdx.x & 31;
    const int r = lane % kTileRows;
    if (r >= rows) return;
    const int64_t C = p.conv_channels;
    const int c = n0 + r;
    const uint2 wv = *reinterpret_cast<const uint2*>(p.conv_w + static_cast<int64_t>(c) * kConvWidth);
    int slot[kQ];
    bool has[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
        const int token = lane / kTileRows + 2 * q;
        const bool ok = token < p.m;
        slot[q] = ok ? p.conv_slots[token] : 0;
        has[q] = ok && p.conv_has_state[token] != 0;
    }
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
    __nv_bfloat16 s[kQ][kConvWidth - 1];
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
        const __nv_bfloat16* st = p.conv_state + static_cast<int64_t>(slot[q]) * (kConvWidth - 1) * C + c;
#pragma unroll
        for (int j = 0; j < kConvWidth - 1; ++j) s[q][j] = has[q] ? st[j * C] : zero;
    }
    const float2 w01 = aot::to_f32x2(*reinterpret_cast<const __nv_bfloat162*>(&wv.x));
    const float2 w23 = aot::to_f32x2(*reinterpret_cast<const __nv_bfloat162*>(&wv.y));
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
        const int token = lane / kTileRows + 2 * q;
        if (token >= p.m) continue;
        const __nv_bfloat16 x3 = __float2bfloat16_rn(t[token][r]);
        const float act = conv_silu(w01, w23, aot::to_f32(s[q][0]), aot::to_f32(s[q][1]), aot::to_f32(s[q][2]),
                                    aot::to_f32(x3));
        out[static_cast<int64_t>(token) * ld + col + r] = __float2bfloat16_rn(act);
        __nv_bfloat16* st = p.conv_state + static_cast<int64_t>(slot[q]) * (kConvWidth - 1) * C + c;
        st[0] = s[q][1];
        st[C] = s[q][2];
        st[2 * C] = x3;
    }
}

// The epilogue of one tile for every token, from its sums `t[token][row]`. One warp runs it; lanes
// cover (token, row) pairs so that all their loads are in flight together.
__device__ void epilogue(const GemvParams& p, int tile, const float (*t)[kTileRows]) {
    const int lane = threadIdx.x & 31;
    const int n0 = tile * kTileRows;
    const int rows = min(kTileRows, p.n - n0);
    switch (p.epilogue) {
        case kStoreBf16:
        case kStoreF32:
        case kStoreParts:
        case kStorePartsConv: {
            // The output holding this tile: parts start on tile boundaries, so a tile is in one.
            void* out = p.out;
            int ld = p.ld_out, col = n0;
            if (p.epilogue != kStoreBf16 && p.epilogue != kStoreF32) {
#pragma unroll
                for (int i = 0; i < kMoreParts; ++i) {
                    if (p.parts[i] != nullptr && n0 >= p.part_start[i]) {
                        out = p.parts[i];
                        ld = p.part_ld[i];
                        col = n0 - p.part_start[i];
                    }
                }
            }
            if (p.epilogue == kStorePartsConv && n0 < p.conv_channels) {
                conv_tile(p, n0, rows, t, reinterpret_cast<__nv_bfloat16*>(out), ld, col);
                break;
            }
#pragma unroll
            for (int q = 0; q < kMaxTokens * kTileRows / 32; ++q) {
                const int idx = lane + 32 * q;
                const int token = idx / kTileRows, r = idx % kTileRows;
                if (token < p.m && r < rows) {
                    const int64_t at = static_cast<int64_t>(token) * ld + col + r;
                    if (p.epilogue != kStoreF32) {
                        reinterpret_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(t[token][r]);
                    } else {
                        reinterpret_cast<float*>(out)[at] = t[token][r];
                    }
                }
            }
            break;
        }
        case kResidual:
        case kResidualNorm: {
            // Two tokens a pass: lanes 0-15 the rows of token 2q, lanes 16-31 those of token 2q + 1.
            float old[kMaxTokens / 2];
#pragma unroll
            for (int q = 0; q < kMaxTokens / 2; ++q) {
                const int token = 2 * q + (lane >> 4), r = lane & 15;
                old[q] = token < p.m && r < rows
                             ? aot::to_f32(p.residual[static_cast<int64_t>(token) * p.ld_res + n0 + r])
                             : 0.0f;
            }
#pragma unroll
            for (int q = 0; q < kMaxTokens / 2; ++q) {
                const int token = 2 * q + (lane >> 4), r = lane & 15;
                float sq = 0.0f;
                if (token < p.m && r < rows) {
                    const float nv = aot::round_bf16(aot::round_bf16(t[token][r]) + old[q]);
                    p.residual[static_cast<int64_t>(token) * p.ld_res + n0 + r] = __float2bfloat16_rn(nv);
                    sq = nv * nv;
                }
#pragma unroll
                for (int off = 8; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
                if ((lane & 15) == 0 && token < p.m) p.ssq_out[tile * kMaxTokens + token] = sq;
            }
            break;
        }
        case kSiluMul: {
            constexpr int half = kTileRows / 2;
#pragma unroll
            for (int q = 0; q < kMaxTokens * half / 32; ++q) {
                const int idx = lane + 32 * q;
                const int token = idx / half, j = idx % half;
                const int col = tile * half + j;
                if (token < p.m && col < p.pair_offset) {
                    const float gate = aot::round_bf16(t[token][j]);
                    const float up = aot::round_bf16(t[token][half + j]);
                    const float act = aot::round_bf16(silu(gate));
                    reinterpret_cast<__nv_bfloat16*>(p.out)[static_cast<int64_t>(token) * p.ld_out + col] =
                        __float2bfloat16_rn(act * up);
                }
            }
            break;
        }
        default:
            __trap();
    }
}

// The 16 weight loads of chunks [c0, c0 + kUnroll), then the mma of each against x. Chunk c0 + j
// comes from the lane's stage `st` (slots [j][lo, hi], 32 lanes apart) when j < kP.
template <bool kNormX, int kP>
__device__ __forceinline__ void chunk_batch(const GemvParams& p, const __nv_bfloat16* wlo, const __nv_bfloat16* whi,
                                            const __nv_bfloat16* xrow, bool has_token, int c0, int c_end,
                                            float (&acc)[4], const uint4* st) {
    const int t = (threadIdx.x & 31) & 3;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    // All sixteen weight loads first (they are what the stream waits on), then x chunk by chunk
    // as the mma needs it: fewer live registers, so every weight load stays in flight.
    uint4 lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
        const int kk = (c0 + j) * 32 + t * 8;
        const bool ok = c0 + j < c_end && kk < p.k;
        if (j < kP) {
            lo[j] = (ok && wlo) ? st[(2 * j) * 32] : zero;
            hi[j] = (ok && whi) ? st[(2 * j + 1) * 32] : zero;
        } else {
            lo[j] = (ok && wlo) ? aot::ld_stream16(wlo + kk) : zero;
            hi[j] = (ok && whi) ? aot::ld_stream16(whi + kk) : zero;
        }
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
        const int kk = (c0 + j) * 32 + t * 8;
        uint4 xv = zero;
        if (c0 + j < c_end && kk < p.k && has_token) {
            xv = kNormX ? *reinterpret_cast<const uint4*>(xrow + kk) : aot::ld_cached16(xrow + kk);
        }
        aot::mma_chunk32(acc, lo[j], hi[j], xv);
    }
}

// acc += the tile's rows (g, g + 8) times x over chunks [c_begin, c_end) of 32 elements. With a
// stage `st`, the first batch's first kP chunks come from it.
template <bool kNormX, int kP>
__device__ __forceinline__ void stream_chunks(const GemvParams& p, const __nv_bfloat16* wlo, const __nv_bfloat16* whi,
                                              const __nv_bfloat16* xrow, bool has_token, int c_begin, int c_end,
                                              float (&acc)[4], const uint4* st) {
    int c0 = c_begin;
    if (kP > 0 && st != nullptr && c0 < c_end) {
        chunk_batch<kNormX, kP>(p, wlo, whi, xrow, has_token, c0, c_end, acc, st);
        c0 += kUnroll;
    }
    for (; c0 < c_end; c0 += kUnroll) chunk_batch<kNormX, 0>(p, wlo, whi, xrow, has_token, c0, c_end, acc, nullptr);
}

// A narrow block's first tile for this warp and its slice of K, as the loop in gemv_body and
// narrow_tile take them: a pair's tile (four warps a tile) when the block has two, else its one
// tile (eight). It restates their arithmetic: change them together (tests/gpu_decode.rs compares
// every staged launch with the plain one, pairs and odd tiles alike, bit for bit).
__device__ __forceinline__ void narrow_first(const GemvParams& p, int& tile, int& c_begin, int& c_end) {
    const int warp = threadIdx.x >> 5;
    const int tiles = (p.n + kTileRows - 1) / kTileRows;
    const int chunks = (p.k + 31) / 32;
    const int stride = gridDim.x;
    const bool pair = static_cast<int>(blockIdx.x) + stride < tiles;
    const int group = pair ? kWarps / 2 : kWarps;
    tile = pair ? blockIdx.x + (warp / (kWarps / 2)) * stride : blockIdx.x;
    const int per = (chunks + group - 1) / group;
    c_begin = (warp % group) * per;
    c_end = min(chunks, c_begin + per);
}

// The lane's share of its warp's first kP chunks (narrow layout) copied into its stage by
// cp.async. Reads only the weights, nothing an earlier kernel wrote.
template <int kP>
__device__ __forceinline__ void stage_first(const GemvParams& p, uint4* st) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    int tile, c_begin, c_end;
    narrow_first(p, tile, c_begin, c_end);
    if (tile * kTileRows >= p.n) return;
    const __nv_bfloat16* wlo = weight_row(p, tile * kTileRows + g);
    const __nv_bfloat16* whi = weight_row(p, tile * kTileRows + g + 8);
#pragma unroll
    for (int j = 0; j < kP; ++j) {
        const int kk = (c_begin + j) * 32 + t * 8;
        const bool ok = c_begin + j < c_end && kk < p.k;
        if (ok && wlo) cp_async16(st + (2 * j) * 32, wlo + kk);
        if (ok && whi) cp_async16(st + (2 * j + 1) * 32, whi + kk);
    }
}

// The token's scale rsqrt(ssq / k + eps) into s.scale[token], for every token (warp r: token r).
__device__ __forceinline__ void norm_scales(const GemvParams& p, Shared& s) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    // Warp r sums token r's group sums: each lane a strided share (all its loads in flight
    // together), then the lanes in a fixed butterfly. One thread looping over the groups (160
    // for Qwen3-4B) was a chain of L2 round trips before any weight streamed.
    if (warp < p.m) {
        float sum = 0.0f;
#pragma unroll 8
        for (int i = lane; i < p.ssq_groups; i += 32) sum += p.ssq[i * kMaxTokens + warp];
        sum = aot::warp_sum(sum);
        if (lane == 0) s.scale[warp] = rsqrtf(sum / static_cast<float>(p.k) + p.eps);
    }
}

// Eight elements of a row of x: bf16((w + offset) * bf16(h * scale)), the RMSNorm as the model
// rounds it (w already widened to fp32).
__device__ __forceinline__ uint4 norm8(const uint4& h, const float (&w)[8], float scale, float offset) {
    float f[8];
    aot::unpack8(h, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = (w[j] + offset) * aot::round_bf16(f[j] * scale);
    return aot::pack8(f);
}

// x = RMSNorm(h) into shared memory (`x_smem`, rows `x_stride` apart).
//   passes (kAllRows false): four chunks of one row a thread at a time;
//   all rows (kAllRows true): a thread takes chunks tid and tid + 256 of every row, all of them
//     requested before the scales are read (one norm-weight load per chunk for all rows). At
//     eight rows that is one L2 round trip where the passes took three, and the requests overlap
//     the sums. The narrow kernel always takes it; the wide one (gate_up, lm_head) only from
//     `NORM_ALL_ROWS_MIN` rows (src/ops/gemv.rs), because at one row its extra registers cost
//     the wide kernel as much as the fewer round trips gain at eight.
// Both build the same x, element for element: which one ran never shows in the result.
template <bool kAllRows>
__device__ __forceinline__ void norm_prologue(const GemvParams& p, Shared& s, __nv_bfloat16* x_smem, int x_stride) {
    if constexpr (kAllRows) {
        constexpr int kPer = 2;
        const int chunks = p.k / 8;
        uint4 wv[kPer], xv[kPer][kMaxTokens];
        auto load = [&](int base) {
#pragma unroll
            for (int q = 0; q < kPer; ++q) {
                const int c = base + q * kThreads;
                if (c < chunks) {
                    wv[q] = aot::ld_cached16(p.norm_w + c * 8);
#pragma unroll
                    for (int r = 0; r < kMaxTokens; ++r) {
                        if (r < p.m) xv[q][r] = aot::ld_cached16(p.x + static_cast<int64_t>(r) * p.ld_x + c * 8);
                    }
                }
            }
        };
        load(threadIdx.x);
        norm_scales(p, s);
        __syncthreads();
        for (int base = threadIdx.x; base < chunks; base += kPer * kThreads) {
            if (base != static_cast<int>(threadIdx.x)) load(base);
#pragma unroll
            for (int q = 0; q < kPer; ++q) {
                const int c = base + q * kThreads;
                if (c >= chunks) break;
                float wf[8];
                aot::unpack8(wv[q], wf);
#pragma unroll
                for (int r = 0; r < kMaxTokens; ++r) {
                    if (r >= p.m) break;
                    *reinterpret_cast<uint4*>(x_smem + r * x_stride + c * 8) =
                        norm8(xv[q][r], wf, s.scale[r], p.norm_offset);
                }
            }
        }
    } else {
        norm_scales(p, s);
        __syncthreads();
        // Four 16-byte chunks per thread in flight: this runs before any weight streams.
        const int chunks = p.k / 8;
        const int total = p.m * chunks;
        for (int base = threadIdx.x; base < total; base += 4 * kThreads) {
            uint4 xv[4], wv[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = base + q * kThreads;
                if (i < total) {
                    const int r = i / chunks;
                    const int c = (i - r * chunks) * 8;
                    xv[q] = aot::ld_cached16(p.x + static_cast<int64_t>(r) * p.ld_x + c);
                    wv[q] = aot::ld_cached16(p.norm_w + c);
                }
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = base + q * kThreads;
                if (i >= total) break;
                const int r = i / chunks;
                const int c = (i - r * chunks) * 8;
                float wf[8];
                aot::unpack8(wv[q], wf);
                *reinterpret_cast<uint4*>(x_smem + r * x_stride + c) = norm8(xv[q], wf, s.scale[r], p.norm_offset);
            }
        }
    }
    __syncthreads();
}

// residual_norm's tail (see the top of the file), run by every block after its tiles: the last
// block to arrive writes normed = RMSNorm(h) for every token and resets the count.
__device__ void residual_norm_tail(const GemvParams& p, Shared& s) {
    __syncthreads();  // the block's h and sums stored
    if (threadIdx.x == 0) {
        // Release (the block's stores, ordered before by the barrier) and acquire (every earlier
        // block's, for the last one) in one atomic, as cooperative groups' grid barrier does.
        int before;
        asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(before) : "l"(p.arrived) : "memory");
        s.last = before == static_cast<int>(gridDim.x) - 1;
    }
    __syncthreads();
    if (!s.last) return;
    // Every block's h and sums are read through L2 (.cg): this SM's L1 may hold older lines.
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int chunks = p.n / 8;
    // A thread takes 16-byte chunks tid, tid + 256, ... of every token's row, all tokens' loads
    // of a chunk in flight together with its one norm-weight load.
    uint4 hv[kMaxTokens], wv;
    auto load = [&](int c) {
        wv = aot::ld_cached16(p.out_norm_w + c * 8);
#pragma unroll
        for (int r = 0; r < kMaxTokens; ++r) {
            if (r < p.m) hv[r] = __ldcg(reinterpret_cast<const uint4*>(p.residual + static_cast<int64_t>(r) * p.ld_res + c * 8));
        }
    };
    const int first = threadIdx.x;
    if (first < chunks) load(first);  // in flight while the scales are summed
    // Warp r adds token r's group sums: lane-strided shares, then a fixed butterfly.
    if (warp < p.m) {
        const int groups = (p.n + kTileRows - 1) / kTileRows;
        float sum = 0.0f;
#pragma unroll 4
        for (int i = lane; i < groups; i += 32) sum += __ldcg(p.ssq_out + i * kMaxTokens + warp);
        sum = aot::warp_sum(sum);
        if (lane == 0) s.scale[warp] = rsqrtf(sum / static_cast<float>(p.n) + p.out_eps);
    }
    __syncthreads();
    for (int c = first; c < chunks; c += kThreads) {
        if (c != first) load(c);
        float wf[8];
        aot::unpack8(wv, wf);
#pragma unroll
        for (int r = 0; r < kMaxTokens; ++r) {
            if (r >= p.m) break;
            *reinterpret_cast<uint4*>(p.normed + static_cast<int64_t>(r) * p.ld_out + c * 8) =
                norm8(hv[r], wf, s.scale[r], p.out_norm_offset);
        }
    }
    if (threadIdx.x == 0) *p.arrived = 0;
}

// A tile's sums `acc` (rows g and g + 8, tokens 2t and 2t + 1: the mma's C fragment) through the
// warp's tile buffer `tl` into the epilogue.
__device__ __forceinline__ void finish_tile(const GemvParams& p, int tile, const float (&acc)[4],
                                            float (*tl)[kTileRows]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    tl[2 * t][g] = acc[0];
    tl[2 * t + 1][g] = acc[1];
    tl[2 * t][g + 8] = acc[2];
    tl[2 * t + 1][g + 8] = acc[3];
    __syncwarp();
    epilogue(p, tile, tl);
}

// Narrow: one tile by a group of kGroup warps (this warp is slice `warp % kGroup` of K), the
// slices' sums added in warp order by the group's first warp, which runs the epilogue. Every warp
// of the block calls it (it holds the block's barriers).
template <bool kNormX, int kGroup, int kP>
__device__ __forceinline__ void narrow_tile(const GemvParams& p, Shared& s, int tile, const __nv_bfloat16* xrow,
                                            bool has_token, int chunks, const uint4* st) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int wi = warp % kGroup;
    const int per = (chunks + kGroup - 1) / kGroup;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int vrow = tile * kTileRows + g;
    stream_chunks<kNormX, kP>(p, weight_row(p, vrow), weight_row(p, vrow + 8), xrow, has_token, wi * per,
                              min(chunks, (wi + 1) * per), acc, st);
#pragma unroll
    for (int q = 0; q < 4; ++q) s.red[warp][lane][q] = acc[q];
    __syncthreads();
    if (wi == 0) {
#pragma unroll
        for (int w = 1; w < kGroup; ++w) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[q] += s.red[warp + w][lane][q];
        }
        finish_tile(p, tile, acc, s.tile[warp]);
    }
    __syncthreads();
}

template <bool kNormX, bool kNarrow, bool kAllRows = kNarrow, bool kStaged = false>
__device__ __forceinline__ void gemv_body(const GemvParams& p) {
    static_assert(!kStaged || kNarrow, "only the narrow layout stages");
    constexpr int kP = kStaged ? (kNormX ? kStageNorm : kStagePlain) : 0;
    extern __shared__ uint4 dyn_smem[];
    __shared__ Shared s;
    __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(dyn_smem);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int x_stride = kNormX ? p.k + kXPad : p.ld_x;
    // The stage follows x in dynamic shared memory: [warp][chunk][lo, hi][lane].
    uint4* st = reinterpret_cast<uint4*>(reinterpret_cast<char*>(dyn_smem) +
                                         (kNormX ? static_cast<size_t>(p.m) * x_stride * 2 : 0)) +
                warp * kP * 2 * 32 + lane;

    aot::pdl_launch_dependents();
    if constexpr (kP > 0) stage_first<kP>(p, st);
    aot::pdl_wait();

    if (kNormX) norm_prologue<kAllRows>(p, s, x_smem, x_stride);
    if constexpr (kP > 0) cp_async_wait_all();  // the lane's own copies: it alone reads its slots

    const int tiles = (p.n + kTileRows - 1) / kTileRows;
    const int chunks = (p.k + 31) / 32;
    const bool has_token = g < p.m;
    const __nv_bfloat16* xrow = kNormX ? x_smem + g * x_stride : p.x + static_cast<int64_t>(g) * p.ld_x;
    if constexpr (!kNarrow) {
        float(*tl)[kTileRows] = s.tile[warp];
        // Consecutive tiles go to consecutive blocks (tile = warp * blocks + block, then a stride of
        // every warp of the grid): each block, and so each SM, gets an even share of the tiles.
        for (int tile = warp * gridDim.x + blockIdx.x; tile < tiles; tile += gridDim.x * kWarps) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const int vrow = tile * kTileRows + g;
            stream_chunks<kNormX, 0>(p, weight_row(p, vrow), weight_row(p, vrow + 8), xrow, has_token, 0, chunks, acc,
                                     nullptr);
            finish_tile(p, tile, acc, tl);
            __syncwarp();
        }
    } else {
        // Narrow: the block takes tiles blockIdx.x, + gridDim.x, ...: two at a time, warps 0-3 on
        // the first and 4-7 on the second, then a last odd one with all eight warps.
        // The stage holds the first tile's first chunks (narrow_first).
        const int stride = gridDim.x;
        int tile = blockIdx.x;
        const uint4* first = kP > 0 ? st : nullptr;
        for (; tile + stride < tiles; tile += 2 * stride) {
            narrow_tile<kNormX, kWarps / 2, kP>(p, s, tile + (warp / (kWarps / 2)) * stride, xrow, has_token, chunks,
                                                first);
            first = nullptr;
        }
        if (tile < tiles) narrow_tile<kNormX, kWarps, kP>(p, s, tile, xrow, has_token, chunks, first);
    }
    // Plain-input entries only: the norm input reads h before other blocks' epilogues write it,
    // so no launch both normalises its input and adds into h (the host refuses it).
    if constexpr (!kNormX) {
        if (p.epilogue == kResidualNorm) residual_norm_tail(p, s);
    }
}

}  // namespace aot_gemv

using namespace aot_gemv;

// x read from global memory; warps take whole tiles (wide) or a block splits each of its tiles' K
// (narrow).
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_bf16(const GemvParams p) { gemv_body<false, false>(p); }
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_narrow_bf16(const GemvParams p) {
    gemv_body<false, true>(p);
}

// x = RMSNorm(h) built in shared memory first (qkv, gate_up, lm_head).
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_norm_bf16(const GemvParams p) {
    gemv_body<true, false>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_narrow_norm_bf16(const GemvParams p) {
    gemv_body<true, true>(p);
}
// The narrow kernels with each warp's first weights staged in shared memory before pdl_wait (see
// the top of the file); dynamic shared memory: x (norm) and then kWarps x kP x 2 x 32 x 16 bytes.
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_narrow_staged_bf16(const GemvParams p) {
    gemv_body<false, true, true, true>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 2) gemv_narrow_norm_staged_bf16(const GemvParams p) {
    gemv_body<true, true, true, true>(p);
}
// The wide kernel with the all-rows prologue, for batches of NORM_ALL_ROWS_MIN rows and more.
// Held to 112 registers (two blocks an SM either way; __maxnreg__ replaces __launch_bounds__, the
// two cannot go together): the tighter allocation measured faster at four and eight rows, the same bits.
extern "C" __global__ void __maxnreg__(112) gemv_norm_rows_bf16(const GemvParams p) {
    gemv_body<true, false, true>(p);
}
