// Token sampling, bit for bit the definition in src/ops/sampling.rs (its doc comment is the spec):
// greedy argmax, or temperature / top-k / top-p with integer masses and a counter-based draw.
//
// One block per row of logits, no sort: the kept set is always a prefix of the rank order
// (scaled value descending by its order-preserving key, index ascending), so it is described by
// a threshold (key K, index I): kept = {key > K} + {key == K and index <= I}. Thresholds come from
// radix selection over the 32-bit keys (digits of 11, 11 and 10 bits) with integer histograms:
// counts for top-k, u64 mass sums for top-p. Ties at the threshold key all have the same scaled
// value, hence the same mass, so how many of them a cut needs is one integer division; which ones
// (the lowest indices) is one scan in index order. The draw walks the kept set in index order with
// one block-wide prefix sum. Every sum is an integer sum, so the result does not depend on the
// order of additions (no float atomics anywhere).
//
// Candidates. Only tokens of positive mass (s > max - 22.2 or so) can change a mass sum or be
// drawn, and they are a prefix of the rank order; under top-k only those whose key's first digit
// reaches the k-th ranked token's can be kept. Under top-k, when the first digit's histogram puts
// at most kCandidates tokens in the bins from the k-th ranked key's up (a peaked row; top_k 20 as
// Qwen's generation config has), one pass copies the candidates, in index order, into shared
// memory, and every later pass (the digits, the tie scans, the draw) runs over them instead of the
// row, with the same thresholds and the same token (src/ops/sampling.rs, `threshold_model`, checks
// that on the CPU). Otherwise (no top-k, or a flat row) the passes run over the whole row: there
// the gather would be one more pass that nothing after it gets back.
//
// Row passes re-read the row (it stays in L2) and recompute s = l / temperature and the key, the
// same fp32 operations each time; in the maximum and the mass sums each thread keeps kLoads loads
// in flight, in the histograms one (see radix_digit).
#include "aot_common.cuh"
#include "aot_random.cuh"
#include "aot_sampling.cuh"

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;
// Candidates a row may have for the passes to run over them (src/ops/sampling.rs::SAMPLE_CANDIDATES).
constexpr int kCandidates = 2048;
// Row loads in flight per thread in a pass over the row.
constexpr int kLoads = 8;
constexpr unsigned kFull = 0xffffffffu;
// src/ops/sampling.rs::SAMPLE_STREAM ("SAMPLE").
constexpr uint64_t kSampleStream = 0x53414d504c45ull;

struct Shared {
    uint32_t count[kMaxBins];
    unsigned long long mass[kMaxBins];
    // The candidates in index order: scaled value and token index.
    float cand_s[kCandidates];
    int cand_index[kCandidates];
    uint64_t scratch[kWarps];
    // Results that one thread finds and every thread reads after a barrier.
    uint32_t found_bin;
    uint32_t found_count;
    uint64_t found_below;
    int found_index;
};

__device__ __forceinline__ float scaled_logit(float l, float temperature) {
    return isnan(l) ? aot::neg_inf() : __fdiv_rn(l, temperature);
}

__device__ __forceinline__ bool in_prefix(uint32_t key, int index, uint32_t k, int i) {
    return key > k || (key == k && index <= i);
}

__device__ uint64_t block_max(uint64_t v, uint64_t* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    uint64_t m = scratch[0];
    for (int w = 1; w < kWarps; ++w) m = max(m, scratch[w]);
    __syncthreads();
    return m;
}

// Exclusive prefix sum over the block in thread order; `total` gets the sum of all.
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* scratch, uint64_t& total) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    uint64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t y = __shfl_up_sync(kFull, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t w = scratch[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint64_t y = __shfl_up_sync(kFull, w, o);
            if (lane >= o) w += y;
        }
        scratch[lane] = w;
    }
    __syncthreads();
    const uint64_t before = warp > 0 ? scratch[warp - 1] : 0;
    total = scratch[kWarps - 1];
    __syncthreads();
    return before + x - v;
}

