// RMSNorm for Qwen decode, bf16 in and out, fp32 math.
//
//   y = bf16( (w + weight_offset) * bf16(x * rsqrt(mean(x^2) + eps)) )
//
// weight_offset is 0 for Qwen3 (`x * rsqrt(..) * w`) and 1 for the zero-centred norms of
// Qwen3.5/3.6 (`* (1 + w)`). One block per row; rows are `hidden` long with `stride` elements
// between row starts. The fused variant first adds the residual stream:
//   r = bf16(x + residual); residual <- r; x <- rmsnorm(r)
// which is the pre-norm step of every transformer layer.
#include "aot_common.cuh"

namespace {

constexpr int kMaxWarps = 32;

__device__ __forceinline__ float normed_scale(float sum_sq, int hidden, float eps) {
    return rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
}

__device__ __forceinline__ __nv_bfloat16 apply(float x, float scale, __nv_bfloat16 w, float weight_offset) {
    const float normed = aot::round_bf16(x * scale);
    return __float2bfloat16_rn((aot::to_f32(w) + weight_offset) * normed);
}

}  // namespace

extern "C" __global__ void rmsnorm_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                        const __nv_bfloat16* __restrict__ weight, int hidden, int stride,
                                        float eps, float weight_offset) {
    __shared__ float scratch[kMaxWarps];
    const __nv_bfloat16* row = x + static_cast<int64_t>(blockIdx.x) * stride;
    __nv_bfloat16* out_row = out + static_cast<int64_t>(blockIdx.x) * stride;

    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = aot::to_f32(row[i]);
        sum_sq += v * v;
    }
    const float scale = normed_scale(aot::block_sum(sum_sq, scratch), hidden, eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out_row[i] = apply(aot::to_f32(row[i]), scale, weight[i], weight_offset);
    }
}

extern "C" __global__ void fused_add_rmsnorm_bf16(__nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ residual,
                                                  const __nv_bfloat16* __restrict__ weight, int hidden, int stride,
                                                  float eps, float weight_offset) {
    __shared__ float scratch[kMaxWarps];
    __nv_bfloat16* x_row = x + static_cast<int64_t>(blockIdx.x) * stride;
    __nv_bfloat16* r_row = residual + static_cast<int64_t>(blockIdx.x) * stride;

    // Pass 1: r = x + residual, stored back to the residual stream; accumulate r^2.
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const __nv_bfloat16 r = __float2bfloat16_rn(aot::to_f32(x_row[i]) + aot::to_f32(r_row[i]));
        r_row[i] = r;
        const float v = aot::to_f32(r);
        sum_sq += v * v;
    }
    const float scale = normed_scale(aot::block_sum(sum_sq, scratch), hidden, eps);
    // Pass 2 reads back what this same thread wrote in pass 1 (same index), so no barrier is needed.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        x_row[i] = apply(aot::to_f32(r_row[i]), scale, weight[i], weight_offset);
    }
}
