// Prefill GEMM on Hopper's warpgroup MMA (sm_90a):  C[M, N] = A[M, K] . W[N, K]^T
// The same product, arguments and launch grid as gemm_bf16.cu (mma.sync, every target); on
// sm_90 the launcher (src/ops/gemm.rs) takes this one when its sm_90a image is loaded.
//
// CTA tile 128 x 256 x 64, 256 threads = two warpgroups, each 64 rows x all 256 columns with
// wgmma.m64n256k16 (128 fp32 accumulators a thread). Operands are staged by cp.async into
// K-major shared tiles with the 128-byte swizzle (aot_wgmma.cuh), four stages of 48 KiB:
//
//   iteration kt:  wait for tile kt (own copies), proxy fence, barrier
//                  refill the slot of tile kt - 2 with tile kt + 2   (both warpgroups have
//                      finished reading it: each waited for its group kt - 2 before the barrier)
//                  four wgmma on tile kt, commit, wait until only this group is in flight
//
// Determinism, as gemm_bf16.cu: each output element is its row of A times its row of W, summed
// by one warpgroup in k16 steps from k = 0 upward with no split-K, whatever M is: bitwise
// independent of the prefill chunking. The k16 steps are the ones mma.sync takes in gemm_bf16;
// whether the two instructions round a step the same way is the GPU test's question.
//
// Edges: N % 8 == 0, K % 8 == 0; chunks past M, N or K are zero-filled and contribute exact
// zeros; outputs past M or N are not written.
//
// Built for sm_90a only (the manifest's `targets`); the compute_80 PTX every module carries
// holds a body that traps, which the launcher never selects.
#include "aot_common.cuh"
#include "aot_gemm_tile.cuh"
#include "aot_mma.cuh"
#include "aot_wgmma.cuh"

// Dynamic shared memory at file scope (see gemm_bf16.cu); the kernel aligns it to 1024 bytes.
extern __shared__ __align__(1024) uint8_t gemm_sm90_smem[];

namespace aot_gemm_sm90 {

constexpr int kThreads = 256;

#if AOT_HAS_WGMMA
constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kBK = 64;
constexpr int kStages = 4;
constexpr int kGroupM = 8;
constexpr int kRowBytes = kBK * 2;                       // 128: one swizzled row
constexpr int kATileBytes = kBM * kRowBytes;             // 16 KiB
constexpr int kStageBytes = (kBM + kBN) * kRowBytes;     // 48 KiB
// Dynamic shared memory: the stages plus 1024 bytes of slack to align them (197632 bytes).

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled K-major tile.
struct Swizzle128 {
    __device__ __forceinline__ static uint32_t offset(int r, int c) {
        return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
    }
};

template <typename OutT>
__device__ __forceinline__ void gemm_tn_sm90(OutT* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                                             const __nv_bfloat16* __restrict__ W, int M, int N, int K, int lda,
                                             int ldw, int ldc) {
    const uint32_t smem_base = (aot::smem_addr(gemm_sm90_smem) + 1023u) & ~1023u;
    const aot::TileOrigin origin = aot::gemm_tile_origin<kBM, kBN, kGroupM>(M, N, blockIdx.x);
    const int m0 = origin.m0;
    const int n0 = origin.n0;

    const int tid = threadIdx.x;
    const int warpgroup = tid >> 7;

    // Eight neighbouring threads read one 128-byte row segment.
    const aot::TileLoader<kBM, kBK / 8, kThreads, Swizzle128> a_loader(A, m0, M, lda, 0, tid);
    const aot::TileLoader<kBN, kBK / 8, kThreads, Swizzle128> b_loader(W, n0, N, ldw, kATileBytes, tid);
    const int k_tiles = (K + kBK - 1) / kBK;
    auto load_tile = [&](int kt) {
        const uint32_t stage = smem_base + static_cast<uint32_t>((kt % kStages) * kStageBytes);
        a_loader.load(stage, kt * kBK, K);
        b_loader.load(stage, kt * kBK, K);
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

    // Two tiles ahead: the slot refilled at iteration kt held tile kt - 2.
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
        if (s < k_tiles) load_tile(s);
        aot::cp_async_commit();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
        aot::cp_async_wait<kStages - 3>();
        aot::fence_proxy_async_shared();
        __syncthreads();
        if (kt + kStages - 2 < k_tiles) load_tile(kt + kStages - 2);
        aot::cp_async_commit();

        const uint32_t a_base = smem_base + static_cast<uint32_t>((kt % kStages) * kStageBytes) +
                                static_cast<uint32_t>(warpgroup * 64 * kRowBytes);
        const uint32_t b_base = smem_base + static_cast<uint32_t>((kt % kStages) * kStageBytes) + kATileBytes;
        aot::wgmma_pin(acc);
        aot::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            aot::wgmma_m64n256k16_bf16(acc, aot::wgmma_desc_sw128(a_base + kk * 32),
                                       aot::wgmma_desc_sw128(b_base + kk * 32));
        }
        aot::wgmma_commit();
        aot::wgmma_wait<1>();
        aot::wgmma_pin(acc);
    }
    aot::wgmma_wait<0>();
    aot::wgmma_pin(acc);
    aot::cp_async_wait<0>();

    // Accumulator layout (m64nNk16, fp32): warp w of the warpgroup holds rows 16w..16w+15; for
    // each 8-column block j, acc[4j], acc[4j+1] = (row g, columns 8j+2t, +1), acc[4j+2],
    // acc[4j+3] = (row g+8, the same columns), g = lane / 4, t = lane % 4.
    const int lane = tid & 31;
    const int warp_in_group = (tid >> 5) & 3;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = m0 + warpgroup * 64 + warp_in_group * 16 + g + half * 8;
        if (row >= M) continue;
        OutT* c_row = C + static_cast<int64_t>(row) * ldc;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
            const int col = n0 + j * 8 + 2 * t;
            if (col < N) aot::store_pair(c_row + col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
    }
}
#else
// Not sm_90a (the compute_80 PTX): no wgmma. The launcher never selects this image.
template <typename OutT>
__device__ __forceinline__ void gemm_tn_sm90(OutT*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int,
                                             int, int) {
    __trap();
}
#endif

}  // namespace aot_gemm_sm90

using namespace aot_gemm_sm90;

// Grid: ceil(M / 128) * ceil(N / 256) blocks of 256 threads, 197632 bytes of dynamic shared
// memory.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_sm90(__nv_bfloat16* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                   const __nv_bfloat16* __restrict__ W, int M, int N, int K, int lda, int ldw, int ldc) {
    gemm_tn_sm90(C, A, W, M, N, K, lda, ldw, ldc);
}

// The same product with fp32 output (no rounding to bf16): lm_head logits.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    gemm_bf16_sm90_f32out(float* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                          const __nv_bfloat16* __restrict__ W, int M, int N, int K, int lda, int ldw, int ldc) {
    gemm_tn_sm90(C, A, W, M, N, K, lda, ldw, ldc);
}