// Adds each lane's (bin, mass) to the histograms. Lanes that share a bin are combined first
// (logits crowd into few bins, and same-address shared atomics serialise); after a few rounds the
// remaining lanes add on their own. Integer sums: the result is the same in any order.
template <bool kWithMass>
__device__ __forceinline__ void histogram_add(Shared& sh, bool has, uint32_t bin, uint64_t mass) {
    const int lane = threadIdx.x & 31;
    unsigned todo = __ballot_sync(kFull, has);
    for (int round = 0; round < 4 && todo != 0; ++round) {
        const int leader = __ffs(todo) - 1;
        const uint32_t b = __shfl_sync(kFull, bin, leader);
        const bool mine = ((todo >> lane) & 1u) && bin == b;
        const unsigned peers = __ballot_sync(kFull, mine);
        if (kWithMass) {
            // mass <= 2^32: two 16-bit halves summed over at most 32 lanes fit in 32 bits.
            const uint32_t hi = __reduce_add_sync(kFull, mine ? static_cast<uint32_t>(mass >> 16) : 0u);
            const uint32_t lo = __reduce_add_sync(kFull, mine ? static_cast<uint32_t>(mass & 0xffffu) : 0u);
            if (lane == leader) atomicAdd(&sh.mass[b], (static_cast<unsigned long long>(hi) << 16) + lo);
        }
        if (lane == leader) atomicAdd(&sh.count[b], static_cast<uint32_t>(__popc(peers)));
        todo &= ~peers;
    }
    if ((todo >> lane) & 1u) {
        if (kWithMass) atomicAdd(&sh.mass[bin], static_cast<unsigned long long>(mass));
        atomicAdd(&sh.count[bin], 1u);
    }
}

// What the passes after the maximum run over: the whole row, or its candidates in shared memory.
// Element j (0 <= j < size(), in index order) has raw value load(j), scaled value
// scaled_of(load(j)) and token index index(j).
struct WholeRow {
    const float* logits;
    int vocab;
    float temperature;

    __device__ int size() const { return vocab; }
    __device__ float load(int j) const { return logits[j]; }
    __device__ float scaled_of(float raw) const { return scaled_logit(raw, temperature); }
    __device__ int index(int j) const { return j; }
};

struct CandidateSet {
    const float* s;
    const int* idx;
    int n;

    __device__ int size() const { return n; }
    __device__ float load(int j) const { return s[j]; }
    __device__ float scaled_of(float v) const { return v; }
    __device__ int index(int j) const { return idx[j]; }
};

// f(j, scaled value, valid) for every element of `src`, thread t taking j = t, t + kThreads, ...,
// kLoads of them loaded before any is used. Every thread calls f the same number of times (with
// valid false past the end), so f may hold warp-wide operations.
template <int kDepth = kLoads, class Src, class F>
__device__ __forceinline__ void for_each(const Src& src, F f) {
    const int n = src.size();
    for (int base = 0; base < n; base += kDepth * kThreads) {
        float v[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
            const int j = base + u * kThreads + static_cast<int>(threadIdx.x);
            v[u] = j < n ? src.load(j) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
            const int j = base + u * kThreads + static_cast<int>(threadIdx.x);
            f(j, src.scaled_of(v[u]), j < n);
        }
    }
}

