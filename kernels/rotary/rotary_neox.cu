// Rotary position embedding, NeoX (rotate-half) layout, applied in place to q and k.
//
// For each token t, head h and i < rot_dim/2, with (c, s) = cos_sin[pos[t]] halves:
//   x1 = x[i], x2 = x[i + rot_dim/2]
//   x[i]             = bf16(x1 * c_i - x2 * s_i)
//   x[i + rot_dim/2] = bf16(x2 * c_i + x1 * s_i)
// Dimensions at and past rot_dim are left as they are (partial rotary: Qwen3.5 rotates 64 of 256).
// cos_sin is fp32 [max_position, rot_dim]: cos for the first rot_dim/2, sin for the rest.
// A position outside [0, max_position) is a bug upstream that would read past the table: the
// kernel traps, so the launch fails loudly (the context is then lost) instead of rotating by garbage.
// Grid: one block per token; threads stride over (head, i) pairs of q then k.
#include "aot_common.cuh"

namespace {

__device__ __forceinline__ void rotate(__nv_bfloat16* head, const float* cos_sin, int half, int i) {
    const float c = cos_sin[i];
    const float s = cos_sin[i + half];
    const float x1 = aot::to_f32(head[i]);
    const float x2 = aot::to_f32(head[i + half]);
    head[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    head[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
}

}  // namespace

extern "C" __global__ void rotary_neox_bf16(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                            const int* __restrict__ positions, const float* __restrict__ cos_sin,
                                            int max_position, int num_q_heads, int num_kv_heads, int head_dim, int rot_dim,
                                            int q_token_stride, int k_token_stride) {
    const int token = blockIdx.x;
    const int half = rot_dim / 2;
    const int position = positions[token];
    if (position < 0 || position >= max_position) __trap();
    const float* cs = cos_sin + static_cast<int64_t>(position) * rot_dim;
    __nv_bfloat16* q_tok = q + static_cast<int64_t>(token) * q_token_stride;
    __nv_bfloat16* k_tok = k + static_cast<int64_t>(token) * k_token_stride;

    const int q_work = num_q_heads * half;
    const int total = (num_q_heads + num_kv_heads) * half;
    for (int w = threadIdx.x; w < total; w += blockDim.x) {
        if (w < q_work) {
            rotate(q_tok + (w / half) * head_dim, cs, half, w % half);
        } else {
            const int kw = w - q_work;
            rotate(k_tok + (kw / half) * head_dim, cs, half, kw % half);
        }
    }
}
