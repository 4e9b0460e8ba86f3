// Counter-based random numbers, the device twin of src/ops/random.rs: every value is a pure
// function of (seed, stream, counter), computed with 64-bit integer operations only, so the GPU
// and the CPU reference produce the same bits.
#pragma once

#include <stdint.h>

namespace aot {

// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// 64 random bits for element `counter` of stream `stream` under `seed`.
__device__ __forceinline__ uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t counter) {
    const uint64_t key = mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ull));
    return mix64(key + counter * 0x9e3779b97f4a7c15ull);
}

// The top 24 bits, an integer in [0, 2^24) (exact in fp32).
__device__ __forceinline__ uint32_t random_u24(uint64_t seed, uint64_t stream, uint64_t counter) {
    return static_cast<uint32_t>(random_bits(seed, stream, counter) >> 40);
}

// Uniform in [-1, 1), a multiple of 2^-23: u24 * 2^-23 is exact, and so is the subtraction.
__device__ __forceinline__ float uniform_pm1(uint64_t seed, uint64_t stream, uint64_t counter) {
    return __fsub_rn(__fmul_rn(static_cast<float>(random_u24(seed, stream, counter)), 1.0f / 8388608.0f), 1.0f);
}

}  // namespace aot
