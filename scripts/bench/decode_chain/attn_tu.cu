#include "kernels/attention/decode.cu"
#include "ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

// Mirrors attn_splits() in src/ops/attention.rs.
int attn_splits_host(int ctx) {
    int want = std::min(std::max(ctx / kTokensPerSplitMin, 1), kMaxSplits);
    int per = (ctx + want - 1) / want;
    per = (per + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    return (ctx + per - 1) / per;
}
int attn_max_splits() { return kMaxSplits; }

void launch_attn(const AttnArgs& a, cudaStream_t s) {
    AttnDecodeParams p{};
    p.qkv = static_cast<const __nv_bfloat16*>(a.qkv);
    p.q_norm = static_cast<const __nv_bfloat16*>(a.q_norm);
    p.k_norm = static_cast<const __nv_bfloat16*>(a.k_norm);
    p.cos_sin = a.cos_sin;
    p.k_cache = static_cast<__nv_bfloat16*>(a.k_cache);
    p.v_cache = static_cast<__nv_bfloat16*>(a.v_cache);
    p.block_table = a.block_table;
    p.slot_of_row = a.slot_of_row;
    p.positions = a.positions;
    p.out = static_cast<__nv_bfloat16*>(a.out);
    p.ws_ml = a.ws_ml;
    p.ws_o = a.ws_o;
    p.counters = a.counters;
    p.m = a.m;
    p.q_heads = a.q_heads;
    p.kv_heads = a.kv_heads;
    p.ld_bt = a.ld_bt;
    p.ld_qkv = a.ld_qkv;
    p.max_pos = a.max_pos;
    p.scale = 1.0f / sqrtf(static_cast<float>(a.head_dim));
    p.eps = a.eps;
    p.norm_offset = 0.0f;
    p.cache_before_wait = g_pdl ? 1 : 0;  // as the engine: its programmatic attention opts in
    const int d = a.head_dim;
    if (d != 64 && d != 128 && d != 256) {
        fprintf(stderr, "head_dim %d: the decode attention kernels are built for 64, 128 and 256\n", d);
        exit(2);
    }
    const size_t floats = kMaxGroup * (d + 8) + kWarps * kBlockTokens * kMaxGroup + kWarps * kMaxGroup * d;
    // Mirrors decode_entry() in src/ops/attention.rs.
    const int g = a.q_heads / a.kv_heads;
    // Mirrors decode_entry_cluster(): pipelined at 64 and 128, and 256's one kind.
    void (*const table_cl[3][4])(AttnDecodeParams) = {
        {attn_decode_d64_cl, attn_decode_d64_g2_cl, attn_decode_d64_g4_cl, attn_decode_d64_g8_cl},
        {attn_decode_d128_cl, attn_decode_d128_g2_cl, attn_decode_d128_g4_cl, attn_decode_d128_g8_cl},
        {attn_decode_d256_cl, attn_decode_d256_g2_cl, attn_decode_d256_g4_cl, attn_decode_d256_g8_cl},
    };
    void (*const table[3][2][4])(AttnDecodeParams) = {
        {{attn_decode_d64_np, attn_decode_d64_g2_np, attn_decode_d64_g4_np, attn_decode_d64_g8_np},
         {attn_decode_d64, attn_decode_d64_g2, attn_decode_d64_g4, attn_decode_d64_g8}},
        {{attn_decode_d128_np, attn_decode_d128_g2_np, attn_decode_d128_g4_np, attn_decode_d128_g8_np},
         {attn_decode_d128, attn_decode_d128_g2, attn_decode_d128_g4, attn_decode_d128_g8}},
        {{attn_decode_d256, attn_decode_d256_g2, attn_decode_d256_g4, attn_decode_d256_g8},
         {attn_decode_d256, attn_decode_d256_g2, attn_decode_d256_g4, attn_decode_d256_g8}},
    };
    const int di = d == 64 ? 0 : d == 128 ? 1 : 2, pi = a.pipelined ? 1 : 0, gi = g == 2 ? 1 : g == 4 ? 2 : g == 8 ? 3 : 0;
    if (a.cluster) {
        // Mirrors the cluster launch in src/ops/attention.rs: grid depth and cluster depth kClusterSplits.
        if (d != 256 && !a.pipelined) {
            fprintf(stderr, "--cluster: the cluster entries at head_dim %d are pipelined only\n", d);
            exit(2);
        }
        const cudaError_t e = launch(table_cl[di][gi], dim3(a.kv_heads, a.m, kClusterSplits), dim3(kThreads),
                                     floats * 4, s, p, kClusterSplits);
        if (e != cudaSuccess) {
            fprintf(stderr, "cluster launch: %s\n", cudaGetErrorString(e));
            exit(1);
        }
        return;
    }
    launch(table[di][pi][gi], dim3(a.kv_heads, a.m, a.grid_splits), dim3(kThreads), floats * 4, s, p);
}
