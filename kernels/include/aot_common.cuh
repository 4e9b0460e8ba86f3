// Shared device helpers for aot-kernels: bf16 vector access and reductions.
// Every kernel computes in fp32 and rounds to bf16 once per value it stores, as
// Hugging Face transformers does, so the CPU references in src/ops can mirror it.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace aot {

// Eight bf16 values moved as one 128-bit access.
struct alignas(16) Bf16x8 {
    __nv_bfloat162 h[4];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp.
// The order of additions is fixed by the launch shape, so results are deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    __syncthreads();
    return total;
}

// -infinity without <math.h> (NVRTC, which builds the CUDA 12 images, has no C library headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float round_bf16(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

}  // namespace aot
