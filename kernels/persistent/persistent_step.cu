// The persistent step (issue 32): one launch, one block per SM, each block walking its own list of
// tasks. Dependencies are counters in global memory: a task may wait until a counter reaches a
// count (its producers' release-adds), and may add one to a counter when done. Weights never
// depend on activations, so each block's weight stream runs ahead of those waits: the bytes of the
// block's tasks, in list order, flow through a shared-memory ring of `stages` 16 KiB slots: the
// weights are packed so that a slot is one contiguous block (persistent_pack_bf16). On sm_90 and
// later a streaming warp keeps the ring full with one bulk copy a slot (the Tensor Memory
// Accelerator), waiting only for the math warps to release a slot; before (and in the compute_80
// PTX) the math threads copy the slots themselves with cp.async, stages - 1 ahead. Only the math
// waits on the counters.
//
// Task kinds (the host builds the lists: src/ops/persistent.rs, which mirrors Task and GemvOp):
//   kGemvTile  `rows` (8 or 16) output rows of a GEMV op, all of K: y[t][r] = sum_k w[r][k] * x[t][k]
//              for the op's m (1..8) token rows, then the op's epilogue.
//
// A slot holds a tile's `rows` rows by kc = 8192 / rows columns as boxes of [8 rows][256 columns]
// (4 KiB), box (cb, rg) for columns cb * 256 .. and rows rg * 8 .. at box index cb * rows / 8 + rg:
// the shape the Tensor Memory Accelerator copies. An op's weights are packed in that order
// (persistent_pack_bf16: a slot is one contiguous 16 KiB bulk copy) or are its row-major [n][k]
// tensor itself (no second copy of the model): on sm_90 and later four 2D tensor copies a slot
// through the op's tensor map (made by the host), rows and columns past the weights zero-filled. Its input is x itself, or RMSNorm(x) built in shared memory as the model rounds it
// (`bf16((w + offset) * bf16(x * rsqrt(mean(x^2) + eps)))`, the sum of squares taken by the block
// over the bf16 x it copied). Its epilogue (per output, every token row):
//   kStoreBf16 / kStoreF32  y
//   kResidual               out = bf16(out + bf16(y)): the residual stream, updated in place
//   kSiluMul                a 16-row tile holds 8 gate rows and the 8 up rows `pair` further on;
//                           out[j] = bf16(bf16(silu(bf16(gate_j))) * bf16(up_j))
// These are the launch-per-op GEMV's epilogues (kernels/gemv/gemv.cu), roundings included.
//
// The math runs on the tensor cores (mma.m16n8k16, as the decode GEMV: aot_mma.cuh). A tile's sum
// is fixed by its rows (8 or 16: part of the schedule's numeric contract) and K alone, never by the
// block that runs it, the block count or timing: each warp sums its chunks of every slot in K
// order, then warp 0 adds the warps in order. So a schedule over 132, 20 or 16 blocks, and one
// launch per op, give the same bits. (Not the launch-per-op GEMV's bits: its narrow tiles give each
// warp a contiguous slice of K.)
//
// Shared memory: the ring, then xs (the current task's x), then 4 KiB for the warps' fragments.
//
// Counters only grow: a launch of epoch e waits for `e * per_launch[c] + count`, so no launch
// needs them reset (the comparison is wrap-safe). The epoch is the launches done before this one,
// counted on the device (every block adds one to `launches` as it leaves; thread 0 reads the count
// once the previous kernel has finished, when fewer than gridDim.x blocks of its own launch can
// have left): a CUDA graph replays the launch unchanged.
//
// Programmatic launch (sm_90 and later): the math threads wait for the previous kernel
// (griddepcontrol.wait) before reading any activation; the weight stream starts before that.
//
// Stamps (`stamps` not null, a diagnostic run): at the first task of each run, thread 0 writes six
// words: %globaltimer before the counter wait, after it, once x is in shared memory, at the run's
// end, the nanoseconds the run's math waited for weight slots, and the block index.
//
// A block's consecutive tiles of one op form a run: its first tile waits for the op's counter and
// copies x ([m][k] bf16, written by other blocks) into shared memory behind the ring (the host
// sizes the ring to what is left); its last tile adds the run's length to the op's counter.
//
// Descriptors: the math warps and the streaming warp read each tile's task a tile ahead and copy
// its op's descriptor into registers at a run's start, so a tile of few slots (or a row-major
// slot's four box copies, each behind an asm statement that clobbers memory) does not wait on
// reloads of them.
//
// Co-residency: a block spins on counters that other blocks advance, so every block must be
// resident at once: the host launches at most one block per SM, with the ring sized so that one
// block fits an SM.
#include "aot_bulk.cuh"
#include "aot_common.cuh"
#include "aot_mma.cuh"

