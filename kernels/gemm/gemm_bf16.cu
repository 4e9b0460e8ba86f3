// Tensor-core GEMM for prefill:  C[M, N] = A[M, K] . W[N, K]^T
// A: activations, row-major with row stride lda; W: weights as Hugging Face stores them ([out,
// in], row stride ldw); C: row-major with row stride ldc, bf16 (one rounding of the fp32 sum) or
// fp32 (lm_head logits). fp32 accumulation with mma.sync m16n8k16 (sm_80 and later).
//
// CTA tile 128 x 256 x 32, 8 warps of 64 x 64, a 4-stage cp.async pipeline (96 KiB of shared
// memory: fits every target, 99 KiB on sm_86/89/120). Shared rows are 64 bytes (four 16-byte
// chunks); chunk c of row r sits at c ^ ((r >> 1) & 3), so the 8 rows an ldmatrix phase reads
// fall in 8 different 16-byte bank groups.
//
// Determinism: every output element is the sum over k of its own row of A and row of W, taken
// in the same order (k tiles of 32 from 0, two m16n8k16 steps each) by one thread of one CTA,
// whatever M is and wherever the row falls in a tile: the result is bitwise independent of M
// (the engine's prefill chunking) and of the launch. No split-K.
//
// Edges: M and N any size with N % 8 == 0, K % 8 == 0 (whole 16-byte chunks); chunks past M, N
// or K are zero-filled by cp.async (never read), outputs past M or N are not written.
#include "aot_common.cuh"
#include "aot_gemm_tile.cuh"
#include "aot_mma.cuh"

// Dynamic shared memory, declared at file scope: a declaration inside the anonymous namespace
// would carry a path-dependent name into the PTX, and the image would change with the folder.
extern __shared__ __align__(128) uint8_t gemm_bf16_smem[];

namespace {

constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kBK = 32;
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kGroupM = 8;  // CTAs walk 8 row tiles per column tile, for L2 reuse of W
constexpr int kATileBytes = kBM * kBK * 2;
constexpr int kStageBytes = (kBM + kBN) * kBK * 2;

// Byte offset of 16-byte chunk `c` (0..3) of row `r` in a [rows][32] bf16 tile.
__device__ __forceinline__ uint32_t swizzle(int r, int c) {
    return static_cast<uint32_t>(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

struct Swizzle64 {
    __device__ __forceinline__ static uint32_t offset(int r, int c) { return swizzle(r, c); }
};

template <typename OutT>
__device__ __forceinline__ void gemm_tn(OutT* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                                        const __nv_bfloat16* __restrict__ W, int M, int N, int K, int lda,
                                        int ldw, int ldc) {
    const uint32_t smem_base = aot::smem_addr(gemm_bf16_smem);
    const aot::TileOrigin origin = aot::gemm_tile_origin<kBM, kBN, kGroupM>(M, N, blockIdx.x);
    const int m0 = origin.m0;
    const int n0 = origin.n0;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp >> 2;  // 2 warps along M
    const int wn = warp & 3;   // 4 warps along N

    const aot::TileLoader<kBM, kBK / 8, kThreads, Swizzle64> a_loader(A, m0, M, lda, 0, tid);
    const aot::TileLoader<kBN, kBK / 8, kThreads, Swizzle64> b_loader(W, n0, N, ldw, kATileBytes, tid);
    const int k_tiles = (K + kBK - 1) / kBK;
    auto load_tile = [&](int kt) {
        const uint32_t stage = smem_base + static_cast<uint32_t>((kt % kStages) * kStageBytes);
        a_loader.load(stage, kt * kBK, K);
        b_loader.load(stage, kt * kBK, K);
    };

    float acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 8; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][nj][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < k_tiles) load_tile(s);
        aot::cp_async_commit();
    }

    // Per-lane ldmatrix rows: A x4 = rows lane % 16, chunk + lane / 16; B x4 = rows
    // (lane % 8) + 8 (lane / 16), chunk + (lane / 8) % 2 (two n8 tiles, both k halves).
    const int a_row = wm * 64 + (lane & 15);
    const int a_chunk = lane >> 4;
    const int b_row = wn * 64 + (lane & 7) + ((lane >> 4) << 3);
    const int b_chunk = (lane >> 3) & 1;

    for (int kt = 0; kt < k_tiles; ++kt) {
        aot::cp_async_wait<kStages - 2>();
        __syncthreads();
        // The stage refilled here was read in the previous iteration, which every warp has left.
        if (kt + kStages - 1 < k_tiles) load_tile(kt + kStages - 1);
        aot::cp_async_commit();

        const uint32_t a_base = smem_base + static_cast<uint32_t>((kt % kStages) * kStageBytes);
        const uint32_t b_base = a_base + kATileBytes;
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            uint32_t af[4][4];
            uint32_t bf[8][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) aot::ldmatrix_x4(af[mi], a_base + swizzle(a_row + mi * 16, kk * 2 + a_chunk));
#pragma unroll
            for (int nj = 0; nj < 4; ++nj) {
                uint32_t r[4];
                aot::ldmatrix_x4(r, b_base + swizzle(b_row + nj * 16, kk * 2 + b_chunk));
                bf[2 * nj][0] = r[0];
                bf[2 * nj][1] = r[1];
                bf[2 * nj + 1][0] = r[2];
                bf[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int nj = 0; nj < 8; ++nj) aot::mma_bf16_16816(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
        }
    }
    aot::cp_async_wait<0>();

    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = m0 + wm * 64 + mi * 16 + g + half * 8;
            if (row >= M) continue;
            OutT* c_row = C + static_cast<int64_t>(row) * ldc;
#pragma unroll
            for (int nj = 0; nj < 8; ++nj) {
                const int col = n0 + wn * 64 + nj * 8 + 2 * t;
                if (col < N) aot::store_pair(c_row + col, acc[mi][nj][2 * half], acc[mi][nj][2 * half + 1]);
            }
        }
    }
}

}  // namespace

// Grid: ceil(M / 128) * ceil(N / 256) blocks of 256 threads, 98304 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16(__nv_bfloat16* __restrict__ C, const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ W,
              int M, int N, int K, int lda, int ldw, int ldc) {
    gemm_tn(C, A, W, M, N, K, lda, ldw, ldc);
}

// The same product with fp32 output (no rounding to bf16): lm_head logits.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_f32out(float* __restrict__ C, const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ W,
                     int M, int N, int K, int lda, int ldw, int ldc) {
    gemm_tn(C, A, W, M, N, K, lda, ldw, ldc);
}
