// Probe: how fast can one SM-parallel kernel read N bytes of cold memory, with plain 16-byte
// streaming loads (as the GEMV and stream_read do) or with cp.async.bulk into a shared-memory ring
// (TMA, sm_90)? Sizes are the Qwen3-4B decode projections' weights. Each launch reads a different
// slot of a 4 GiB pool (cold in L2). Prints us per launch (median of 7 batches of 40 launches).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned sa(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

template <int U>
__global__ void ld_kernel(const uint4* __restrict__ d, unsigned long long n16, unsigned* out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = ld_stream16(d + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) { uint4 a = ld_stream16(d + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x12345678u) out[0] = acc;
}

// Contiguous per-warp spans (like a GEMV warp streaming its rows): warp w reads span w, 16 B a lane,
// U loads in flight.
template <int U>
__global__ void ld_span_kernel(const uint4* __restrict__ d, unsigned long long n16, unsigned* out) {
    const int lane = threadIdx.x & 31;
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / 32);
    const unsigned long long w = (unsigned long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const unsigned long long per = (n16 + warps - 1) / warps;
    unsigned long long b = w * per, e = min(n16, b + per);
    unsigned acc = 0;
    for (unsigned long long i = b + lane; i < e; i += 32 * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = (i + 32 * u < e) ? ld_stream16(d + i + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned c) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(c) : "memory"); }
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t* b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory"); }
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(sa(b)), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar)) : "memory");
}

// Warp 0 lane 0 produces: the block's contiguous share of chunks of `cb` bytes, through `S` stages
// (each `cb` bytes, copied as `pieces` bulk copies); warps 1.. consume (XOR every word).
__global__ void bulk_kernel(const char* __restrict__ d, unsigned long long bytes, int S, int cb, int pieces, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    uint64_t* full = reinterpret_cast<uint64_t*>(smem);
    uint64_t* empty = full + 16;
    char* ring = smem + 256;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cons = blockDim.x / 32 - 1;
    const unsigned long long nch = bytes / cb;
    const unsigned long long b0 = nch * blockIdx.x / gridDim.x, b1 = nch * (blockIdx.x + 1) / gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], cons); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0) {
            const int pb = cb / pieces;
            for (unsigned long long i = b0; i < b1; ++i) {
                const int k = (int)(i - b0), s = k % S;
                if (k >= S) mbar_wait(&empty[s], ((k / S) - 1) & 1);
                mbar_expect(&full[s], cb);
                for (int q = 0; q < pieces; ++q) bulk_g2s(ring + (size_t)s * cb + q * pb, d + i * cb + q * pb, pb, &full[s]);
            }
        }
    } else {
        unsigned acc = 0;
        for (unsigned long long i = b0; i < b1; ++i) {
            const int k = (int)(i - b0), s = k % S;
            mbar_wait(&full[s], (k / S) & 1);
            const uint4* st = reinterpret_cast<const uint4*>(ring + (size_t)s * cb);
            for (int j = (warp - 1) * 32 + lane; j < cb / 16; j += cons * 32) { uint4 v = st[j]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
        }
        if (acc == 0x12345678u) out[0] = acc;
    }
}

__global__ void fill(uint4* d, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        d[i] = make_uint4((unsigned)i * 2654435761u, (unsigned)(i >> 7) ^ 0x9e3779b9u, (unsigned)i + 17u, (unsigned)(i * 40503u));
}

int main() {
    int sm; CK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    const size_t pool = 4ull << 30;
    char* d; CK(cudaMalloc(&d, pool)); unsigned* out; CK(cudaMalloc(&out, 64));
    fill<<<sm * 8, 256>>>(reinterpret_cast<uint4*>(d), pool / 16); CK(cudaDeviceSynchronize());
    CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    struct Sz { const char* name; size_t bytes; };
    // Qwen3-4B: o_proj 2560x4096, qkv 6144x2560, down 2560x9728, gate_up 19456x2560, lm_head 151936x2560 (bf16)
    std::vector<Sz> sizes = {{"o_proj", 2560ull * 4096 * 2}, {"qkv", 6144ull * 2560 * 2}, {"down", 2560ull * 9728 * 2},
                             {"gate_up", 19456ull * 2560 * 2}, {"lm_head", 151936ull * 2560 * 2}};
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto timeit = [&](size_t bytes, auto launch) {
        const size_t slot = (bytes + 4095) / 4096 * 4096;
        const size_t slots = pool / slot;
        std::vector<float> v;
        for (int b = 0; b < 8; ++b) {
            const int R = 40;
            CK(cudaEventRecord(e0));
            for (int r = 0; r < R; ++r) launch(d + ((size_t)(b * R + r) % slots) * slot);
            CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            if (b > 0) v.push_back(ms * 1000.0f / R);
        }
        CK(cudaGetLastError());
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    for (auto& z : sizes) {
        const size_t n16 = z.bytes / 16;
        printf("%-8s %7.1f MB\n", z.name, z.bytes / 1e6);
        auto rep = [&](const char* what, float us) { printf("  %-34s %8.2f us  %5.2f TB/s\n", what, us, z.bytes / us / 1e6); };
        rep("ld 4x512 U4 (stream_read)", timeit(z.bytes, [&](const char* p) { ld_kernel<4><<<4 * sm, 512>>>((const uint4*)p, n16, out); }));
        rep("ld 2x256 U8", timeit(z.bytes, [&](const char* p) { ld_kernel<8><<<2 * sm, 256>>>((const uint4*)p, n16, out); }));
        rep("ld 2x256 U16", timeit(z.bytes, [&](const char* p) { ld_kernel<16><<<2 * sm, 256>>>((const uint4*)p, n16, out); }));
        rep("span 2x256 U8", timeit(z.bytes, [&](const char* p) { ld_span_kernel<8><<<2 * sm, 256>>>((const uint4*)p, n16, out); }));
        rep("span 2x256 U16", timeit(z.bytes, [&](const char* p) { ld_span_kernel<16><<<2 * sm, 256>>>((const uint4*)p, n16, out); }));
        struct B { int bps, S, cb, pieces, thr; };
        for (B c : {B{1, 4, 16384, 1, 160}, B{1, 8, 16384, 1, 160}, B{1, 6, 32768, 1, 160}, B{1, 12, 16384, 1, 288},
                    B{1, 6, 32768, 4, 288}, B{2, 4, 16384, 1, 160}, B{2, 6, 16384, 1, 160}, B{2, 3, 32768, 1, 160}, B{1, 4, 8192, 1, 160}, B{1, 16, 8192, 1, 160}}) {
            const size_t smem = 256 + (size_t)c.S * c.cb;
            char name[96]; snprintf(name, sizeof name, "bulk %d/SM S%d %dK x%d thr%d (%zuK)", c.bps, c.S, c.cb / 1024, c.pieces, c.thr, smem / 1024);
            rep(name, timeit(z.bytes, [&](const char* p) { bulk_kernel<<<c.bps * sm, c.thr, smem>>>(p, z.bytes, c.S, c.cb, c.pieces, out); }));
        }
    }
    return 0;
}