namespace aot_persistent {

constexpr int kThreads = 256;
constexpr int kStageBytes = 16384;
constexpr int kMaxStages = 12;
constexpr int kStampWords = 6;
constexpr int kBoxRows = 8, kBoxCols = 256;

enum Kind : unsigned { kGemvTile = 1 };
enum Layout : int { kPacked = 0, kRowMajor = 1 };
enum Input : int { kPlain = 0, kNorm = 1 };
enum Epilogue : int { kStoreBf16 = 0, kStoreF32 = 1, kResidual = 2, kSiluMul = 3 };

// Mirrored by `Task` in src/ops/persistent.rs (repr(C), 32 bytes).
struct Task {
    unsigned kind;
    int wait_counter;    // -1: none
    unsigned wait_count;  // per launch
    int signal_counter;  // -1: none
    unsigned op;         // index into the GemvOp table
    unsigned row0;       // the tile's first output row (a kSiluMul op's rows: 8 gate rows, then 8 up rows)
    unsigned rows;       // 8 or 16
    unsigned signal_add;  // what this task adds to signal_counter when done: a run of one op's
                          // tiles in a block signals once, at its last tile (0 before)
};

// Mirrored by `GemvOpRaw` in src/ops/persistent.rs (repr(C), 88 bytes).
struct GemvOp {
    const __nv_bfloat16* w;       // kPacked: slot-sized [rows][kc] blocks, tile by tile; kRowMajor: [n][k]
    const __nv_bfloat16* x;       // [m][ld_x]
    void* out;                    // [m][ld_out], bf16 (f32 for kStoreF32)
    const __nv_bfloat16* norm_w;  // kNorm: [k]
    const void* tmap;             // kRowMajor: a CUtensorMap of w ([n][k] bf16, boxes of 8 x 256)
    int n, k, m, ld_x, ld_out;
    int layout, input, epilogue;
    int pair;  // kSiluMul: the up rows' offset (the intermediate size); n = 2 * pair
    float eps, w_offset;
    int pad_;
};

// Mirrored by `StepParams` in src/ops/persistent.rs.
struct StepParams {
    const Task* tasks;
    const unsigned* begin;        // [blocks + 1]: block b runs tasks[begin[b] .. begin[b + 1])
    const GemvOp* ops;
    unsigned* counters;
    const unsigned* per_launch;   // [counters]: adds one launch makes to each counter
    unsigned long long* launches;  // blocks that have left, over every launch of this schedule
    unsigned long long* stamps;   // null, or [tasks][kStampWords]
    int stages;                   // ring slots, 3..12, as many as the SM's shared memory admits
    int x_vectors;                // 16-byte vectors of xs (the largest task's x, [m][k] bf16)
};

// Waits until at most `n` (0..10) groups are pending; wait_group takes a constant.
__device__ __forceinline__ void cp_async_wait_pending(int n) {
    switch (n) {
        case 1: aot::cp_async_wait<1>(); break;
        case 2: aot::cp_async_wait<2>(); break;
        case 3: aot::cp_async_wait<3>(); break;
        case 4: aot::cp_async_wait<4>(); break;
        case 5: aot::cp_async_wait<5>(); break;
        case 6: aot::cp_async_wait<6>(); break;
        case 7: aot::cp_async_wait<7>(); break;
        case 8: aot::cp_async_wait<8>(); break;
        case 9: aot::cp_async_wait<9>(); break;
        case 10: aot::cp_async_wait<10>(); break;
        default: aot::cp_async_wait<0>(); break;
    }
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Launches of this schedule before this one: blocks that have left, over the grid. Read after the
// previous kernel has finished (pdl_wait), when no block of this launch has left yet but those that
// finished before this one started, fewer than gridDim.x.
__device__ __forceinline__ unsigned launch_epoch(const StepParams& p) {
    return static_cast<unsigned>(*reinterpret_cast<volatile unsigned long long*>(p.launches) / gridDim.x);
}

// Columns of K a stage of a `rows`-row tile covers.
__device__ __forceinline__ int stage_cols(unsigned rows) { return kStageBytes / 2 / static_cast<int>(rows); }

__device__ __forceinline__ int stages_of(const Task& t, const GemvOp* ops) {
    const int kc = stage_cols(t.rows);
    return (ops[t.op].k + kc - 1) / kc;
}

// The weight row that row `r` of the tile at `row0` holds, or -1 past the weights: row0 + r, or for
// a kSiluMul op gate row j (r < rows / 2) and up row pair + j (the rest), j = row0 / 2 + r % (rows / 2).
__device__ __forceinline__ int source_row(int n, int pair, int rows, int row0, int r) {
    if (pair == 0) return row0 + r < n ? row0 + r : -1;
    const int half = rows / 2;
    const int j = row0 / 2 + (r < half ? r : r - half);
    return j < pair ? (r < half ? j : pair + j) : -1;
}

// Where 16-byte piece `v` of a slot of a `rows`-row tile sits in the tile: row and column within the
// slot (the box order above).
__device__ __forceinline__ void slot_piece(int v, int rows, int& r, int& c) {
    const int box = v / (kBoxRows * kBoxCols / 8), within = v - box * (kBoxRows * kBoxCols / 8);
    const int groups = rows / kBoxRows;
    const int cb = box / groups, rg = box - cb * groups;
    r = rg * kBoxRows + within / (kBoxCols / 8);
    c = cb * kBoxCols + (within % (kBoxCols / 8)) * 8;
}

// Where the block's stream stands: task index and stage within it.
struct Cursor {
    unsigned task, end;
    int stage, stages;
};

__device__ __forceinline__ void advance(Cursor& c, const Task* tasks, const GemvOp* ops) {
    if (++c.stage >= c.stages) {
        c.stage = 0;
        ++c.task;
        c.stages = c.task < c.end ? stages_of(tasks[c.task], ops) : 0;
    }
}

// Where stage `stage` of the tile at `row0` starts in packed weights: the tile's slot-sized
// blocks follow each other, tile after tile.
__device__ __forceinline__ const uint4* packed_slot(const GemvOp& op, const Task& t, int stage) {
    const int per_tile = (op.k + stage_cols(t.rows) - 1) / stage_cols(t.rows);
    const int64_t block = static_cast<int64_t>(t.row0 / t.rows) * per_tile + stage;
    return reinterpret_cast<const uint4*>(op.w) + block * (kStageBytes / 16);
}

// The cp.async path (before sm_90): copies stage `c` into `slot`, every math thread a share of the
// 16-byte pieces (pieces past the weights zero-filled), and commits one group (empty past the last
// task, to keep the count).
__device__ __forceinline__ void issue(const Cursor& c, const Task* tasks, const GemvOp* ops, uint4* slot) {
    if (c.task < c.end) {
        const Task t = tasks[c.task];
        const GemvOp& op = ops[t.op];
        if (op.layout == kPacked) {
            const uint4* src = packed_slot(op, t, c.stage);
            for (int p = threadIdx.x; p < kStageBytes / 16; p += kThreads) {
                aot::cp_async_16(static_cast<unsigned>(__cvta_generic_to_shared(slot + p)), src + p, true);
            }
        } else {
            const int kc = stage_cols(t.rows);
            for (int p = threadIdx.x; p < kStageBytes / 16; p += kThreads) {
                int r, cs;
                slot_piece(p, static_cast<int>(t.rows), r, cs);
                const int col = c.stage * kc + cs;
                const int row = source_row(op.n, op.pair, static_cast<int>(t.rows), static_cast<int>(t.row0), r);
                const bool ok = row >= 0 && col < op.k;
                const __nv_bfloat16* src = ok ? op.w + static_cast<int64_t>(row) * op.k + col : op.w;
                aot::cp_async_16(static_cast<unsigned>(__cvta_generic_to_shared(slot + p)), src, ok);
            }
        }
    }
    aot::cp_async_commit();
}

// Mirrored by `PackParams` in src/ops/persistent.rs.
struct PackParams {
    const __nv_bfloat16* src;  // [n][k] row-major
    __nv_bfloat16* dst;        // tiles x ceil(k / kc) slots of [rows][kc]
    int n, k, rows, pair;      // pair: as GemvOp::pair (0: none)
};

}  // namespace aot_persistent

namespace aot_persistent {

// The 256 math threads' own barrier (the streaming warp never joins it).
__device__ __forceinline__ void math_barrier() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// The math of one slot (`rows` rows of kc columns in boxes of 8 x 256, in 32-column chunks): warp w
// takes chunks [w * per, (w + 1) * per) (per: 2 for 16-row tiles, 4 for 8-row ones, whose rows
// g + 8 are zeros). Each lane feeds the 8 elements it loads to both k16 steps of a chunk, x the same
// 8 positions of token g (aot_mma.cuh says why any such order is fine). Weights past K are zeros in
// the slot (packed so, zero-filled by the copies); x is read only within K.
__device__ __forceinline__ void slot_math(float (&acc)[4], const uint4* s, const __nv_bfloat16* xs, const GemvOp& op,
                                          bool two, int k0) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int per = two ? 2 : 4;
    const int groups = two ? 2 : 1;  // row groups of 8 a box column holds
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
        if (cc >= per) break;
        const int chunk = warp * per + cc;
        const int col = k0 + chunk * 32 + tq * 8;
        // Box (chunk / 8, row group) holds 8 rows of 32 pieces; the lane's piece is (chunk % 8) * 4 + tq.
        const int piece = ((chunk >> 3) * groups * kBoxRows + g) * (kBoxCols / 8) + (chunk & 7) * 4 + tq;
        const uint4 lo = s[piece];
        const uint4 hi = two ? s[piece + kBoxRows * kBoxCols / 8] : zero;
        const uint4 xv = g < op.m && col < op.k ? *reinterpret_cast<const uint4*>(xs + g * op.k + col) : zero;
        aot::mma_chunk32(acc, lo, hi, xv);
    }
}

