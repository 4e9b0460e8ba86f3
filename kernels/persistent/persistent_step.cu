// The persistent step (issue 32): one launch, one block per SM, each block walking its own list of
// tasks. Dependencies are counters in global memory: a task may wait until a counter reaches a
// count (its producers' release-adds), and may add one to a counter when done. Weights never
// depend on activations, so each block's weight stream runs ahead of those waits: the bytes of the
// block's tasks, in list order, flow through a shared-memory ring of `stages` slots with cp.async
// (every target, and the compute_80 PTX), stages - 1 slots in flight while the math of the
// current one runs. Only the math waits on the counters.
//
// Task kinds (the host builds the lists: src/ops/persistent.rs, which mirrors Task and GemvOp):
//   kGemvTile  `rows` (8 or 16) output rows of a GEMV op, all of K:
//              out[t][r] = bf16(sum_k w[r][k] * x[t][k]) for the op's m (1..8) token rows.
//
// A tile's sum is fixed by its rows (8 or 16: part of the schedule's numeric contract) and K alone
// (never by the block that runs it, the block count or timing): stage by stage in K order, within a stage each lane's vectors in order, then the
// lanes by a butterfly. So a schedule over 132, 20 or 16 blocks, and one launch per op, give the
// same bits.
//
// Counters only grow: a launch of epoch e waits for `e * per_launch[c] + count`, so no launch
// needs them reset (the comparison is wrap-safe).
//
// Each task copies its x ([m][k] bf16, written by other blocks) into shared memory after its wait,
// behind the ring; the host sizes the ring to what is left.
//
// Co-residency: a block spins on counters that other blocks advance, so every block must be
// resident at once: the host launches at most one block per SM with shared memory that admits
// one block an SM, and checks the occupancy first.
#include "aot_common.cuh"
#include "aot_mma.cuh"

namespace aot_persistent {

constexpr int kThreads = 256;
constexpr int kMaxTokens = 8;
constexpr int kStageBytes = 16384;

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
    unsigned pad_;
};

// Mirrored by `GemvOp` in src/ops/persistent.rs (repr(C), 48 bytes).
struct GemvOp {
    const __nv_bfloat16* w;  // [n][k] row-major
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
    int stages;                   // ring slots, 3..12, as many as the SM's shared memory admits (stages * kStageBytes)
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

// Copies stage `c` into `slot` (every thread a share of the 16-byte pieces; past the tile's rows
// or K, zeros), and commits one cp.async group (empty past the last task, to keep the count).
__device__ __forceinline__ void issue(const Cursor& c, const Task* tasks, const GemvOp* ops, uint4* slot) {
    if (c.task < c.end) {
        const Task t = tasks[c.task];
        const GemvOp op = ops[t.op];
        const int kc = stage_cols(t.rows);
        const int vec_per_row = kc / 8;
        const int k0 = c.stage * kc;
        for (int p = threadIdx.x; p < kStageBytes / 16; p += kThreads) {
            const int r = p / vec_per_row, v = p - r * vec_per_row;
            const int row = static_cast<int>(t.row0) + r, col = k0 + v * 8;
            const bool valid = row < op.n && col < op.k;
            const __nv_bfloat16* src = valid ? op.w + static_cast<int64_t>(row) * op.k + col : op.w;
            aot::cp_async_16(static_cast<unsigned>(__cvta_generic_to_shared(slot + p)), src, valid);
        }
    }
    aot::cp_async_commit();
}

}  // namespace aot_persistent