// One digit of a radix selection over the keys of the elements in `set` whose key matches
// `prefix` above the digit. Walking the bins from the top, finds the bin where the running total
// (count, or mass when kByMass) first reaches `need`; returns it in sh.found_* (the total of the
// bins above it in found_below, its count in found_count).
template <bool kByMass, class Src>
__device__ void radix_digit(Shared& sh, const Src& src, float smax, uint32_t prefix, int shift, int bits,
                            uint32_t set_key, int set_index, uint64_t need) {
    const int bins = 1 << bits;
    const uint32_t high_mask = (shift + bits >= 32) ? 0u : (~0u << (shift + bits));
    for (int b = threadIdx.x; b < bins; b += kThreads) {
        sh.count[b] = 0;
        if (kByMass) sh.mass[b] = 0;
    }
    __syncthreads();
    // One load at a time: the histogram's warp-wide rounds, unrolled eight deep, made ptxas take
    // 8.0 s over this module instead of 1.1 on the GPU machine (the PTX path JIT-compiles it at
    // first load), for passes whose time is their arithmetic, not their loads.
    for_each<1>(src, [&](int j, float s, bool valid) {
        bool has = false;
        uint32_t bin = 0;
        uint64_t mass = 0;
        if (valid) {
            const uint32_t key = aot::logit_key(s);
            has = ((key ^ prefix) & high_mask) == 0 && in_prefix(key, src.index(j), set_key, set_index);
            bin = (key >> shift) & static_cast<uint32_t>(bins - 1);
            if (kByMass && has) {
                mass = aot::sample_mass(s, smax);
                has = mass != 0;  // a zero mass changes no sum
            }
        }
        histogram_add<kByMass>(sh, has, bin, mass);
    });
    __syncthreads();
    // Thread t owns descending positions [t * per, (t + 1) * per); position p is bin bins - 1 - p.
    const int per = bins / kThreads;
    uint64_t local = 0;
    for (int j = 0; j < per; ++j) {
        const int b = bins - 1 - (threadIdx.x * per + j);
        local += kByMass ? sh.mass[b] : sh.count[b];
    }
    uint64_t total;
    uint64_t below = block_exclusive_scan(local, sh.scratch, total);
    for (int j = 0; j < per; ++j) {
        const int b = bins - 1 - (threadIdx.x * per + j);
        const uint64_t h = kByMass ? sh.mass[b] : sh.count[b];
        if (below < need && need <= below + h) {
            sh.found_bin = static_cast<uint32_t>(b);
            sh.found_count = sh.count[b];
            sh.found_below = below;
        }
        below += h;
    }
    __syncthreads();
}

// The index of the n-th (1-based) element in index order whose key is `key`; n must not exceed
// their number. Each thread scans a contiguous chunk so that thread order is index order.
template <class Src>
__device__ int nth_index_with_key(Shared& sh, const Src& src, uint32_t key, uint32_t n) {
    const int size = src.size();
    const int chunk = (size + kThreads - 1) / kThreads;
    const int begin = min(size, static_cast<int>(threadIdx.x) * chunk);
    const int end = min(size, begin + chunk);
    uint32_t local = 0;
    for (int j = begin; j < end; ++j) local += aot::logit_key(src.scaled_of(src.load(j))) == key;
    uint64_t total;
    const uint64_t before = block_exclusive_scan(local, sh.scratch, total);
    if (before < n && n <= before + local) {
        uint64_t c = before;
        for (int j = begin; j < end; ++j) {
            if (aot::logit_key(src.scaled_of(src.load(j))) == key && ++c == n) {
                sh.found_index = src.index(j);
                break;
            }
        }
    }
    __syncthreads();
    const int found = sh.found_index;
    __syncthreads();
    return found;
}

// Rank order as one 64-bit value: the larger key first, then the lower index.
__device__ __forceinline__ uint64_t rank_word(uint32_t key, int i) {
    return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}

// The largest key of four logits.
__device__ __forceinline__ uint32_t max_key4(const float4& v) {
    return max(max(aot::logit_key(v.x), aot::logit_key(v.y)), max(aot::logit_key(v.z), aot::logit_key(v.w)));
}