// RMSNorm of the m rows of x in xs, in place: warp q sums row q's squares, then every thread
// rebuilds its share as bf16((w + offset) * bf16(x * scale)). `scale` is the (free) fragment area.
__device__ __forceinline__ void norm_in_place(const GemvOp& op, __nv_bfloat16* xs, float* scale) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int vec_per_x = op.k / 8;
    if (warp < op.m) {
        float sum = 0.0f;
        for (int v = lane; v < vec_per_x; v += 32) {
            float f[8];
            aot::unpack8(reinterpret_cast<const uint4*>(xs)[warp * vec_per_x + v], f);
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += f[j] * f[j];
        }
        sum = aot::warp_sum(sum);
        if (lane == 0) scale[warp] = rsqrtf(sum / static_cast<float>(op.k) + op.eps);
    }
    math_barrier();
    for (int i = threadIdx.x; i < op.m * vec_per_x; i += kThreads) {
        const int q = i / vec_per_x, v = i - q * vec_per_x;
        float f[8], w[8];
        aot::unpack8(reinterpret_cast<const uint4*>(xs)[i], f);
        aot::unpack8(aot::ld_cached16(op.norm_w + v * 8), w);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = (w[j] + op.w_offset) * aot::round_bf16(f[j] * scale[q]);
        reinterpret_cast<uint4*>(xs)[i] = aot::pack8(f);
    }
}