extern "C" __global__ void __launch_bounds__(aot_persistent::kThreads, 1)
    persistent_step(const aot_persistent::StepParams p) {
    using namespace aot_persistent;
    // [p.stages][kStageBytes / 16] of weights, then the current task's x: [m][k] bf16.
    extern __shared__ __align__(128) uint4 ring[];
    const int stages = p.stages;
    __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(ring + stages * (kStageBytes / 16));
    constexpr int kSlot = kStageBytes / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    Cursor fetch{p.begin[blockIdx.x], p.begin[blockIdx.x + 1], 0, 0};
    fetch.stages = fetch.task < fetch.end ? stages_of(p.tasks[fetch.task], p.ops) : 0;
    Cursor math = fetch;
    // The prologue: stages - 1 slots in flight.
    for (int s = 0; s < stages - 1; ++s) {
        issue(fetch, p.tasks, p.ops, ring + s * kSlot);
        if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);
    }
    // Four independent sums a lane: (row, vector) pairs, so that the FMA chains overlap.
    float acc[4][kMaxTokens];
    int slot = 0;
    while (math.task < math.end) {
        const Task t = p.tasks[math.task];
        const GemvOp op = p.ops[t.op];
        if (math.stage == 0) {
            if (t.wait_counter >= 0 && threadIdx.x == 0) {
                const unsigned target = p.epoch * p.per_launch[t.wait_counter] + t.wait_count;
                while (static_cast<int>(ld_acquire(p.counters + t.wait_counter) - target) < 0) __nanosleep(32);
            }
            // Every thread is past the last task's math (which read xs) and thread 0's wait; then
            // the task's x, written by other blocks of this launch, is read at L2 into xs.
            __syncthreads();
            const int vec_per_x = op.k / 8;
            for (int i = threadIdx.x; i < op.m * vec_per_x; i += kThreads) {
                const int q = i / vec_per_x, v = i - q * vec_per_x;
                reinterpret_cast<uint4*>(xs)[i] =
                    __ldcg(reinterpret_cast<const uint4*>(op.x + static_cast<int64_t>(q) * op.ld_x) + v);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int q = 0; q < kMaxTokens; ++q) acc[c][q] = 0.0f;
        }
        // This slot's copies are done (stages - 2 newer groups may still be in flight), and every
        // thread is past the math of the slot about to be refilled; the barrier also publishes xs.
        cp_async_wait_pending(stages - 2);
        __syncthreads();
        issue(fetch, p.tasks, p.ops, ring + ((slot + stages - 1) % stages) * kSlot);
        if (fetch.task < fetch.end) advance(fetch, p.tasks, p.ops);

        // The math of this slot: a 16-row tile gives each warp rows 2w and 2w + 1, an 8-row tile
        // row w; either way each lane takes four 8-element vectors of the slot in order.
        const int kc = stage_cols(t.rows);
        const int vec_per_row = kc / 8;
        const int k0 = math.stage * kc;
        const int my_rows = t.rows == 16 ? 2 : 1;
        const uint4* s = ring + slot * kSlot;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (r >= my_rows) break;
            const int local = warp * my_rows + r;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int v = lane + 32 * j;
                if (v >= vec_per_row) break;
                const int col = k0 + v * 8;
                if (col >= op.k) break;
                const uint4 wv = s[local * vec_per_row + v];
                const aot::Bf16x8 w8 = *reinterpret_cast<const aot::Bf16x8*>(&wv);
                float wf[8];
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const float2 f = aot::to_f32x2(w8.h[h]);
                    wf[2 * h] = f.x;
                    wf[2 * h + 1] = f.y;
                }
#pragma unroll
                for (int q = 0; q < kMaxTokens; ++q) {
                    if (q >= op.m) break;
                    const uint4 xv = *reinterpret_cast<const uint4*>(xs + q * op.k + col);
                    const aot::Bf16x8 x8 = *reinterpret_cast<const aot::Bf16x8*>(&xv);
                    const int c = my_rows == 2 ? 2 * r + j : j;
                    float a = acc[c][q];
#pragma unroll
                    for (int h = 0; h < 4; ++h) {
                        const float2 f = aot::to_f32x2(x8.h[h]);
                        a = fmaf(wf[2 * h], f.x, a);
                        a = fmaf(wf[2 * h + 1], f.y, a);
                    }
                    acc[c][q] = a;
                }
            }
        }
        slot = (slot + 1) % stages;

        if (math.stage + 1 == math.stages) {
            // The tile is done: lanes by a butterfly, lane 0 stores, then one release-add.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                if (r >= my_rows) break;
                const int row = static_cast<int>(t.row0) + warp * my_rows + r;
#pragma unroll
                for (int q = 0; q < kMaxTokens; ++q) {
                    if (q >= op.m) break;
                    const float lane_sum = my_rows == 2 ? acc[2 * r][q] + acc[2 * r + 1][q]
                                                        : ((acc[0][q] + acc[1][q]) + acc[2][q]) + acc[3][q];
                    const float sum = aot::warp_sum(lane_sum);
                    if (lane == 0 && row < op.n) {
                        op.out[static_cast<int64_t>(q) * op.ld_out + row] = __float2bfloat16_rn(sum);
                    }
                }
            }
            if (t.signal_counter >= 0) {
                __syncthreads();
                if (threadIdx.x == 0) {
                    __threadfence();
                    red_release_add(p.counters + t.signal_counter, 1);
                }
            }
        }
        advance(math, p.tasks, p.ops);
    }
    aot::cp_async_wait<0>();
}
