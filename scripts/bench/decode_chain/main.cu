// Decode-chain micro-benchmark: one Qwen3 decode step's kernels (qkv, attention, o_proj, gate_up,
// down for every layer, then lm_head), exactly as the engine launches them, captured in a CUDA
// graph and timed on the GPU; then each kernel alone (a graph of it over every layer). Random
// weights; the sizes default to Qwen3-4B. For A/B work on the kernels without the Rust build:
// build.sh compiles it against any source tree (see README.md here).
//
//   decode-chain [--m 1] [--ctx 80] [--layers 36] [--reps 200] [--exact-splits] [--pdl]
//                [--pdl-ops OPS] [--stage-ops OPS] [--no-overlap]
//                [--pipeline auto|on|off] [--cluster auto|on|off] [--norm-all-rows-min N]
//
// By default qkv and o_proj take the staged GEMV entries and launch with programmatic dependent
// launch, as the engine does under AOT_KERNELS_PDL=auto; --no-overlap launches every kernel plainly
// (AOT_KERNELS_PDL=off). --pdl-ops and --stage-ops name the ops (q qkv, a attention, o o_proj,
// g gate_up, d down, l lm_head) launched programmatically and staged (staging needs the narrow
// layout: q, o, d); --pdl launches every kernel programmatically (AOT_KERNELS_PDL=all). Only an
// sm_90+ build holds griddepcontrol.wait: a compute_80 build must run with --no-overlap. --pipeline
// picks the decode attention entries: `auto` as the engine does (attn_pipelined), or forced;
// --cluster likewise picks whether a row's splits merge in a thread-block cluster (attn_cluster).
// --norm-all-rows-min sets the rows from which the wide norm GEMVs take the all-rows prologue
// (default 4, as the engine; 9 never, 1 always).
#include "ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, unsigned seed, float scale, float offset) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
        p[i] = __float2bfloat16(offset + scale * ((x & 0xffffff) / 16777216.0f - 0.5f));
    }
}
__global__ void fill_f32(float* p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
__global__ void stream_read(const uint4* __restrict__ d, size_t n, unsigned* out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(d + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

static __nv_bfloat16* bf16_buf(size_t n, unsigned seed, float scale, float offset = 0.0f) {
    __nv_bfloat16* p;
    CK(cudaMalloc(&p, n * 2));
    fill_bf16<<<1024, 256>>>(p, n, seed, scale, offset);
    return p;
}
static float* f32_buf(size_t n, float v) {
    float* p;
    CK(cudaMalloc(&p, n * 4));
    fill_f32<<<256, 256>>>(p, n, v);
    return p;
}

struct Layer {
    __nv_bfloat16 *qkv, *o, *gate_up, *down, *in_norm, *post_norm, *q_norm, *k_norm, *k_cache, *v_cache;
};

bool g_pdl = false;
// As the engine under AOT_KERNELS_PDL=auto: qkv and o_proj staged and launched programmatically,
// and attention launched programmatically with its first cache blocks read before its wait.
static std::string g_pdl_ops = "qoa";  // --pdl-ops: the ops launched with PDL (q a o g d l), all with --pdl; as the engine
static bool g_pdl_all = false;
bool g_stage = false;
static std::string g_stage_ops = "qo";  // --stage-ops: the GEMVs that stage their first weights (q o g d l)
static void pdl_for(char c) {
    g_pdl = g_pdl_all || g_pdl_ops.find(c) != std::string::npos;
    g_stage = g_stage_ops.find(c) != std::string::npos;
}
int g_norm_all_rows_min = 4;

int main(int argc, char** argv) {
    int m = 1, ctx = 80, layers = 36, reps = 200;
    bool exact_splits = false;
    int cluster_mode = -1;  // --cluster auto|on|off: the attention's `_cl` entries (splits merged in a cluster)
    int pipeline = -1;  // -1 auto, 0 off, 1 on
    bool no_overlap = false;  // as AOT_KERNELS_PDL=off, whatever --pdl-ops and --stage-ops say
    int hidden = 2560, q_heads = 32, kv_heads = 8, hd = 128, inter = 9728, vocab = 151936;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() { return atoi(argv[++i]); };
        if (a == "--m") m = next();
        else if (a == "--ctx") ctx = next();
        else if (a == "--layers") layers = next();
        else if (a == "--reps") reps = next();
        else if (a == "--exact-splits") exact_splits = true;
        else if (a == "--cluster") {
            // A bare --cluster (as earlier versions took it) means on.
            const std::string v = i + 1 < argc ? argv[i + 1] : "";
            if (v == "auto" || v == "on" || v == "off") ++i;
            cluster_mode = v == "auto" ? -1 : v == "off" ? 0 : 1;
        }
        else if (a == "--pdl") g_pdl = g_pdl_all = true;
        else if (a == "--pdl-ops" && i + 1 < argc) g_pdl_ops = argv[++i];
        else if (a == "--stage-ops" && i + 1 < argc) g_stage_ops = argv[++i];
        else if (a == "--no-overlap") no_overlap = true;
        else if (a == "--norm-all-rows-min" && i + 1 < argc) g_norm_all_rows_min = next();
        else if (a == "--pipeline" && i + 1 < argc) {
            const std::string v = argv[++i];
            if (v == "auto") pipeline = -1;
            else if (v == "on") pipeline = 1;
            else if (v == "off") pipeline = 0;
            else { fprintf(stderr, "--pipeline takes auto, on or off, not %s\n", v.c_str()); return 2; }
        }
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    if (no_overlap) g_pdl_ops = g_stage_ops = "";
    if (m < 1 || m > 8 || ctx < 0 || layers < 1 || reps < 1) {
        fprintf(stderr, "--m must be 1..8 (the kernels' most tokens), --ctx >= 0, --layers and --reps >= 1\n");
        return 2;
    }
    int sm = 0;
    CK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    const int qkv_dim = (q_heads + 2 * kv_heads) * hd, q_dim = q_heads * hd;
    const int blocks_per_seq = (ctx + 16) / 16 + 1, ld_bt = blocks_per_seq, max_pos = ctx + 64;
    const size_t kv_per_layer = (size_t)m * blocks_per_seq * kv_heads * 16 * hd;

    std::vector<Layer> L(layers);
    for (int l = 0; l < layers; ++l) {
        unsigned s = 1000 + l * 16;
        L[l].qkv = bf16_buf((size_t)qkv_dim * hidden, s + 1, 0.04f);
        L[l].o = bf16_buf((size_t)hidden * q_dim, s + 2, 0.04f);
        L[l].gate_up = bf16_buf((size_t)2 * inter * hidden, s + 3, 0.04f);
        L[l].down = bf16_buf((size_t)hidden * inter, s + 4, 0.04f);
        L[l].in_norm = bf16_buf(hidden, s + 5, 0.2f, 1.0f);
        L[l].post_norm = bf16_buf(hidden, s + 6, 0.2f, 1.0f);
        L[l].q_norm = bf16_buf(hd, s + 7, 0.2f, 1.0f);
        L[l].k_norm = bf16_buf(hd, s + 8, 0.2f, 1.0f);
        L[l].k_cache = bf16_buf(kv_per_layer, s + 9, 1.0f);
        L[l].v_cache = bf16_buf(kv_per_layer, s + 10, 1.0f);
    }
    __nv_bfloat16* lm_head = bf16_buf((size_t)vocab * hidden, 7, 0.04f);
    __nv_bfloat16* final_norm = bf16_buf(hidden, 8, 0.2f, 1.0f);
    __nv_bfloat16* h = bf16_buf((size_t)8 * hidden, 9, 2.0f);
    const int ssq_groups = hidden / 16;
    float* ssq = f32_buf((size_t)ssq_groups * 8, 1.0f);  // sum of squares ~ hidden / 3 spread over groups
    __nv_bfloat16* qkv = bf16_buf((size_t)8 * qkv_dim, 10, 1.0f);
    __nv_bfloat16* attn = bf16_buf((size_t)8 * q_dim, 11, 1.0f);
    __nv_bfloat16* act = bf16_buf((size_t)8 * inter, 12, 1.0f);
    float* logits = f32_buf((size_t)8 * vocab, 0.0f);
    std::vector<float> cs((size_t)max_pos * hd);
    for (int p = 0; p < max_pos; ++p)
        for (int j = 0; j < hd / 2; ++j) {
            float f = p * powf(1000000.0f, -2.0f * j / hd);
            cs[(size_t)p * hd + j] = cosf(f);
            cs[(size_t)p * hd + hd / 2 + j] = sinf(f);
        }
    float* cos_sin;
    CK(cudaMalloc(&cos_sin, cs.size() * 4));
    CK(cudaMemcpy(cos_sin, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int> table((size_t)m * ld_bt), slots(m), positions(m);
    for (int r = 0; r < m; ++r) {
        slots[r] = r;
        positions[r] = ctx;  // ctx tokens already cached; the new one goes at position ctx
        for (int j = 0; j < ld_bt; ++j) table[(size_t)r * ld_bt + j] = r * blocks_per_seq + j;
    }
    int *d_table, *d_slots, *d_pos;
    CK(cudaMalloc(&d_table, table.size() * 4));
    CK(cudaMalloc(&d_slots, m * 4));
    CK(cudaMalloc(&d_pos, m * 4));
    CK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_slots, slots.data(), m * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pos, positions.data(), m * 4, cudaMemcpyHostToDevice));
    const int ms = attn_max_splits();
    float* ws_ml = f32_buf((size_t)8 * q_heads * ms * 2, 0.0f);
    float* ws_o = f32_buf((size_t)8 * q_heads * ms * hd, 0.0f);
    unsigned* counters;
    CK(cudaMalloc(&counters, 8 * kv_heads * 4));
    CK(cudaMemset(counters, 0, 8 * kv_heads * 4));
    CK(cudaDeviceSynchronize());

    const float eps = 1e-6f;
    // Mirrors attn_pipelined() in src/ops/attention.rs: every row holds ctx + 1 tokens.
    const int pipelined = pipeline >= 0 ? pipeline : hd <= 128 && kv_heads * m * attn_splits_host(ctx + 1) <= 2 * sm;
    // Mirrors attn_cluster() and decode_entry_cluster() (the engine also asks for an sm_90+ image on a
    // GPU of capability 9.0 or later, which this sm_90 build on the H200 is).
    const int splits = attn_splits_host(ctx + 1);
    const bool cluster = cluster_mode >= 0 ? cluster_mode == 1
                                           : splits >= 2 && splits <= 8 && 2 * kv_heads * m * 8 <= sm &&
                                                 (pipelined || hd == 256);
    if (cluster && attn_splits_host(ctx + 1) > 8) {
        fprintf(stderr, "--cluster: %d splits at %d tokens, a cluster holds 8\n", attn_splits_host(ctx + 1), ctx + 1);
        return 2;
    }
    const int grid_splits = cluster ? 8 : exact_splits ? attn_splits_host(ctx + 1) : ms;
    auto op_qkv = [&](int l, int groups, cudaStream_t s) {
        pdl_for('q');
        launch_gemv({L[l].qkv, h, ssq, L[l].in_norm, qkv, nullptr, nullptr, qkv_dim, hidden, m, hidden, qkv_dim, 0,
                     groups, eps, 0, 0}, sm, s);
    };
    auto op_attn = [&](int l, cudaStream_t s) {
        pdl_for('a');
        launch_attn({qkv, L[l].q_norm, L[l].k_norm, cos_sin, L[l].k_cache, L[l].v_cache, d_table, d_slots, d_pos, attn,
                     ws_ml, ws_o, counters, m, q_heads, kv_heads, hd, ld_bt, qkv_dim, max_pos, grid_splits, pipelined,
                     cluster ? 1 : 0, eps}, s);
    };
    auto op_o = [&](int l, cudaStream_t s) {
        pdl_for('o');
        launch_gemv({L[l].o, attn, nullptr, nullptr, nullptr, h, ssq, hidden, q_dim, m, q_dim, 0, hidden, 0, eps, 2, 0},
                    sm, s);
    };
    auto op_gate_up = [&](int l, cudaStream_t s) {
        pdl_for('g');
        launch_gemv({L[l].gate_up, h, ssq, L[l].post_norm, act, nullptr, nullptr, 2 * inter, hidden, m, hidden, inter, 0,
                     ssq_groups, eps, 3, inter}, sm, s);
    };
    auto op_down = [&](int l, cudaStream_t s) {
        pdl_for('d');
        launch_gemv({L[l].down, act, nullptr, nullptr, nullptr, h, ssq, hidden, inter, m, inter, 0, hidden, 0, eps, 2, 0},
                    sm, s);
    };
    auto op_lm = [&](cudaStream_t s) {
        pdl_for('l');
        launch_gemv({lm_head, h, ssq, final_norm, logits, nullptr, nullptr, vocab, hidden, m, hidden, vocab, 0,
                     ssq_groups, eps, 1, 0}, sm, s);
    };

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto capture = [&](auto&& body) {
        cudaGraph_t g;
        cudaGraphExec_t e;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        body();
        CK(cudaGetLastError());
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&e, g, 0));
        return e;
    };
    // Median over `reps` replays (each timed alone with events), after a warm-up.
    auto time_graph = [&](cudaGraphExec_t e) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(e, s));
        std::vector<float> t;
        for (int i = 0; i < reps; ++i) {
            CK(cudaEventRecord(a, s));
            CK(cudaGraphLaunch(e, s));
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms_;
            CK(cudaEventElapsedTime(&ms_, a, b));
            t.push_back(ms_ * 1000.0f);
        }
        std::sort(t.begin(), t.end());
        return std::make_pair(t[t.size() / 2], t[t.size() * 9 / 10]);
    };

    // Streaming read of 4 GiB: the bandwidth the limit is measured against.
    const size_t sbytes = (size_t)4 << 30;
    uint4* sbuf;
    unsigned* sout;
    CK(cudaMalloc(&sbuf, sbytes));
    CK(cudaMalloc(&sout, 4));
    CK(cudaMemset(sbuf, 1, sbytes));
    auto gs = capture([&] { stream_read<<<sm * 4, 512, 0, s>>>(sbuf, sbytes / 16, sout); });
    const float stream_us = time_graph(gs).first;
    const double bw = sbytes / (stream_us * 1e-6);
    CK(cudaFree(sbuf));

    const double w_bytes = (double)layers * 2.0 * ((double)qkv_dim * hidden + (double)hidden * q_dim +
                                                  2.0 * inter * hidden + (double)hidden * inter) +
                           2.0 * vocab * hidden;
    const double kv_bytes = (double)layers * m * (ctx + 1) * kv_heads * hd * 2.0 * 2.0;
    const double limit_us = (w_bytes + kv_bytes) / bw * 1e6;

    auto step = capture([&] {
        int groups = ssq_groups;
        for (int l = 0; l < layers; ++l) {
            op_qkv(l, groups, s);
            op_attn(l, s);
            op_o(l, s);
            op_gate_up(l, s);
            op_down(l, s);
        }
        op_lm(s);
    });
    // The bits of one step from a fixed start (h, its sums of squares), so that kernel variants
    // built side by side can be compared: FNV-1a over the logits and the final h.
    std::vector<char> h0((size_t)8 * hidden * 2), ssq0((size_t)ssq_groups * 8 * 4);
    CK(cudaMemcpy(h0.data(), h, h0.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ssq0.data(), ssq, ssq0.size(), cudaMemcpyDeviceToHost));
    auto [med, p90] = time_graph(step);
    CK(cudaMemcpy(h, h0.data(), h0.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ssq, ssq0.data(), ssq0.size(), cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(step, s));
    CK(cudaStreamSynchronize(s));
    std::vector<char> bits((size_t)m * vocab * 4 + (size_t)m * hidden * 2);
    CK(cudaMemcpy(bits.data(), logits, (size_t)m * vocab * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(bits.data() + (size_t)m * vocab * 4, h, (size_t)m * hidden * 2, cudaMemcpyDeviceToHost));
    uint64_t fnv = 1469598103934665603ull;
    for (char c : bits) fnv = (fnv ^ (uint8_t)c) * 1099511628211ull;
    printf("device SMs %d, stream read %.3f TB/s; m %d ctx %d layers %d grid_splits %d pipelined %d cluster %d pdl %s stage %s\n",
           sm, bw / 1e12, m, ctx, layers, grid_splits, pipelined, cluster ? 1 : 0, g_pdl_all ? "all" : g_pdl_ops.c_str(),
           g_stage_ops.c_str());
    printf("step  median %8.1f us  p90 %8.1f us  limit %8.1f us  share %5.1f%%  %7.1f tok/s\n", med, p90, limit_us,
           100.0 * limit_us / med, m * 1e6 / med);
    printf("digest %016llx (logits and h after one step from the fixed start)\n", (unsigned long long)fnv);

    struct Op {
        const char* name;
        double bytes;
        std::function<void(int)> f;
    };
    std::vector<Op> ops = {
        {"qkv", 2.0 * qkv_dim * hidden, [&](int l) { op_qkv(l, ssq_groups, s); }},
        {"attn", (double)m * (ctx + 1) * kv_heads * hd * 4.0, [&](int l) { op_attn(l, s); }},
        {"o_proj", 2.0 * hidden * q_dim, [&](int l) { op_o(l, s); }},
        {"gate_up", 4.0 * inter * hidden, [&](int l) { op_gate_up(l, s); }},
        {"down", 2.0 * hidden * inter, [&](int l) { op_down(l, s); }},
    };
    double sum = 0;
    for (auto& op : ops) {
        auto g = capture([&] { for (int l = 0; l < layers; ++l) op.f(l); });
        auto [t, t90] = time_graph(g);
        const double per = t / layers;
        sum += per * layers;
        printf("%-8s %7.2f us/launch  %6.2f TB/s  (ideal %6.2f us)\n", op.name, per, op.bytes / (per * 1e-6) / 1e12,
               op.bytes / bw * 1e6);
    }
    auto gl = capture([&] { op_lm(s); });
    const double lm = time_graph(gl).first;
    sum += lm;
    printf("%-8s %7.2f us/launch  %6.2f TB/s  (ideal %6.2f us)\n", "lm_head", lm, 2.0 * vocab * hidden / (lm * 1e-6) / 1e12,
           2.0 * vocab * hidden / bw * 1e6);
    printf("sum of kernels alone %.1f us; step %.1f us\n", sum, med);
    CK(cudaDeviceSynchronize());
    return 0;
}