// A run's start (a task whose op differs from the block's task before it): thread 0 waits for its
// counter, then its x, written by other blocks of this launch, is copied from L2 into xs (normed
// there for a kNorm op), which the run's later tiles reuse. Every math thread is past the last
// task's use of xs and of the fragments. On the bulk path (`xbar` not null) thread 0 copies each
// of the m rows with one bulk copy that completes on `xbar` (its phase `xphase`), so the whole x is
// in flight at once: the math threads' 16-byte copies (four a thread in flight, as the compiler
// unrolls them) kept the L2's latency on the path at every run, 300 KB a layer at eight rows.
// Before them, every math thread's proxy fence orders its earlier writes to xs (a norm) before the
// copies' writes, and thread 0's orders the other blocks' stores, acquired through the counter,
// before the copies' reads (the async proxy). The cp.async path copies with the math threads.
__device__ __forceinline__ void task_start(const StepParams& p, unsigned epoch, unsigned ti, const Task& t,
                                           const GemvOp& op, __nv_bfloat16* xs, float* scale, uint64_t* xbar,
                                           unsigned& xphase) {
    unsigned long long* stamp = p.stamps ? p.stamps + static_cast<int64_t>(ti) * kStampWords : nullptr;
    if (threadIdx.x == 0) {
        if (stamp) stamp[0] = now_ns();
        if (t.wait_counter >= 0) {
            const unsigned target = epoch * p.per_launch[t.wait_counter] + t.wait_count;
            while (static_cast<int>(ld_acquire(p.counters + t.wait_counter) - target) < 0) __nanosleep(32);
        }
        if (stamp) stamp[1] = now_ns();
    }
#if AOT_HAS_BULK
    // Each math thread's own writes to xs (the last run's norm) ordered before the bulk copies
    // that overwrite it (the async proxy), which thread 0 issues after the barrier.
    if (xbar != nullptr) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    math_barrier();
#if AOT_HAS_BULK
    if (xbar != nullptr) {
        if (threadIdx.x == 0) {
            asm volatile("fence.proxy.async.global;" ::: "memory");
            const unsigned row_bytes = static_cast<unsigned>(op.k) * 2;
            aot::mbar_arrive_expect_tx(xbar, row_bytes * static_cast<unsigned>(op.m));
            for (int q = 0; q < op.m; ++q) {
                aot::bulk_g2s(xs + static_cast<int64_t>(q) * op.k, op.x + static_cast<int64_t>(q) * op.ld_x, row_bytes,
                              xbar);
            }
        }
        aot::mbar_wait(xbar, xphase);
        xphase ^= 1;
    } else
#endif
    {
        const int vec_per_x = op.k / 8;
        for (int i = threadIdx.x; i < op.m * vec_per_x; i += kThreads) {
            const int q = i / vec_per_x, v = i - q * vec_per_x;
            reinterpret_cast<uint4*>(xs)[i] =
                __ldcg(reinterpret_cast<const uint4*>(op.x + static_cast<int64_t>(q) * op.ld_x) + v);
        }
        math_barrier();
    }
    if (op.input == kNorm) {
        norm_in_place(op, xs, scale);
        math_barrier();
    }
    if (stamp && threadIdx.x == 0) stamp[2] = now_ns();
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Named barrier 2 (the bulk path): warp 0 arrives once it has read a tile's fragments; warps 1-7
// wait for that before they store the next tile's, so no fragment is overwritten while warp 0
// still reads it. The cp.async path needs none: every slot's barrier already orders the two.
__device__ __forceinline__ void fragments_free_wait() { asm volatile("bar.sync 2, 256;" ::: "memory"); }
__device__ __forceinline__ void fragments_free_arrive() { asm volatile("bar.arrive 2, 256;" ::: "memory"); }

// A task's end: the warps' fragments added in warp order by warp 0, which applies the op's
// epilogue and adds the run's length to the task's counter at a run's last tile. On the bulk path
// (barrier 2 above): `wait_free` if warp 0 read an earlier tile's fragments in this block,
// `arrive_free` if a later tile follows (so that the barrier's arrivals match its waits).
__device__ __forceinline__ void task_end(const StepParams& p, const Task& t, const GemvOp& op, const float (&acc)[4],
                                         float4* red, bool wait_free, bool arrive_free) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    if (wait_free && warp != 0) fragments_free_wait();
    red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    math_barrier();
    if (warp != 0) return;
    float4 sum = red[lane];
    for (int w = 1; w < kThreads / 32; ++w) {
        const float4 v = red[w * 32 + lane];
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
    }
    if (arrive_free) fragments_free_arrive();
    // vals[i]: row g + (i / 2) * 8 of the tile, token 2 tq + i % 2.
    const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
    if (op.epilogue == kSiluMul) {
        // Gate row g and up row g + 8 of the tile are this lane's: intermediate column row0 / 2 + g.
        const int col = static_cast<int>(t.row0) / 2 + g;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int q = 2 * tq + i;
            if (col < op.pair && q < op.m) {
                const float gate = aot::round_bf16(vals[i]);
                const float up = aot::round_bf16(vals[i + 2]);
                reinterpret_cast<__nv_bfloat16*>(op.out)[static_cast<int64_t>(q) * op.ld_out + col] =
                    __float2bfloat16_rn(aot::round_bf16(silu(gate)) * up);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = g + (i >> 1) * 8, q = 2 * tq + (i & 1);
            const int row = static_cast<int>(t.row0) + r;
            if (r < static_cast<int>(t.rows) && row < op.n && q < op.m) {
                const int64_t at = static_cast<int64_t>(q) * op.ld_out + row;
                if (op.epilogue == kStoreF32) {
                    reinterpret_cast<float*>(op.out)[at] = vals[i];
                } else if (op.epilogue == kResidual) {
                    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(op.out);
                    h[at] = __float2bfloat16_rn(aot::round_bf16(vals[i]) + aot::to_f32(h[at]));
                } else {
                    reinterpret_cast<__nv_bfloat16*>(op.out)[at] = __float2bfloat16_rn(vals[i]);
                }
            }
        }
    }
    // The release-add orders the warp's stores before it (the __syncwarp made them lane 0's to
    // order): no separate fence.
    __syncwarp();
    if (t.signal_counter >= 0 && t.signal_add > 0 && lane == 0) {
        red_release_add(p.counters + t.signal_counter, t.signal_add);
    }
}

