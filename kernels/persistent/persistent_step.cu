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
//   kGemvTile  `rows` (8 or 16) output rows of a GEMV op, all of K:
//              out[t][r] = bf16(sum_k w[r][k] * x[t][k]) for the op's m (1..8) token rows.
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
// needs them reset (the comparison is wrap-safe).
//
// A block's consecutive tiles of one op form a run: its first tile waits for the op's counter and
// copies x ([m][k] bf16, written by other blocks) into shared memory behind the ring (the host
// sizes the ring to what is left); its last tile adds the run's length to the op's counter.
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

enum Kind : unsigned { kGemvTile = 1 };

// Mirrored by `Task` in src/ops/persistent.rs (repr(C), 32 bytes).
struct Task {
    unsigned kind;
    int wait_counter;    // -1: none
    unsigned wait_count;  // per launch
    int signal_counter;  // -1: none
    unsigned op;         // index into the GemvOp table
    unsigned row0;       // the tile's first output row
    unsigned rows;       // 8 or 16
    unsigned signal_add;  // what this task adds to signal_counter when done: a run of one op's
                          // tiles in a block signals once, at its last tile (0 before)
};

// Mirrored by `GemvOp` in src/ops/persistent.rs (repr(C), 48 bytes).
struct GemvOp {
    const __nv_bfloat16* w;  // packed (persistent_pack_bf16): slot-sized [rows][kc] blocks, tile by tile
    const __nv_bfloat16* x;  // [m][ld_x]
    __nv_bfloat16* out;      // [m][ld_out]
    int n, k, m, ld_x, ld_out, pad_;
};

// Mirrored by `StepParams` in src/ops/persistent.rs.
struct StepParams {
    const Task* tasks;
    const unsigned* begin;        // [blocks + 1]: block b runs tasks[begin[b] .. begin[b + 1])
    const GemvOp* ops;
    unsigned* counters;
    const unsigned* per_launch;   // [counters]: adds one launch makes to each counter
    unsigned epoch;               // launches before this one (with these counters)
    int stages;                   // ring slots, 3..12, as many as the SM's shared memory admits
    int x_vectors;                // 16-byte vectors of xs (the largest task's x, [m][k] bf16)
    int pad_;
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

// Columns of K a stage of a `rows`-row tile covers.
__device__ __forceinline__ int stage_cols(unsigned rows) { return kStageBytes / 2 / static_cast<int>(rows); }

__device__ __forceinline__ int stages_of(const Task& t, const GemvOp* ops) {
    const int kc = stage_cols(t.rows);
    return (ops[t.op].k + kc - 1) / kc;
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

// Where stage `stage` of the tile at `row0` starts in the packed weights: the tile's slot-sized
// blocks follow each other, tile after tile.
__device__ __forceinline__ const uint4* packed_slot(const GemvOp& op, const Task& t, int stage) {
    const int per_tile = (op.k + stage_cols(t.rows) - 1) / stage_cols(t.rows);
    const int64_t block = static_cast<int64_t>(t.row0 / t.rows) * per_tile + stage;
    return reinterpret_cast<const uint4*>(op.w) + block * (kStageBytes / 16);
}

// The cp.async path (before sm_90): copies stage `c` (one contiguous slot of the packed weights)
// into `slot`, every math thread a share of the 16-byte pieces, and commits one group (empty past
// the last task, to keep the count).
__device__ __forceinline__ void issue(const Cursor& c, const Task* tasks, const GemvOp* ops, uint4* slot) {
    if (c.task < c.end) {
        const Task t = tasks[c.task];
        const uint4* src = packed_slot(ops[t.op], t, c.stage);
        for (int p = threadIdx.x; p < kStageBytes / 16; p += kThreads) {
            aot::cp_async_16(static_cast<unsigned>(__cvta_generic_to_shared(slot + p)), src + p, true);
        }
    }
    aot::cp_async_commit();
}

// Mirrored by `PackParams` in src/ops/persistent.rs.
struct PackParams {
    const __nv_bfloat16* src;  // [n][k] row-major
    __nv_bfloat16* dst;        // tiles x ceil(k / kc) slots of [rows][kc]
    int n, k, rows, pad_;
};

}  // namespace aot_persistent

namespace aot_persistent {

// The 256 math threads' own barrier (the streaming warp never joins it).
__device__ __forceinline__ void math_barrier() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// The math of one slot (`rows` rows of kc columns, in 32-column chunks): warp w takes chunks
// [w * per, (w + 1) * per) (per: 2 for 16-row tiles, 4 for 8-row ones, whose rows g + 8 are zeros).
// Each lane feeds the 8 elements it loads to both k16 steps of a chunk, x the same 8 positions of
// token g (aot_mma.cuh says why any such order is fine).
__device__ __forceinline__ void slot_math(float (&acc)[4], const uint4* s, const __nv_bfloat16* xs, const GemvOp& op,
                                          bool two, int k0) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int vec_per_row = two ? 64 : 128;
    const int per = two ? 2 : 4;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
        if (cc >= per) break;
        const int chunk = warp * per + cc;
        const int col = k0 + chunk * 32 + tq * 8;
        const uint4 lo = s[g * vec_per_row + chunk * 4 + tq];
        const uint4 hi = two ? s[(g + 8) * vec_per_row + chunk * 4 + tq] : zero;
        const uint4 xv = g < op.m && col < op.k ? *reinterpret_cast<const uint4*>(xs + g * op.k + col) : zero;
        aot::mma_chunk32(acc, lo, hi, xv);
    }
}

