// EXPERIMENT: host launcher of the ring GEMV (gemv_ring.cu) for decode-chain (--ring OPS).
#include "gemv_ring.cu"
#include "ops.h"

#include <algorithm>
#include <cstdio>


using namespace aot_gemv_ring;
#ifdef RING_TMA_2D
#include <cudaTypedefs.h>
#include <map>
#include <utility>

// The tensor map of a weight matrix [rows][k] with boxes of [box_rows][256], made once.
static CUtensorMap weight_map(const void* w, int rows, int k, int box_rows) {
    static std::map<std::pair<const void*, int>, CUtensorMap> cache;
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    auto key = std::make_pair(w, box_rows);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            fprintf(stderr, "ring: cuTensorMapEncodeTiled not found\n");
            exit(1);
        }
    }
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    cuuint32_t box[2] = {(cuuint32_t)kBoxCols, (cuuint32_t)box_rows};
    cuuint32_t es[2] = {1, 1};
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box, es,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "ring: cuTensorMapEncodeTiled failed (%d) for rows %d k %d box rows %d\n", (int)r, rows, k,
                box_rows);
        exit(1);
    }
    cache[key] = m;
    return m;
}
#endif

int g_ring_budget = 98 * 1024;  // dynamic shared memory a block may take (two blocks an SM)
int g_ring_slots_max = kMaxSlots;
volatile int* g_ring_dbg = nullptr;  // host-mapped trace for the check (set by main)

// Launches the ring kernel for `a`; returns the sums-of-squares groups a residual launch wrote
// (grid x tiles a block), else 0.
int launch_gemv_ring(const GemvArgs& a, int sm, cudaStream_t s) {
    RingParams p{};
    p.w = static_cast<const __nv_bfloat16*>(a.w);
    p.x = static_cast<const __nv_bfloat16*>(a.x);
    p.ssq = a.ssq;
    p.norm_w = static_cast<const __nv_bfloat16*>(a.norm_w);
    p.out = a.out;
    p.residual = static_cast<__nv_bfloat16*>(a.residual);
    p.ssq_out = a.ssq_out;
    const bool pairs = a.epilogue == kSiluMul;
    p.n = pairs ? 2 * a.pair_offset : a.n;
    p.k = a.k;
    p.m = a.m;
    p.ld_x = a.ld_x;
    p.ld_out = a.ld_out;
    p.ld_res = a.ld_res;
    p.ssq_groups = a.ssq_groups;
    p.eps = a.eps;
    p.norm_offset = 0.0f;
    p.epilogue = a.epilogue;
    p.pair_offset = pairs ? a.pair_offset : 0;
    const int units = pairs ? a.pair_offset : a.n;
    const int per = pairs ? kTileRows / 2 : kTileRows;
#ifdef RING_TMA_2D
    p.tiles_total = (units + per - 1) / per;
    const int grid = std::min(sm, p.tiles_total);
    p.max_tiles = (p.tiles_total + grid - 1) / grid;
    p.tmap = weight_map(a.w, pairs ? 2 * a.pair_offset : a.n, a.k, pairs ? kTileRows / 2 : kTileRows);
#else
    const int grid = std::min(sm, units);
    const int most = (units + grid - 1) / grid;
    p.max_tiles = (most + per - 1) / per;
#endif
    const bool norm = a.norm_w != nullptr;
    const size_t x_bytes = norm ? ((size_t)a.m * (a.k + kXPad) * 2 + 127) / 128 * 128 : 0;
    int slots = (int)((g_ring_budget - 128 - (long)x_bytes) / kSlotBytes);
    slots = std::min(slots, g_ring_slots_max);
    if (slots < 2) {
        fprintf(stderr, "ring: %d slots at k %d m %d\n", slots, a.k, a.m);
        exit(1);
    }
    p.slots = slots;
    p.dbg = g_ring_dbg;
    if (g_ring_dbg) {
        for (int i = 0; i < grid * 16; ++i) g_ring_dbg[i] = -7;
        printf("ring launch: grid %d slots %d smem %zu max_tiles %d k %d n %d m %d epilogue %d\n", grid, slots,
               x_bytes + (size_t)slots * kSlotBytes, p.max_tiles, p.k, p.n, p.m, p.epilogue);
    }
    const size_t smem = x_bytes + (size_t)slots * kSlotBytes + 128;  // + alignment of the ring
    launch(norm ? gemv_ring_norm_bf16 : gemv_ring_bf16, dim3(grid), dim3(kThreads), smem, s, p);
    return a.epilogue == kResidual ? grid * p.max_tiles : 0;
}
