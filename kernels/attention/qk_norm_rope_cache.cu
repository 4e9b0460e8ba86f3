// Prefill step between the QKV projection and attention, for the T tokens of one sequence at
// positions start_pos .. start_pos + T - 1:
//   q, k: per-head RMSNorm, exactly the rmsnorm kernel's roundings,
//           y = bf16((w + weight_offset) * bf16(x * rsqrt(mean(x^2) + eps))),
//         then NeoX (rotate-half) RoPE over the whole head, fp32 with one rounding,
//           out[i] = bf16(y1 c - y2 s),  out[i + D/2] = bf16(y2 c + y1 s)
//         with (c, s) from the fp32 [max_position, D] table of src/ops/rotary.rs;
//   q -> q_out [T, Hq, D]; k (normed, roped) and v (as is) -> the paged KV cache.
// Input rows: qkv [T, qkv_stride], each [q heads | k heads | v heads] of head_dim.
//
// Float arithmetic is written with explicit round-to-nearest intrinsics, so the PTX leaves no
// multiply-add for the JIT to contract differently: SASS and the PTX fallback give the same bits.
//
// Grid (T, ceil((Hq + 2 Hkv) / 8)), 256 threads: one warp per (token, head). Lane l holds
// elements l, l + 32, ... of the head, so element i and its rotation partner i + D/2 sit in the
// same lane (D is 64, 128 or 256: 2, 4 or 8 elements per lane).
#include "aot_common.cuh"
#include "aot_paged_kv.cuh"

namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim 256

}  // namespace

extern "C" __global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_cache_bf16(__nv_bfloat16* __restrict__ q_out, __nv_bfloat16* __restrict__ k_cache,
                            __nv_bfloat16* __restrict__ v_cache, const __nv_bfloat16* __restrict__ qkv,
                            const __nv_bfloat16* __restrict__ q_norm, const __nv_bfloat16* __restrict__ k_norm,
                            const float* __restrict__ cos_sin, const int* __restrict__ block_table, int table_offset,
                            int table_len, int num_blocks, int max_position, int qkv_stride, int num_q_heads,
                            int num_kv_heads, int head_dim, int start_pos, float eps, float weight_offset) {
    const int t = blockIdx.x;
    const int head = blockIdx.y * kWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (head >= num_q_heads + 2 * num_kv_heads) return;
    const int per_lane = head_dim / 32;
    const int half = per_lane / 2;
    const int position = start_pos + t;
    if (position < 0 || position >= max_position) __trap();
    const __nv_bfloat16* x = qkv + static_cast<int64_t>(t) * qkv_stride + static_cast<int64_t>(head) * head_dim;

    if (head >= num_q_heads + num_kv_heads) {
        // v: copied as it is.
        const int kv_head = head - num_q_heads - num_kv_heads;
        const int block = aot::kv_block(block_table + table_offset, table_len, num_blocks, position);
        __nv_bfloat16* dst =
            v_cache + aot::kv_offset(block, kv_head, position % aot::kKvBlockTokens, num_kv_heads, head_dim);
        for (int i = lane; i < head_dim; i += 32) dst[i] = x[i];
        return;
    }

    const bool is_q = head < num_q_heads;
    const __nv_bfloat16* w = is_q ? q_norm : k_norm;
    float v[kMaxPerLane];
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
        if (j < per_lane) {
            v[j] = aot::to_f32(x[j * 32 + lane]);
            sum_sq = __fmaf_rn(v[j], v[j], sum_sq);
        }
    }
    const float scale = rsqrtf(__fadd_rn(__fdiv_rn(aot::warp_sum(sum_sq), static_cast<float>(head_dim)), eps));
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
        if (j < per_lane) {
            const float normed = aot::round_bf16(__fmul_rn(v[j], scale));
            v[j] = aot::round_bf16(__fmul_rn(__fadd_rn(aot::to_f32(w[j * 32 + lane]), weight_offset), normed));
        }
    }

    const float* cs = cos_sin + static_cast<int64_t>(position) * head_dim;
    __nv_bfloat16* dst;
    if (is_q) {
        dst = q_out + (static_cast<int64_t>(t) * num_q_heads + head) * head_dim;
    } else {
        const int block = aot::kv_block(block_table + table_offset, table_len, num_blocks, position);
        dst = k_cache + aot::kv_offset(block, head - num_q_heads, position % aot::kKvBlockTokens, num_kv_heads,
                                       head_dim);
    }
#pragma unroll
    for (int j = 0; j < kMaxPerLane / 2; ++j) {
        if (j < half) {
            const int i = j * 32 + lane;
            const float c = cs[i];
            const float s = cs[i + head_dim / 2];
            const float x1 = v[j];
            const float x2 = v[j + half];
            dst[i] = __float2bfloat16_rn(__fmaf_rn(x1, c, -__fmul_rn(x2, s)));
            dst[i + head_dim / 2] = __float2bfloat16_rn(__fmaf_rn(x2, c, __fmul_rn(x1, s)));
        }
    }
}
