// Pieces the two prefill GEMMs share (gemm_bf16.cu on mma.sync, gemm_bf16_sm90.cu on wgmma): the
// grouped order of output tiles, the cp.async loader of an operand tile, and the output stores.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "aot_mma.cuh"

namespace aot {

// Grouped tile order: CTA `pid` computes the kBM x kBN output tile at (m0, n0); consecutive CTAs
// walk kGroupM row tiles down one column tile, so a column tile of W is reused from L2.
struct TileOrigin {
    int m0, n0;
};

template <int kBM, int kBN, int kGroupM>
__device__ __forceinline__ TileOrigin gemm_tile_origin(int M, int N, int pid) {
    const int tiles_m = (M + kBM - 1) / kBM;
    const int tiles_n = (N + kBN - 1) / kBN;
    const int per_group = kGroupM * tiles_n;
    const int first_m = (pid / per_group) * kGroupM;
    const int group_rows = min(tiles_m - first_m, kGroupM);
    const int tm = first_m + (pid % per_group) % group_rows;
    const int tn = (pid % per_group) / group_rows;
    return {tm * kBM, tn * kBN};
}

// Copies k-slices of a [kRows][kChunks * 8] bf16 operand tile (rows row0.. of a row-major matrix,
// row stride ld) into shared memory with cp.async, 16 bytes a copy. Thread tid copies chunks
// q = tid + i * kThreads: row q / kChunks, chunk q % kChunks, so neighbouring threads read one
// row's contiguous bytes. Chunk (r, c) lands at dst_offset + Swizzle::offset(r, c). Rows at or
// past `rows` and chunks at or past K are zero-filled (nothing is read for them).
template <int kRows, int kChunks, int kThreads, typename Swizzle>
struct TileLoader {
    static constexpr int kPer = kRows * kChunks / kThreads;
    static_assert(kPer * kThreads == kRows * kChunks, "the threads share the tile's chunks evenly");

    const __nv_bfloat16* base;
    const __nv_bfloat16* src[kPer];
    uint32_t dst[kPer];
    bool row_ok[kPer];
    int k[kPer];

    __device__ __forceinline__ TileLoader(const __nv_bfloat16* matrix, int row0, int rows, int ld,
                                          uint32_t dst_offset, int tid)
        : base(matrix) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const int q = tid + i * kThreads;
            const int r = q / kChunks;
            const int c = q % kChunks;
            row_ok[i] = row0 + r < rows;
            src[i] = matrix + static_cast<int64_t>(row_ok[i] ? row0 + r : 0) * ld + c * 8;
            dst[i] = dst_offset + Swizzle::offset(r, c);
            k[i] = c * 8;
        }
    }

    // The slice of columns [k0, k0 + kChunks * 8) into the stage at shared address `stage`.
    __device__ __forceinline__ void load(uint32_t stage, int k0, int K) const {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const bool ok = row_ok[i] && k0 + k[i] < K;
            cp_async_16(stage + dst[i], ok ? src[i] + k0 : base, ok);
        }
    }
};

// Two adjacent outputs of a row: bf16 (one rounding each) or fp32.
__device__ __forceinline__ void store_pair(__nv_bfloat16* c, float v0, float v1) {
    *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(v0, v1);
}

__device__ __forceinline__ void store_pair(float* c, float v0, float v1) {
    *reinterpret_cast<float2*>(c) = make_float2(v0, v1);
}

}  // namespace aot
