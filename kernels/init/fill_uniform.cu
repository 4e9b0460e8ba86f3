// Seeded uniform fill, the device twin of src/ops/random.rs::fill_uniform_bf16_reference:
//   out[i] = bf16(fma(scale, u_i, offset)),  u_i = uniform_pm1(seed, stream, i)
// one fused multiply-add and one rounding per value, so a tensor generated here equals the one
// the CPU reference generates bit for bit (synthetic weights). Grid-stride over n (64-bit).
#include "aot_common.cuh"
#include "aot_random.cuh"

extern "C" __global__ void fill_uniform_bf16(__nv_bfloat16* __restrict__ out, uint64_t n, uint64_t seed,
                                             uint64_t stream, float scale, float offset) {
    const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = __float2bfloat16_rn(__fmaf_rn(scale, aot::uniform_pm1(seed, stream, i), offset));
    }
}