// A run's start (a task whose op differs from the block's task before it): thread 0 waits for its
// counter, then the math threads copy its x, written by other blocks of this launch, from L2 into
// xs, which the run's later tiles reuse. Every math thread is past the last task's use of xs and of
// the fragments.
__device__ __forceinline__ void task_start(const StepParams& p, const Task& t, const GemvOp& op, __nv_bfloat16* xs) {
    if (t.wait_counter >= 0 && threadIdx.x == 0) {
        const unsigned target = p.epoch * p.per_launch[t.wait_counter] + t.wait_count;
        while (static_cast<int>(ld_acquire(p.counters + t.wait_counter) - target) < 0) __nanosleep(32);
    }
    math_barrier();
    const int vec_per_x = op.k / 8;
    for (int i = threadIdx.x; i < op.m * vec_per_x; i += kThreads) {
        const int q = i / vec_per_x, v = i - q * vec_per_x;
        reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(op.x + static_cast<int64_t>(q) * op.ld_x) + v);
    }
    math_barrier();
}

// A task's end: the warps' fragments added in warp order by warp 0, which stores them and adds
// one to the task's counter.
__device__ __forceinline__ void task_end(const StepParams& p, const Task& t, const GemvOp& op, const float (&acc)[4],
                                         float4* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
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
    const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >> 1) * 8, q = 2 * tq + (i & 1);
        const int row = static_cast<int>(t.row0) + r;
        if (r < static_cast<int>(t.rows) && row < op.n && q < op.m) {
            op.out[static_cast<int64_t>(q) * op.ld_out + row] = __float2bfloat16_rn(vals[i]);
        }
    }
    __syncwarp();
    if (t.signal_counter >= 0 && t.signal_add > 0 && lane == 0) {
        __threadfence();
        red_release_add(p.counters + t.signal_counter, t.signal_add);
    }
}

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
    const int warp = threadIdx.x >> 5;
    const unsigned begin = p.begin[blockIdx.x], end = p.begin[blockIdx.x + 1];
    if (stages < 3 || stages > kMaxStages) __trap();  // the host sizes the ring within these
