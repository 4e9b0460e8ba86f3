// The fixed-operation pieces of the sampling definition (src/ops/sampling.rs), shared by the
// device code: each is the same sequence of IEEE fp32 operations as its Rust twin, written with
// explicit round-to-nearest intrinsics so that the compiler cannot contract or reorder them.
#pragma once

#include <stdint.h>

namespace aot {

// exp(x) for x <= 0 (Rust: `exp_det`): n = rint(x log2 e), a two-part Cody-Waite reduction with
// fma, a degree-7 Taylor polynomial by Horner with fma, and an exact 2^n scale. 0 below -87 or
// for NaN.
__device__ __forceinline__ float exp_det(float x) {
    if (isnan(x) || x < -87.0f) return 0.0f;
    // The constants by their bits, as Rust's f32 literals and constant divisions round them.
    const float kLog2e = __uint_as_float(0x3fb8aa3bu);  // log2(e)
    const float kLn2Hi = __uint_as_float(0x3f317200u);  // 0.693_145_75
    const float kLn2Lo = __uint_as_float(0x35bfbe8eu);  // 1.428_606_8e-6
    const float n = rintf(__fmul_rn(x, kLog2e));
    float r = __fmaf_rn(-n, kLn2Hi, x);
    r = __fmaf_rn(-n, kLn2Lo, r);
    float p = __uint_as_float(0x39500d01u);            // 1/5040
    p = __fmaf_rn(p, r, __uint_as_float(0x3ab60b61u));  // 1/720
    p = __fmaf_rn(p, r, __uint_as_float(0x3c088889u));  // 1/120
    p = __fmaf_rn(p, r, __uint_as_float(0x3d2aaaabu));  // 1/24
    p = __fmaf_rn(p, r, __uint_as_float(0x3e2aaaabu));  // 1/6
    p = __fmaf_rn(p, r, 0.5f);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    const float scale = __int_as_float((static_cast<int>(n) + 127) << 23);
    return __fmul_rn(p, scale);
}

// The order-preserving key of a value: larger values have larger keys; NaN maps below -inf.
__device__ __forceinline__ uint32_t logit_key(float x) {
    if (isnan(x)) return 0u;
    const uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The integer mass floor(exp_det(s - max) * 2^32) (at most 2^32).
__device__ __forceinline__ uint64_t sample_mass(float s, float max) {
    const float w = exp_det(__fsub_rn(s, max));
    return static_cast<uint64_t>(__fmul_rn(w, 4294967296.0f));
}

}  // namespace aot