#if AOT_HAS_BULK
// mbarrier waits and arrivals at a shared-memory address computed once (aot_bulk.cuh's take a
// generic pointer and convert it at every call, inside the slot loop).
__device__ __forceinline__ void mbar_wait_at(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive_at(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// One box of the tensor map `tmap` (in global memory), at column `c` and row `r` of the tensor,
// into shared memory at `dst`; completion counts against `bar`'s expected bytes (the whole box,
// zero-filled past the tensor).
__device__ __forceinline__ void tma_box(void* dst, const void* tmap, int c, int r, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            aot::smem_u32(dst)),
        "l"(tmap), "r"(c), "r"(r), "r"(aot::smem_u32(bar))
        : "memory");
}
#endif

// A run's stamps at its last task: its end, its weight wait and the block.
__device__ __forceinline__ void stamp_end(const StepParams& p, unsigned long long run_start,
                                          unsigned long long weight_wait) {
    unsigned long long* stamp = p.stamps + run_start * kStampWords;
    stamp[3] = now_ns();
    stamp[4] = weight_wait;
    stamp[5] = blockIdx.x;
}

#if AOT_HAS_BULK
// The math warps on sm_90 and later: every task of the block, each slot taken when its bulk copy
// has landed and released to the streaming warp when every warp's math on it is done. kStamp: a
// stamped launch (thread 0 times the slot waits).
template <bool kStamp>
__device__ __forceinline__ void bulk_math(const StepParams& p, unsigned epoch, unsigned begin, unsigned end,
                                          const uint4* ring, __nv_bfloat16* xs, float4* red, float* scale,
                                          uint64_t* full, uint64_t* empty, uint64_t* xbar) {
    constexpr int kSlot = kStageBytes / 16;
    const int lane = threadIdx.x & 31;
    const int stages = p.stages;
    const unsigned full0 = aot::smem_u32(full), empty0 = aot::smem_u32(empty);
    unsigned long long run_start = 0, weight_wait = 0;
    int slot = 0;          // the ring slot the next stage lands in
    unsigned phase = 0;    // the parity of that slot's current fill
    unsigned xphase = 0;   // the parity of xbar's next fill (one a run)
    // The tile's descriptor is read a tile ahead, and its op's only at a run's start, so that a
    // tile of few slots does not wait on their loads.
    Task t = begin < end ? p.tasks[begin] : Task{};
    GemvOp op{};
    unsigned run_op = 0;
    for (unsigned ti = begin; ti < end; ++ti) {
        const Task next = ti + 1 < end ? p.tasks[ti + 1] : t;  // read now, used at the next tile
        if (ti == begin || t.op != run_op) {
            op = p.ops[t.op];
            run_op = t.op;
            task_start(p, epoch, ti, t, op, xs, scale, xbar, xphase);
            run_start = ti;
            weight_wait = 0;
        }
        const bool two = t.rows == 16;
        const int kc = stage_cols(t.rows);
        const int per_tile = (op.k + kc - 1) / kc;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int st = 0; st < per_tile; ++st) {
            if (kStamp && threadIdx.x == 0) {
                const unsigned long long t0 = now_ns();
                mbar_wait_at(full0 + 8 * slot, phase);
                weight_wait += now_ns() - t0;
            } else {
                mbar_wait_at(full0 + 8 * slot, phase);
            }
            slot_math(acc, ring + slot * kSlot, xs, op, two, st * kc);
            __syncwarp();
            if (lane == 0) mbar_arrive_at(empty0 + 8 * slot);
            if (++slot == stages) {
                slot = 0;
                phase ^= 1;
            }
        }
        task_end(p, t, op, acc, red, ti > begin, ti + 1 < end);
        if (kStamp && threadIdx.x == 0 && t.signal_add > 0) stamp_end(p, run_start, weight_wait);

        t = next;
    }
}
#else
// The math threads before sm_90 (and in the compute_80 PTX): they copy the slots themselves with
// cp.async, stages - 1 ahead of the math.
template <bool kStamp>
__device__ __forceinline__ void copy_math(const StepParams& p, unsigned epoch, unsigned begin, unsigned end,
                                          uint4* ring, __nv_bfloat16* xs, float4* red, float* scale) {
    constexpr int kSlot = kStageBytes / 16;
    const int stages = p.stages;
    unsigned long long run_start = 0, weight_wait = 0;
    Cursor fetch{begin, end, 0, 0};
    fetch.stages = fetch.task < fetch.end ? stages_of(p.tasks[fetch.task], p.ops) : 0;
    // The prologue: stages - 1 slots in flight.
    for (int s = 0; s < stages - 1; ++s) {
        issue(fetch, p.tasks, p.ops, ring + s * kSlot);
        if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);
    }
    int slot = 0;
    unsigned xphase = 0;  // unused: the math threads copy x themselves here
    // The tile's descriptor is read a tile ahead, and its op's only at a run's start, so that a
    // tile of few slots does not wait on their loads.
    Task t = begin < end ? p.tasks[begin] : Task{};
    GemvOp op{};
    unsigned run_op = 0;
    for (unsigned ti = begin; ti < end; ++ti) {
        const Task next = ti + 1 < end ? p.tasks[ti + 1] : t;  // read now, used at the next tile
        if (ti == begin || t.op != run_op) {
            op = p.ops[t.op];
            run_op = t.op;
            task_start(p, epoch, ti, t, op, xs, scale, nullptr, xphase);
            run_start = ti;
            weight_wait = 0;
        }
        const bool two = t.rows == 16;
        const int kc = stage_cols(t.rows);
        const int per_tile = (op.k + kc - 1) / kc;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int st = 0; st < per_tile; ++st) {
            // This slot's copies are done (stages - 2 newer groups may still be in flight), and
            // every math thread is past the math of the slot about to be refilled.
            const unsigned long long t0 = kStamp && threadIdx.x == 0 ? now_ns() : 0;
            cp_async_wait_pending(stages - 2);
            math_barrier();
            if (kStamp && threadIdx.x == 0) weight_wait += now_ns() - t0;
            issue(fetch, p.tasks, p.ops, ring + ((slot + stages - 1) % stages) * kSlot);
            if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);
            slot_math(acc, ring + slot * kSlot, xs, op, two, st * kc);
            slot = (slot + 1) % stages;
        }
        task_end(p, t, op, acc, red, false, false);
        if (kStamp && threadIdx.x == 0 && t.signal_add > 0) stamp_end(p, run_start, weight_wait);

        t = next;
    }
    aot::cp_async_wait<0>();
}
#endif

}  // namespace aot_persistent