// Greedy: the index of the largest raw logit, lowest index on ties, NaN below -inf (the rank
// order's first token). On a 16-byte aligned row each thread reads float4s q = tid, tid + 1024, ...
// kDepth at a time (one block streams the row from L2, so loads in flight are what its time is
// made of), keeps the largest key and the first quad that holds it, then finds the key's first
// lane in that quad; the scalar tail (and an unaligned row) go element by element. A maximum in
// any order is the same: the token does not depend on how the row was cut. (Element by element,
// a 64-bit word each, the row is mostly latency: one block has too few loads in flight.)
__device__ int greedy_token(const float* l, int vocab, uint64_t* scratch) {
    constexpr int kDepth = 8;
    uint64_t best = 0;
    int tail = 0;
    if ((reinterpret_cast<uintptr_t>(l) & 15u) == 0) {
        const float4* l4 = reinterpret_cast<const float4*>(l);
        const int quads = vocab / 4;
        uint32_t best_key = 0;
        int best_q = static_cast<int>(threadIdx.x) < quads ? static_cast<int>(threadIdx.x) : -1;
        for (int base = threadIdx.x; base < quads; base += kDepth * kThreads) {
            float4 v[kDepth];
#pragma unroll
            for (int j = 0; j < kDepth; ++j) {
                const int q = base + j * kThreads;
                if (q < quads) v[j] = l4[q];
            }
#pragma unroll
            for (int j = 0; j < kDepth; ++j) {
                const int q = base + j * kThreads;
                if (q < quads) {
                    const uint32_t k = max_key4(v[j]);
                    if (k > best_key) {
                        best_key = k;
                        best_q = q;
                    }
                }
            }
        }
        if (best_q >= 0) {
            // best_q is the thread's first quad whose largest key is best_key (0 if every value it
            // read was NaN: then its first quad, whose first lane is the lowest such index).
            const float4 v = l4[best_q];
            const float e[4] = {v.x, v.y, v.z, v.w};
            int lane4 = 3;
#pragma unroll
            for (int j = 2; j >= 0; --j) {
                if (aot::logit_key(e[j]) == best_key) lane4 = j;
            }
            best = rank_word(best_key, 4 * best_q + lane4);
        }
        tail = quads * 4;
    }
    for (int i = tail + threadIdx.x; i < vocab; i += kThreads) best = max(best, rank_word(aot::logit_key(l[i]), i));
    best = block_max(best, scratch);
    return static_cast<int>(~static_cast<uint32_t>(best));
}

// Copies the row's candidates (positive mass, and a key whose first digit, bits 31..21, is at
// least `bin_floor`: a prefix of the rank order) into sh.cand_*, in index order, and returns how
// many there are; past kCandidates it counts without copying (the passes then run over the row).
// The row goes by in tiles of kLoads x kThreads elements, element tile + u * kThreads + t in
// thread t's u-th load; a tile's counts per (load, warp) are scanned in that order, which is
// index order, and each lane adds its rank in its warp's ballot.
__device__ int gather_candidates(Shared& sh, const WholeRow& row, float smax, uint32_t bin_floor) {
    static_assert(kLoads * kWarps == 8 * 32, "one warp scans a tile's counts, eight per lane");
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    uint32_t* cnt = sh.count;                    // [kLoads][kWarps]: candidates per (load, warp)
    uint32_t* off = sh.count + kLoads * kWarps;  // the exclusive scan of cnt, in the same order
    int base = 0;                                // candidates in the tiles before
    for (int tile = 0; tile < row.vocab; tile += kLoads * kThreads) {
        float v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int j = tile + u * kThreads + static_cast<int>(threadIdx.x);
            v[u] = j < row.vocab ? row.load(j) : 0.0f;
        }
        unsigned ballot[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int j = tile + u * kThreads + static_cast<int>(threadIdx.x);
            v[u] = row.scaled_of(v[u]);
            const bool c = j < row.vocab && (aot::logit_key(v[u]) >> 21) >= bin_floor &&
                           aot::sample_mass(v[u], smax) != 0;
            ballot[u] = __ballot_sync(kFull, c);
            if (lane == 0) cnt[u * kWarps + warp] = __popc(ballot[u]);
        }
        __syncthreads();
        if (warp == 0) {
            uint32_t e[8];
            uint32_t sum = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                e[i] = cnt[8 * lane + i];
                sum += e[i];
            }
            uint32_t incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t y = __shfl_up_sync(kFull, incl, o);
                if (lane >= o) incl += y;
            }
            uint32_t run = incl - sum;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                off[8 * lane + i] = run;
                run += e[i];
            }
            if (lane == 31) sh.found_count = incl;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            if ((ballot[u] >> lane) & 1u) {
                const int pos = base + static_cast<int>(off[u * kWarps + warp]) + __popc(ballot[u] & ((1u << lane) - 1u));
                if (pos < kCandidates) {
                    sh.cand_s[pos] = v[u];
                    sh.cand_index[pos] = tile + u * kThreads + static_cast<int>(threadIdx.x);
                }
            }
        }
        base += static_cast<int>(sh.found_count);
        __syncthreads();  // every thread has read off and found_count before the next tile writes them
    }
    return base;
}

