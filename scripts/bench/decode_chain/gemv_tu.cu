#include "kernels/gemv/gemv.cu"
#include "ops.h"

#include <cstdio>
#include <cstdlib>

// Mirrors gemv_shape() in src/ops/gemv.rs.
static void shape(int n, int sm, bool* narrow, int* blocks) {
    const int tiles = (n + 15) / 16;
    if (tiles >= 8 * sm) {
        const int per_warp = std::max(1, (tiles + 8 * 2 * sm - 1) / (8 * 2 * sm));
        *narrow = false;
        *blocks = std::min(2 * sm, (tiles + per_warp - 1) / per_warp);
    } else {
        *narrow = true;
        *blocks = std::min(tiles, 2 * sm);
    }
}

void launch_gemv(const GemvArgs& a, int sm_count, cudaStream_t s) {
    GemvParams p{};
    p.w = static_cast<const __nv_bfloat16*>(a.w);
    p.x = static_cast<const __nv_bfloat16*>(a.x);
    p.ssq = a.ssq;
    p.norm_w = static_cast<const __nv_bfloat16*>(a.norm_w);
    p.out = a.out;
    p.residual = static_cast<__nv_bfloat16*>(a.residual);
    p.ssq_out = a.ssq_out;
    p.n = a.epilogue == kSiluMul ? (a.pair_offset + 7) / 8 * 16 : a.n;
    p.k = a.k;
    p.m = a.m;
    p.ld_x = a.ld_x;
    p.ld_out = a.ld_out;
    p.ld_res = a.ld_res;
    p.ssq_groups = a.ssq_groups;
    p.eps = a.eps;
    p.norm_offset = 0.0f;
    p.epilogue = a.epilogue;
    p.pair_offset = a.epilogue == kSiluMul ? a.pair_offset : 0;
    bool narrow;
    int blocks;
    shape(p.n, sm_count, &narrow, &blocks);
    const bool norm = a.norm_w != nullptr;
    // Mirrors gemv_entry() in src/ops/gemv.rs: an overlapped narrow launch takes the staged entry
    // (gemv_with also asks that two staged blocks fit an SM, as Qwen3-4B's do on the H200).
    const bool staged = g_stage && narrow;
    const size_t stage = static_cast<size_t>(kWarps) * (norm ? kStageNorm : kStagePlain) * 2 * 32 * 16;
    const size_t smem = (norm ? static_cast<size_t>(a.m) * (a.k + kXPad) * 2 : 0) + (staged ? stage : 0);
    // Mirrors norm_all_rows() in src/ops/gemv.rs (the threshold a flag, for A/B).
    const bool all_rows = a.m >= g_norm_all_rows_min;
    void (*kernel)(GemvParams) = staged ? (norm ? gemv_narrow_norm_staged_bf16 : gemv_narrow_staged_bf16)
                               : norm ? (narrow ? gemv_narrow_norm_bf16 : all_rows ? gemv_norm_rows_bf16 : gemv_norm_bf16)
                                      : (narrow ? gemv_narrow_bf16 : gemv_bf16);
    launch(kernel, dim3(blocks), dim3(kThreads), smem, s, p);
}