// 256 math threads (8 warps) and, on sm_90 and later, one streaming warp that keeps the ring full
// with bulk copies: it waits only for a slot to be emptied (each math warp releases a slot when
// its math on it is done), never for the math's counters. Before sm_90 (and in the compute_80 PTX)
// the math threads copy the slots themselves with cp.async, stages - 1 ahead, and the extra warp
// leaves at once.
extern "C" __global__ void __launch_bounds__(aot_persistent::kThreads + 32, 1)
    persistent_step(const aot_persistent::StepParams p) {
    using namespace aot_persistent;
    // [p.stages][kStageBytes / 16] of weights, then the current task's x ([m][k] bf16), then each
    // math warp's fragment.
    extern __shared__ __align__(128) uint4 ring[];
    const int stages = p.stages;
    constexpr int kSlot = kStageBytes / 16;
    __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(ring + stages * kSlot);
    float4* red = reinterpret_cast<float4*>(ring + stages * kSlot + p.x_vectors);
    float* scale = reinterpret_cast<float*>(red);
    const int warp = threadIdx.x >> 5;
    const unsigned begin = p.begin[blockIdx.x], end = p.begin[blockIdx.x + 1];
    if (stages < 3 || stages > kMaxStages) __trap();  // the host sizes the ring within these
#if AOT_HAS_BULK
    const int lane = threadIdx.x & 31;
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages], xbar;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            aot::mbar_init(&full[s], 1);
            aot::mbar_init(&empty[s], kThreads / 32);
        }
        aot::mbar_init(&xbar, 1);
        aot::mbar_init_fence();
    }
    __syncthreads();
    if (warp == kThreads / 32) {
        // The streaming warp's lane 0: every slot of every task of the block, in order: it waits
        // for the slot to be emptied, announces its bytes and issues its copies (a packed slot is
        // one copy, a row-major one a copy per row).
        if (lane == 0) {
            const unsigned full0 = aot::smem_u32(full), empty0 = aot::smem_u32(empty);
            int slot = 0;         // the slot to fill next
            unsigned round = 0;   // its fills before this one: from the second on, wait until emptied
            // As the math's: the next tile's descriptor read a tile ahead, an op's at a run's start.
            Task t = begin < end ? p.tasks[begin] : Task{};
            GemvOp op{};
            unsigned op_of_run = 0;
            for (unsigned ti = begin; ti < end; ++ti) {
                const Task next = ti + 1 < end ? p.tasks[ti + 1] : t;
                if (ti == begin || t.op != op_of_run) {
                    op = p.ops[t.op];
                    op_of_run = t.op;
                }
                const int kc = stage_cols(t.rows);
                const int per_tile = (op.k + kc - 1) / kc;
                const bool packed = op.layout == kPacked;
                const int groups = static_cast<int>(t.rows) / kBoxRows;
                for (int st = 0; st < per_tile; ++st) {
                    if (round > 0) mbar_wait_at(empty0 + 8 * slot, (round - 1) & 1);
                    uint64_t* bar = &full[slot];
                    aot::mbar_arrive_expect_tx(bar, kStageBytes);
                    if (packed) {
                        aot::bulk_g2s(ring + slot * kSlot, packed_slot(op, t, st), kStageBytes, bar);
                    } else {
                        // Box (cb, rg) from the tensor's rows of row group rg (a kSiluMul tile's
                        // second group: the up rows) and columns st * kc + cb * 256.
                        for (int cb = 0; cb < kc / kBoxCols; ++cb) {
                            for (int rg = 0; rg < groups; ++rg) {
                                const int row0 = op.pair == 0 ? static_cast<int>(t.row0) + rg * kBoxRows
                                                              : (rg == 0 ? 0 : op.pair) + static_cast<int>(t.row0) / 2;
                                tma_box(ring + slot * kSlot + (cb * groups + rg) * (kBoxRows * kBoxCols / 8), op.tmap,
                                        st * kc + cb * kBoxCols, row0, bar);
                            }
                        }
                    }
                    if (++slot == stages) {
                        slot = 0;
                        ++round;
                    }
                }
                t = next;
            }
        }
        return;
    }
    aot::pdl_wait();
    const unsigned epoch = threadIdx.x == 0 ? launch_epoch(p) : 0;  // thread 0 does the waits
    if (p.stamps) {
        bulk_math<true>(p, epoch, begin, end, ring, xs, red, scale, full, empty, &xbar);
    } else {
        bulk_math<false>(p, epoch, begin, end, ring, xs, red, scale, full, empty, &xbar);
    }