#if AOT_HAS_BULK
    __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            aot::mbar_init(&full[s], 1);
            aot::mbar_init(&empty[s], kThreads / 32);
        }
        aot::mbar_init_fence();
    }
    __syncthreads();
    if (warp == kThreads / 32) {
        // The streaming warp: every slot of every task of the block, in order.
        if (lane == 0) {
            unsigned filled = 0;
            for (unsigned ti = begin; ti < end; ++ti) {
                const Task t = p.tasks[ti];
                const GemvOp& op = p.ops[t.op];
                const int per_tile = (op.k + stage_cols(t.rows) - 1) / stage_cols(t.rows);
                const uint4* src = packed_slot(op, t, 0);
                for (int st = 0; st < per_tile; ++st, ++filled) {
                    const int s = static_cast<int>(filled % stages);
                    if (filled >= static_cast<unsigned>(stages)) aot::mbar_wait(&empty[s], (filled / stages - 1) & 1);
                    aot::mbar_arrive_expect_tx(&full[s], kStageBytes);
                    aot::bulk_g2s(ring + s * kSlot, src + st * kSlot, kStageBytes, &full[s]);
                }
            }
        }
        return;
    }
    unsigned used = 0;  // slots consumed: slot `used % stages`, in its use `used / stages`
    for (unsigned ti = begin; ti < end; ++ti) {
        const Task t = p.tasks[ti];
        const GemvOp op = p.ops[t.op];
        const bool two = t.rows == 16;
        const int kc = stage_cols(t.rows);
        const int per_tile = (op.k + kc - 1) / kc;
        if (ti == begin || p.tasks[ti - 1].op != t.op) task_start(p, t, op, xs);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int st = 0; st < per_tile; ++st, ++used) {
            const int s = static_cast<int>(used % stages);
            aot::mbar_wait(&full[s], (used / stages) & 1);
            slot_math(acc, ring + s * kSlot, xs, op, two, st * kc);
            __syncwarp();
            if (lane == 0) aot::mbar_arrive(&empty[s]);
        }
        task_end(p, t, op, acc, red);
    }
#else
    if (warp == kThreads / 32) return;
    Cursor fetch{begin, end, 0, 0};
    fetch.stages = fetch.task < fetch.end ? stages_of(p.tasks[fetch.task], p.ops) : 0;
    // The prologue: stages - 1 slots in flight.
    for (int s = 0; s < stages - 1; ++s) {
        issue(fetch, p.tasks, p.ops, ring + s * kSlot);
        if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);
    }
    int slot = 0;
    for (unsigned ti = begin; ti < end; ++ti) {
        const Task t = p.tasks[ti];
        const GemvOp op = p.ops[t.op];
        const bool two = t.rows == 16;
        const int kc = stage_cols(t.rows);
        const int per_tile = (op.k + kc - 1) / kc;
        if (ti == begin || p.tasks[ti - 1].op != t.op) task_start(p, t, op, xs);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int st = 0; st < per_tile; ++st) {
            // This slot's copies are done (stages - 2 newer groups may still be in flight), and
            // every math thread is past the math of the slot about to be refilled.
            cp_async_wait_pending(stages - 2);
            math_barrier();
            issue(fetch, p.tasks, p.ops, ring + ((slot + stages - 1) % stages) * kSlot);
            if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);
            slot_math(acc, ring + slot * kSlot, xs, op, two, st * kc);
            slot = (slot + 1) % stages;
        }
        task_end(p, t, op, acc, red);
    }
    aot::cp_async_wait<0>();
#endif
}

// Packs a row-major [n][k] weight into the slots the step streams: tile i (rows i * rows ..),
// stage s (columns s * kc ..) is the [rows][kc] block at slot i * ceil(k / kc) + s; rows past n and
// columns past k are zeros. Every 16-byte piece is one thread's, grid-stride.
extern "C" __global__ void __launch_bounds__(256) persistent_pack_bf16(const aot_persistent::PackParams p) {
    using namespace aot_persistent;
    const int kc = kStageBytes / 2 / p.rows;
    const int vec_per_row = kc / 8;
    const int per_tile = (p.k + kc - 1) / kc;
    const int tiles = (p.n + p.rows - 1) / p.rows;
    const int64_t pieces = static_cast<int64_t>(tiles) * per_tile * (kStageBytes / 16);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t slot = i / (kStageBytes / 16);
        const int within = static_cast<int>(i - slot * (kStageBytes / 16));
        const int tile = static_cast<int>(slot / per_tile), stage = static_cast<int>(slot - static_cast<int64_t>(tile) * per_tile);
        const int r = within / vec_per_row, v = within - r * vec_per_row;
        const int row = tile * p.rows + r, col = stage * kc + v * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < p.n && col < p.k) val = *reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(row) * p.k + col);
        reinterpret_cast<uint4*>(p.dst)[i] = val;
    }
}
