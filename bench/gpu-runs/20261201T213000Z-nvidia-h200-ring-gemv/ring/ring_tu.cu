// EXPERIMENT: host launcher of the ring GEMV (gemv_ring.cu) for decode-chain (--ring OPS).
#include "gemv_ring.cu"
#include "ops.h"

#include <algorithm>
#include <cstdio>

using namespace aot_gemv_ring;

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
    const int grid = std::min(sm, units);
    const int most = (units + grid - 1) / grid;
    p.max_tiles = (most + per - 1) / per;
    const bool norm = a.norm_w != nullptr;
    const size_t x_bytes = norm ? ((size_t)a.m * (a.k + kXPad) * 2 + 127) / 128 * 128 : 0;
    int slots = (int)((g_ring_budget - (long)x_bytes) / kSlotBytes);
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
    const size_t smem = x_bytes + (size_t)slots * kSlotBytes;
    launch(norm ? gemv_ring_norm_bf16 : gemv_ring_bf16, dim3(grid), dim3(kThreads), smem, s, p);
    return a.epilogue == kResidual ? grid * p.max_tiles : 0;
}
