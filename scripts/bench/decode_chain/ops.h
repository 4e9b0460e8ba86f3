// Host-side launchers of the engine's decode kernels, for the decode-chain micro-benchmark. Each
// lives in its own translation unit next to the kernel source it includes (the sources' `using
// namespace` lines would collide in one unit); the launch shapes mirror src/ops/*.rs.
#pragma once
#include <cuda_runtime.h>

struct GemvArgs {
    const void* w;
    const void* x;
    const float* ssq;
    const void* norm_w;
    void* out;
    void* residual;
    float* ssq_out;
    int n, k, m, ld_x, ld_out, ld_res, ssq_groups;
    float eps;
    int epilogue;     // 0 bf16, 1 f32, 2 residual, 3 silu_mul
    int pair_offset;  // silu_mul: the MLP width
};
void launch_gemv(const GemvArgs& a, int sm_count, cudaStream_t s);
// Rows from which the wide norm GEMVs take the all-rows prologue (NORM_ALL_ROWS_MIN in
// src/ops/gemv.rs; `--norm-all-rows-min`).
extern int g_norm_all_rows_min;

// Launches with programmatic stream serialisation (programmatic dependent launch) when on.
extern bool g_pdl;
// Whether the next GEMV launch stages its first weights (--stage-ops).
extern bool g_stage;
// With `cluster_z` > 0, as thread-block clusters of (1, 1, cluster_z) blocks.
template <typename P>
inline cudaError_t launch(void (*kernel)(P), dim3 grid, dim3 block, size_t smem, cudaStream_t s, const P& p,
                          unsigned cluster_z = 0) {
    if (smem > 0) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (g_pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    if (cluster_z > 0) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = cluster_z;
        ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

struct AttnArgs {
    const void* qkv;
    const void* q_norm;
    const void* k_norm;
    const float* cos_sin;
    void* k_cache;
    void* v_cache;
    const int* block_table;
    const int* slot_of_row;
    const int* positions;
    void* out;
    float* ws_ml;
    float* ws_o;
    unsigned* counters;
    int m, q_heads, kv_heads, head_dim, ld_bt, ld_qkv, max_pos, grid_splits;
    int pipelined;  // the entries that stream the next cache block while scoring (64, 128)
    int cluster;    // the `_cl` entries: a sequence's splits as one cluster, grid depth kClusterSplits
    float eps;
};
void launch_attn(const AttnArgs& a, cudaStream_t s);
int attn_splits_host(int ctx);
int attn_max_splits();