// Top-k, top-p and the draw over `src` (the whole row, or its candidates: the same thresholds and
// token, see the header); writes the token to *out. smax is the rank order's first scaled value
// (not -inf), top_key and top_index its key and index. Under top-k the kernel has taken the first
// digit over the row already: the k-th ranked key's bin `bin0` and the count above it `below0`
// (over the candidates the same: every token above the k-th ranked one is a candidate).
template <class Src>
__device__ void select_and_draw(Shared& sh, const Src& src, int vocab, float smax, uint32_t top_key, int top_index,
                                uint32_t k_param, uint32_t bin0, uint64_t below0, float p, uint64_t seed,
                                uint64_t counter, int* out) {
    // Radix digits over the 32-bit keys, most significant first: bits 31..21, 20..10, 9..0.
    constexpr int kShift[3] = {21, 10, 0};
    constexpr int kBits[3] = {11, 11, 10};

    // top-k: the first min(top_k, vocab) in rank order.
    uint32_t set_key = 0;  // every key is >= 0: with set_index = vocab - 1 this keeps everything
    int set_index = vocab - 1;
    const uint32_t kept = k_param > 0 ? min(k_param, static_cast<uint32_t>(vocab)) : static_cast<uint32_t>(vocab);
    if (kept < static_cast<uint32_t>(src.size())) {
        // kept < size <= vocab: top-k is on, and its first digit is known.
        uint32_t prefix = bin0 << kShift[0];
        uint64_t need = kept - below0;
        uint32_t ties = 0;
#pragma unroll
        for (int d = 1; d < 3; ++d) {
            radix_digit<false>(sh, src, smax, prefix, kShift[d], kBits[d], 0u, vocab - 1, need);
            prefix |= sh.found_bin << kShift[d];
            need -= sh.found_below;
            ties = sh.found_count;
            __syncthreads();
        }
        set_key = prefix;
        set_index = need < ties ? nth_index_with_key(sh, src, prefix, static_cast<uint32_t>(need)) : vocab - 1;
    }

    // top-p: the shortest rank-order prefix of the top-k set whose mass reaches ceil(top_p * Z_k).
    if (p < 1.0f) {
        uint64_t local = 0;
        for_each(src, [&](int j, float s, bool valid) {
            if (valid && in_prefix(aot::logit_key(s), src.index(j), set_key, set_index)) local += aot::sample_mass(s, smax);
        });
        uint64_t z_k;
        block_exclusive_scan(local, sh.scratch, z_k);
        const double c = ceil(__dmul_rn(static_cast<double>(p), static_cast<double>(z_k)));
        const uint64_t target = c > 0.0 ? static_cast<uint64_t>(c) : 0;
        if (target == 0) {
            set_key = top_key;
            set_index = top_index;
        } else {
            uint32_t prefix = 0;
            uint64_t need = target;
            uint32_t ties = 0;
            uint64_t tie_mass = 0;
#pragma unroll
            for (int d = 0; d < 3; ++d) {
                radix_digit<true>(sh, src, smax, prefix, kShift[d], kBits[d], set_key, set_index, need);
                prefix |= sh.found_bin << kShift[d];
                need -= sh.found_below;
                ties = sh.found_count;
                tie_mass = sh.mass[sh.found_bin];
                __syncthreads();
            }
            // Every tie has the same mass m = tie_mass / ties; ceil(need / m) of them are needed.
            const uint64_t m = tie_mass / ties;
            const uint64_t take = (need + m - 1) / m;
            int index;
            if (take < ties) {
                index = nth_index_with_key(sh, src, prefix, static_cast<uint32_t>(take));
            } else {
                index = prefix == set_key ? set_index : vocab - 1;
            }
            set_key = prefix;
            set_index = index;
        }
    }

    // The draw: t = floor(Z * u / 2^24), then the first kept token in index order whose cumulative
    // mass exceeds t. Thread chunks are contiguous, so the block scan is a scan in index order.
    const int size = src.size();
    const int chunk = (size + kThreads - 1) / kThreads;
    const int begin = min(size, static_cast<int>(threadIdx.x) * chunk);
    const int end = min(size, begin + chunk);
    uint64_t local = 0;
    for (int j = begin; j < end; ++j) {
        const float s = src.scaled_of(src.load(j));
        if (in_prefix(aot::logit_key(s), src.index(j), set_key, set_index)) local += aot::sample_mass(s, smax);
    }
    uint64_t z;
    const uint64_t before = block_exclusive_scan(local, sh.scratch, z);
    const uint64_t u = aot::random_u24(seed, kSampleStream, counter);
    const uint64_t lo = z * u;
    const uint64_t hi = __umul64hi(z, u);
    const uint64_t t = (hi << 40) | (lo >> 24);
    if (z == 0) {
        // Every kept mass is 0 (an infinite logit): the definition falls back to the top-ranked token.
        if (threadIdx.x == 0) *out = top_index;
    } else if (before <= t && t < before + local) {
        uint64_t cum = before;
        for (int j = begin; j < end; ++j) {
            const float s = src.scaled_of(src.load(j));
            if (in_prefix(aot::logit_key(s), src.index(j), set_key, set_index)) {
                cum += aot::sample_mass(s, smax);
                if (cum > t) {
                    *out = src.index(j);
                    break;
                }
            }
        }
    }
}

}  // namespace