#else
    if (warp == kThreads / 32) return;
    aot::pdl_wait();
    const unsigned epoch = threadIdx.x == 0 ? launch_epoch(p) : 0;  // thread 0 does the waits
    if (p.stamps) {
        copy_math<true>(p, epoch, begin, end, ring, xs, red, scale);
    } else {
        copy_math<false>(p, epoch, begin, end, ring, xs, red, scale);
    }
#endif
    // The block has left: the next launch's blocks count this one (math thread 0, after its
    // block's last signal).
    if (threadIdx.x == 0) atomicAdd(p.launches, 1ull);
}

// Packs a row-major [n][k] weight into the slots the step streams: tile i (rows i * rows ..,
// through source_row), stage s (columns s * kc ..) is slot i * ceil(k / kc) + s, its [rows][kc]
// block in boxes of 8 x 256 (slot_piece); rows past the weights and columns past k are zeros. Every 16-byte piece is
// one thread's, grid-stride.
extern "C" __global__ void __launch_bounds__(256) persistent_pack_bf16(const aot_persistent::PackParams p) {
    using namespace aot_persistent;
    const int kc = kStageBytes / 2 / p.rows;
    const int per_tile = (p.k + kc - 1) / kc;
    const int tiles = (p.n + p.rows - 1) / p.rows;
    const int64_t pieces = static_cast<int64_t>(tiles) * per_tile * (kStageBytes / 16);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t slot = i / (kStageBytes / 16);
        const int within = static_cast<int>(i - slot * (kStageBytes / 16));
        const int tile = static_cast<int>(slot / per_tile), stage = static_cast<int>(slot - static_cast<int64_t>(tile) * per_tile);
        int r, cs;
        slot_piece(within, p.rows, r, cs);
        const int row = source_row(p.n, p.pair, p.rows, tile * p.rows, r), col = stage * kc + cs;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row >= 0 && col < p.k) val = *reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(row) * p.k + col);
        reinterpret_cast<uint4*>(p.dst)[i] = val;
    }
}
