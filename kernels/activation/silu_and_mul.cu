// SwiGLU activation: input rows are [gate (d) | up (d)], output rows are d long.
//   out = bf16( bf16(silu(gate)) * up ),  silu(g) = g / (1 + exp(-g))
// The inner rounding mirrors transformers, which applies the activation in bf16 before the product.
// Grid: (ceil(d / (blockDim.x * 8)), rows); 128-bit accesses when d % 8 == 0, scalar otherwise.
#include "aot_common.cuh"

namespace {

__device__ __forceinline__ float silu_mul(float g, float u) {
    const float act = aot::round_bf16(g / (1.0f + expf(-g)));
    return act * u;
}

}  // namespace

extern "C" __global__ void silu_and_mul_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ input,
                                             int d) {
    const int64_t row = blockIdx.y;
    const __nv_bfloat16* gate = input + row * 2 * d;
    const __nv_bfloat16* up = gate + d;
    __nv_bfloat16* out_row = out + row * d;

    if ((d & 7) == 0) {
        const int vec = blockIdx.x * blockDim.x + threadIdx.x;
        if (vec * 8 >= d) return;
        const aot::Bf16x8 g = reinterpret_cast<const aot::Bf16x8*>(gate)[vec];
        const aot::Bf16x8 u = reinterpret_cast<const aot::Bf16x8*>(up)[vec];
        aot::Bf16x8 o;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 gf = aot::to_f32x2(g.h[j]);
            const float2 uf = aot::to_f32x2(u.h[j]);
            o.h[j] = __floats2bfloat162_rn(silu_mul(gf.x, uf.x), silu_mul(gf.y, uf.y));
        }
        reinterpret_cast<aot::Bf16x8*>(out_row)[vec] = o;
    } else {
        const int base = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
        for (int i = base; i < d && i < base + 8; ++i) {
            out_row[i] = __float2bfloat16_rn(silu_mul(aot::to_f32(gate[i]), aot::to_f32(up[i])));
        }
    }
}
