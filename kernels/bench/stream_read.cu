// Streaming read: the read bandwidth a decode step can hope for, measured by a kernel of ours in
// the same run as the engine. Every 16-byte word of the buffer is read once (streaming loads, four
// in flight per thread) and folded into an XOR so the loads cannot be optimised away; each block
// writes its fold, and the host checks the XOR of the blocks against its own.
#include "aot_bulk.cuh"
#include "aot_common.cuh"
#include "aot_mma.cuh"

namespace aot_stream {
constexpr int kBulkThreads = 160;  // stream_read_bulk_u32: one producer warp, four consumer warps

__device__ __forceinline__ unsigned fold16(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// This thread's XOR of words [tid, tid + threads, ...) of `data` (every thread of the grid), four
// loads in flight.
__device__ __forceinline__ unsigned fold_loads(const uint4* __restrict__ data, unsigned long long words16) {
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
    unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < words16; i += 4 * stride) {
        const uint4 a = aot::ld_stream16(data + i);
        const uint4 b = aot::ld_stream16(data + i + stride);
        const uint4 c = aot::ld_stream16(data + i + 2 * stride);
        const uint4 d = aot::ld_stream16(data + i + 3 * stride);
        acc ^= fold16(a) ^ fold16(b) ^ fold16(c) ^ fold16(d);
    }
    for (; i < words16; i += stride) acc ^= fold16(aot::ld_stream16(data + i));
    return acc;
}

// The XOR of every thread's `acc` into block_xor[blockIdx.x]; `scratch` holds a word a warp.
__device__ __forceinline__ void write_block_fold(unsigned acc, unsigned* scratch, unsigned* __restrict__ block_xor) {
    for (int off = 16; off > 0; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned total = 0;
        for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total ^= scratch[w];
        block_xor[blockIdx.x] = total;
    }
}
}  // namespace aot_stream

extern "C" __global__ void __launch_bounds__(512) stream_read_u32(const uint4* __restrict__ data,
                                                                  unsigned long long words16,
                                                                  unsigned* __restrict__ block_xor) {
    __shared__ unsigned scratch[16];
    aot_stream::write_block_fold(aot_stream::fold_loads(data, words16), scratch, block_xor);
}

// The same read through the Tensor Memory Accelerator (sm_90 and later). Where it reads faster
// than the loads above, a limit measured only with loads would understate what the memory allows:
// the benchmark times both and takes the faster.
//
// Each block takes a contiguous run of kBulkChunk-byte chunks. Warp 0's first lane copies them
// into a ring of kBulkStages slots (cp.async.bulk, completed on the slot's `full` barrier); the
// other warps fold each slot into their XOR and release it on its `empty` barrier. The bytes past
// the last whole chunk are folded by the last block's consumers with loads. Compiled for an older
// target (or the compute_80 PTX) the kernel folds everything with loads instead, the same result.
// The launch: `Reader::Bulk` in src/ops/stream_read.rs (aot_stream::kBulkThreads threads, kBulkStages *
// kBulkChunk bytes of dynamic shared memory, twice as many blocks as SMs: two an SM where they
// fit, as on the H200; on a 100 KiB SM one at a time).
extern "C" __global__ void __launch_bounds__(aot_stream::kBulkThreads)
    stream_read_bulk_u32(const uint4* __restrict__ data, unsigned long long words16, unsigned* __restrict__ block_xor) {
    using namespace aot_stream;
    __shared__ unsigned scratch[kBulkThreads / 32];
    unsigned acc = 0;
#if AOT_HAS_BULK
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int kBulkConsumers = kBulkThreads / 32 - 1;
    constexpr int kBulkStages = 4;
    constexpr int kBulkChunk = 16384;
    extern __shared__ __align__(128) uint4 ring[];  // [kBulkStages][kBulkChunk / 16]
    __shared__ uint64_t full[kBulkStages], empty[kBulkStages];
    constexpr unsigned long long kWords = kBulkChunk / 16;
    const unsigned long long chunks = words16 / kWords;
    const unsigned long long c0 = chunks * blockIdx.x / gridDim.x, c1 = chunks * (blockIdx.x + 1) / gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kBulkStages; ++s) {
            aot::mbar_init(&full[s], 1);
            aot::mbar_init(&empty[s], kBulkConsumers);
        }
        aot::mbar_init_fence();
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0) {
            for (unsigned long long c = c0; c < c1; ++c) {
                const unsigned k = static_cast<unsigned>(c - c0), s = k % kBulkStages;
                if (k >= kBulkStages) aot::mbar_wait(&empty[s], (k / kBulkStages - 1) & 1);
                aot::mbar_arrive_expect_tx(&full[s], kBulkChunk);
                aot::bulk_g2s(ring + s * kWords, data + c * kWords, kBulkChunk, &full[s]);
            }
        }
    } else {
        for (unsigned long long c = c0; c < c1; ++c) {
            const unsigned k = static_cast<unsigned>(c - c0), s = k % kBulkStages;
            aot::mbar_wait(&full[s], (k / kBulkStages) & 1);
            for (int j = (warp - 1) * 32 + lane; j < static_cast<int>(kWords); j += kBulkConsumers * 32) {
                acc ^= fold16(ring[s * kWords + j]);
            }
            __syncwarp();
            if (lane == 0) aot::mbar_arrive(&empty[s]);
        }
        if (blockIdx.x == gridDim.x - 1) {
            for (unsigned long long i = chunks * kWords + (warp - 1) * 32 + lane; i < words16; i += kBulkConsumers * 32) {
                acc ^= fold16(aot::ld_stream16(data + i));
            }
        }
    }
#else
    acc = fold_loads(data, words16);
#endif
    write_block_fold(acc, scratch, block_xor);
}
