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

// Programmatic dependent launch (Hopper and later; no-ops before sm_90). A kernel launched with the
// programmatic-serialisation attribute may start while its predecessor drains: it may do work
// that does not read the predecessor's output (addresses, weight prefetch), then must call
// pdl_wait() before reading anything an earlier kernel wrote. pdl_launch_dependents() lets the
// next kernel start early. The host sets the attribute only for images built for sm_90 or later,
// whose code contains the wait.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// -infinity without <math.h> (NVRTC, which builds the CUDA 12 images, has no C library headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// bf16 -> fp32, exact: the 16 bits become the high half of the word, by the `mov.b32 {0, x}` that
// cuda_bf16.hpp uses for sm_80. Kernels widen bf16 with these, never with __bfloat162float,
// __bfloat1622float2, __low2float or __high2float: for sm_90 and later the header builds those
// from cvt.f32.bf16, and nvcc 13.0's SASS of that ran the norm GEMVs slower on the H200, as did a
// C++ shift of the same bits. tests/kernel_sources.rs keeps them out.
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
    float f;
    asm("{ mov.b32 %0, {0, %1}; }" : "=f"(f) : "h"(__bfloat16_as_ushort(v)));
    return f;
}

// Both halves of a bf16 pair, the low one (.x) first.
__device__ __forceinline__ float2 to_f32x2(__nv_bfloat162 v) {
    return make_float2(to_f32(__low2bfloat16(v)), to_f32(__high2bfloat16(v)));
}

// v rounded to bf16 (nearest even) and widened back: the value a bf16 store would keep.
__device__ __forceinline__ float round_bf16(float v) { return to_f32(__float2bfloat16_rn(v)); }

}  // namespace aot
