// Tensor-core and memory helpers (sm_80 and later; every manifest target).
//
// The decode GEMV and attention multiply with `mma.sync.m16n8k16` (bf16 in, fp32 accumulate).
// A dot product does not care in which order its terms are summed, so both operands may use any
// permutation of the reduction index as long as it is the same one. We use that to load each
// thread's fragment with one 16-byte access: a thread that loads elements [8t, 8t+8) of a
// 32-element chunk feeds elements 0-3 to the first k16 step and 4-7 to the second, and the other
// operand is loaded the same way. No shared-memory staging, no ldmatrix.
//
// The prefill GEMM and attention stage tiles in shared memory: cp.async copies, ldmatrix fragment
// loads and the same mma.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16x16, row-major): reg 0 = (row g, k 2t..2t+1), reg 1 = (row g+8, k 2t..), reg 2 = (row g,
//     k 8+2t..), reg 3 = (row g+8, k 8+2t..)
//   B (16x8, "col": stored n-major with k contiguous): reg 0 = (k 2t..2t+1, n g), reg 1 = (k 8+2t.., n g)
//   C/D (16x8 fp32): c0, c1 = (row g, n 2t, 2t+1); c2, c3 = (row g+8, n 2t, 2t+1)
// ldmatrix.x4 loads four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and
// each lane receives (row lane / 4, columns 2 (lane % 4) and +1) of each matrix: exactly the A and
// B fragment pieces above when the matrices are chosen as the callers do.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace aot {

// D = A(16x16, row) * B(16x8, col) + D, bf16 inputs, fp32 accumulators.
// Fragment layout (g = lane / 4, t = lane % 4):
//   a0: row g,   k {2t, 2t+1}      a1: row g+8, k {2t, 2t+1}
//   a2: row g,   k {2t+8, 2t+9}    a3: row g+8, k {2t+8, 2t+9}
//   b0: k {2t, 2t+1}, col g        b1: k {2t+8, 2t+9}, col g
//   d0, d1: row g, cols {2t, 2t+1} d2, d3: row g+8, cols {2t, 2t+1}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two k16 steps over a 32-element chunk: rows g and g+8 of A hold 8 consecutive elements each
// (`lo`, `hi`), column g of B holds the same 8 positions (`b`).
__device__ __forceinline__ void mma_chunk32(float (&d)[4], const uint4& lo, const uint4& hi, const uint4& b) {
    mma_bf16_16816(d, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    mma_bf16_16816(d, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

// A weight load that streams: read once, so keep it out of L1 and fetch whole 256-byte lines into L2.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// A read-only load that may hit L1 (activations reused by many warps).
__device__ __forceinline__ uint4 ld_cached16(const void* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; when `valid` is false nothing is read and the
// destination is zero-filled (src must still be a valid address: pass the tensor's base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// The same with each 8x8 matrix transposed (for B operands stored k-major, such as V in attention).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a * b over one 16x8x16 bf16 tile, fp32 accumulation.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one register of two bf16 (round to nearest even), the low half first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Eight bf16 of a uint4 to fp32.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
    f[0] = bf16_lo(v.x); f[1] = bf16_hi(v.x);
    f[2] = bf16_lo(v.y); f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z); f[5] = bf16_hi(v.z);
    f[6] = bf16_lo(v.w); f[7] = bf16_hi(v.w);
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                      pack_bf16x2(f[6], f[7]));
}

}  // namespace aot
