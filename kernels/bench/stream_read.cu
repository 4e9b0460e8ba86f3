// Streaming read: the read bandwidth a decode step can hope for, measured by a kernel of ours in
// the same run as the engine. Every 16-byte word of the buffer is read once (streaming loads, four
// in flight per thread) and folded into an XOR so the loads cannot be optimised away; each block
// writes its fold, and the host checks the XOR of the blocks against its own.
#include "aot_common.cuh"
#include "aot_mma.cuh"

extern "C" __global__ void __launch_bounds__(512) stream_read_u32(const uint4* __restrict__ data,
                                                                  unsigned long long words16,
                                                                  unsigned* __restrict__ block_xor) {
    __shared__ unsigned scratch[16];
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
    unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < words16; i += 4 * stride) {
        const uint4 a = aot::ld_stream16(data + i);
        const uint4 b = aot::ld_stream16(data + i + stride);
        const uint4 c = aot::ld_stream16(data + i + 2 * stride);
        const uint4 d = aot::ld_stream16(data + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < words16; i += stride) {
        const uint4 a = aot::ld_stream16(data + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int off = 16; off > 0; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned total = 0;
        for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total ^= scratch[w];
        block_xor[blockIdx.x] = total;
    }
}