// tokens[b] = the token sampled from row b of `logits` (vocab values, rows row_stride apart) under
// the row's temperature, top_k, top_p, seed and counter. Grid: one block of 1024 threads per row.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    sample_tokens(int* __restrict__ tokens, const float* __restrict__ logits, int vocab, int row_stride,
                  const float* __restrict__ temperature, const uint32_t* __restrict__ top_k,
                  const float* __restrict__ top_p, const uint64_t* __restrict__ seed,
                  const uint64_t* __restrict__ counter) {
    __shared__ Shared sh;
    const int b = blockIdx.x;
    const float* l = logits + static_cast<int64_t>(b) * row_stride;
    const float temp = temperature[b];
    const uint32_t k_param = top_k[b];

    if (temp == 0.0f || k_param == 1) {
        const int token = greedy_token(l, vocab, sh.scratch);
        if (threadIdx.x == 0) tokens[b] = token;
        return;
    }

    const WholeRow row{l, vocab, temp};
    // The top-ranked token and the largest scaled value.
    uint64_t best = 0;
    for_each(row, [&](int j, float s, bool valid) {
        if (valid) best = max(best, rank_word(aot::logit_key(s), j));
    });
    best = block_max(best, sh.scratch);
    const uint32_t top_key = static_cast<uint32_t>(best >> 32);
    const int top_index = static_cast<int>(~static_cast<uint32_t>(best));
    const float smax = row.scaled_of(row.load(top_index));
    if (smax == aot::neg_inf()) {
        if (threadIdx.x == 0) tokens[b] = top_index;
        return;
    }

    // Under top-k the candidates stop at the first digit of the k-th ranked key; they are
    // gathered where that digit's bins hold at most kCandidates tokens (a flat row's crowd
    // there, or no top-k, would make the gather a wasted pass).
    // The first digit is top-k's own first step, which then starts at the second.
    const float p = top_p[b];
    int n = kCandidates + 1;
    uint32_t bin0 = 0;
    uint64_t below0 = 0;
    if (k_param > 0 && k_param < static_cast<uint32_t>(vocab)) {
        radix_digit<false>(sh, row, smax, 0u, 21, 11, 0u, vocab - 1, k_param);
        bin0 = sh.found_bin;
        below0 = sh.found_below;
        if (below0 + sh.found_count <= static_cast<uint64_t>(kCandidates)) n = gather_candidates(sh, row, smax, bin0);
    }
    if (n <= kCandidates) {
        select_and_draw(sh, CandidateSet{sh.cand_s, sh.cand_index, n}, vocab, smax, top_key, top_index, k_param, bin0,
                        below0, p, seed[b], counter[b], tokens + b);
    } else {
        select_and_draw(sh, row, vocab, smax, top_key, top_index, k_param, bin0, below0, p, seed[b], counter[b],
                        tokens + b);
    }
}
