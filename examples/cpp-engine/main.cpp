// A C++ engine using aot-kernels through its C ABI (aot_kernels.h, libaot_kernels_capi.a): it
// makes its own CUDA context and stream, creates a backend in that context, launches RMSNorm,
// fused add + RMSNorm, GEMV (bf16 and f32 out), SiLU-and-mul, embedding, sampling and decode
// attention over a paged KV cache on its stream, and checks each against a CPU reference of its own.
//
//   cpp-engine [--rows R] [--hidden H] [--vocab V] [--seed S] [--device N]
//
// Exit codes: 0 every check passed; 1 a check failed (or the GPU reported an error); 2 bad
// arguments (the message names the argument); 3 no CUDA driver or device (the argument checks
// and the simulated plan, which need no GPU, ran and passed first).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "aot_kernels.h"
#include "cuda_driver.hpp"
#include "reference.hpp"

namespace {

struct Args {
    size_t rows = 4, hidden = 2048, vocab = 32000;
    unsigned long long seed = 1;
    int device = 0;
};

struct Usage : std::runtime_error {
    using std::runtime_error::runtime_error;
};

Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; i += 2) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) throw Usage(flag + " needs a value");
        char* end = nullptr;
        const unsigned long long v = std::strtoull(argv[i + 1], &end, 10);
        if (*argv[i + 1] == '\0' || *end != '\0' || argv[i + 1][0] == '-')
            throw Usage(flag + ": `" + argv[i + 1] + "` is not a non-negative integer");
        if (flag == "--rows") a.rows = v;
        else if (flag == "--hidden") a.hidden = v;
        else if (flag == "--vocab") a.vocab = v;
        else if (flag == "--seed") a.seed = v;
        else if (flag == "--device") a.device = static_cast<int>(v);
        else throw Usage("unknown argument `" + flag + "` (use --rows, --hidden, --vocab, --seed, --device)");
    }
    if (a.rows == 0 || a.rows > 8) throw Usage("--rows " + std::to_string(a.rows) + ": the GEMV takes 1..=8 rows");
    if (a.hidden == 0 || a.hidden % 8 != 0)
        throw Usage("--hidden " + std::to_string(a.hidden) + ": needs a positive multiple of 8");
    if (a.vocab < 2) throw Usage("--vocab " + std::to_string(a.vocab) + ": needs at least 2 tokens");
    return a;
}

std::string last_error() { return aot_last_error_message(); }

int failures = 0;

// The reference rounds from double where the kernel rounds from fp32: a value next to a bf16
// rounding boundary may round the other way, and one such flip in an intermediate (the normalised
// value, the activation) moves the product by up to two ulps (as tests/gpu_kernels.rs allows).
constexpr int kMaxUlps = 2;

void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    if (!ok) ++failures;
}

// A call that must fail with `want` and a message containing `text`.
void expect_status(AotStatus got, AotStatus want, const std::string& text) {
    const std::string message = last_error();
    expect(got == want && message.find(text) != std::string::npos,
           "status " + std::to_string(got) + " (want " + std::to_string(want) + "): " + message);
}

// The paths that need no GPU: bad arguments named, the simulated plan through the buffer protocol.
void check_without_gpu() {
    expect(aot_check_abi(AOT_KERNELS_ABI_VERSION) == AOT_STATUS_OK,
           "ABI " + std::to_string(aot_abi_version() >> 16) + "." + std::to_string(aot_abi_version() & 0xffff) +
               " matches the header's");
    const AotDevicePtr x = 0x7f0000000000ull, w = 0x7f0010000000ull, out = 0x7f0020000000ull;
    expect_status(aot_rmsnorm_bf16(nullptr, nullptr, out, 256, 0, 256, w, 64, 4, 64, 1e-6f, 0.0f),
                  AOT_STATUS_NULL_ARGUMENT, "`x` is null");
    expect_status(aot_rmsnorm_bf16(nullptr, nullptr, out + 1, 256, x, 256, w, 64, 4, 64, 1e-6f, 0.0f),
                  AOT_STATUS_MISALIGNED, "`out` (0x7f0020000001) is not 2-byte aligned");
    expect_status(aot_rmsnorm_bf16(nullptr, nullptr, out, 255, x, 256, w, 64, 4, 64, 1e-6f, 0.0f),
                  AOT_STATUS_DEVICE_BUFFER_TOO_SMALL, "`out` is declared 255 elements long");
    expect_status(aot_gemv_bf16(nullptr, nullptr, w, 128 * 64, 128, 64, x, 9 * 64, 64, 9, out, 9 * 128, 128),
                  AOT_STATUS_INVALID_ARGUMENT, "`m` 9: one GEMV takes 1..=8 token rows");
    expect_status(aot_gemv_bf16(nullptr, nullptr, w, 128 * 64, 128, 64, x + 8, 64, 64, 1, out, 128, 128),
                  AOT_STATUS_MISALIGNED, "`x` (0x7f0000000008) is not 16-byte aligned");
    expect_status(aot_sample_tokens(nullptr, nullptr, out, 1, x, 1000, 1, 1000, 1000, nullptr),
                  AOT_STATUS_NULL_ARGUMENT, "`params` is null");
    expect_status(aot_attention_decode_bf16(nullptr, nullptr, nullptr), AOT_STATUS_NULL_ARGUMENT, "`args` is null");
    size_t workspace = 0;
    expect_status(aot_attention_decode_workspace_bytes(2, 8, 2, 96, &workspace), AOT_STATUS_INVALID_ARGUMENT,
                  "`head_dim` 96: the kernel is built for 64, 128 and 256");
    expect_status(aot_rmsnorm_bf16(nullptr, nullptr, out, 256, x, 256, w, 64, 4, 64, 1e-6f, 0.0f),
                  AOT_STATUS_NULL_ARGUMENT, "`backend` is null");

    size_t len = 0;
    expect_status(aot_plan_json_simulated(9, 0, 13, 0, 0, AOT_POLICY_AUTO, nullptr, &len),
                  AOT_STATUS_HOST_BUFFER_TOO_SMALL, "the text needs");
    std::string plan(len, '\0');
    const AotStatus s = aot_plan_json_simulated(9, 0, 13, 0, 0, AOT_POLICY_AUTO, plan.data(), &len);
    size_t modules = 0;
    for (size_t at = plan.find("\"module\""); at != std::string::npos; at = plan.find("\"module\"", at + 1)) ++modules;
    expect(s == AOT_STATUS_OK && modules > 0,
           "simulated plan for sm_90 on a CUDA 13.0 driver: " + std::to_string(len) + " bytes of JSON, " +
               std::to_string(modules) + " modules");
}

// Device memory of the example's own, freed with the example's context.
struct DeviceBuffer {
    const CudaDriver& cu;
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    DeviceBuffer(const CudaDriver& d, size_t n) : cu(d), bytes(n) { cu.check(cu.mem_alloc(&ptr, n), "cuMemAlloc"); }
    ~DeviceBuffer() { cu.mem_free(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    template <typename T>
    void upload(const std::vector<T>& v) {
        cu.check(cu.memcpy_htod(ptr, v.data(), v.size() * sizeof(T)), "cuMemcpyHtoD");
    }
    template <typename T>
    std::vector<T> download(size_t n) const {
        std::vector<T> v(n);
        cu.check(cu.memcpy_dtoh(v.data(), ptr, n * sizeof(T)), "cuMemcpyDtoH");
        return v;
    }
};

template <typename T>
size_t len_of(const DeviceBuffer& b) {
    return b.bytes / sizeof(T);
}

void require(AotStatus s, const char* what) {
    if (s != AOT_STATUS_OK) throw std::runtime_error(std::string(what) + ": " + last_error());
}

std::vector<bf16> random_bf16(std::mt19937_64& rng, size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<bf16> v(n);
    for (auto& e : v) e = to_bf16(u(rng));
    return v;
}

int max_ulps(const std::vector<bf16>& a, const std::vector<bf16>& b) {
    int m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, ulps(a[i], b[i]));
    return m;
}

CUdevice device_of(const CudaDriver& cu, const Args& a) {
    CUdevice device;
    cu.check(cu.device_get(&device, a.device), "cuDeviceGet");
    return device;
}

// Decode attention as an engine runs it: two sequences (slots 1 and 0 of a shuffled block table)
// decoded for kSteps positions, one launch a step, each writing its new key and value into the
// paged cache. Then every cached key against q/k-norm + RoPE of its token, every value exact, and
// the last step's output against float64 attention over the cache.
void check_attention(const CudaDriver& cu, AotBackend* backend, CUstream stream, std::mt19937_64& rng) {
    constexpr size_t kRows = 2, kQHeads = 8, kKvHeads = 2, kDim = 128, kBlock = 16;
    // 300 tokens: the last step's context takes two splits, merged through the workspace.
    constexpr size_t kSteps = 300;
    constexpr size_t kLdBt = (kSteps + kBlock - 1) / kBlock, kMaxPos = kLdBt * kBlock;
    constexpr size_t kWidth = (kQHeads + 2 * kKvHeads) * kDim, kBlockElems = kKvHeads * kBlock * kDim;
    const float eps = 1e-6f;
    const int slots[kRows] = {1, 0};

    const auto qkv = random_bf16(rng, kSteps * kRows * kWidth, 2.0f);  // [step][row][q | k | v]
    const auto q_norm = random_bf16(rng, kDim, 1.2f), k_norm = random_bf16(rng, kDim, 1.2f);
    const auto cos_sin = cos_sin_table(kMaxPos, kDim, 1e6);
    std::vector<int> table(kRows * kLdBt), positions(kSteps * kRows);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(i);
    std::shuffle(table.begin(), table.end(), rng);
    for (size_t t = 0; t < kSteps; ++t)
        for (size_t r = 0; r < kRows; ++r) positions[t * kRows + r] = static_cast<int>(t);

    size_t workspace_bytes = 0;
    require(aot_attention_decode_workspace_bytes(kRows, kQHeads, kKvHeads, kDim, &workspace_bytes),
            "aot_attention_decode_workspace_bytes");
    DeviceBuffer d_qkv(cu, qkv.size() * 2), d_qn(cu, kDim * 2), d_kn(cu, kDim * 2), d_cs(cu, cos_sin.size() * 4),
        d_kc(cu, table.size() * kBlockElems * 2), d_vc(cu, table.size() * kBlockElems * 2), d_table(cu, table.size() * 4),
        d_slots(cu, kRows * 4), d_pos(cu, positions.size() * 4), d_out(cu, kRows * kQHeads * kDim * 2),
        d_ws(cu, workspace_bytes);
    d_qkv.upload(qkv);
    d_qn.upload(q_norm);
    d_kn.upload(k_norm);
    d_cs.upload(cos_sin);
    d_table.upload(table);
    d_slots.upload(std::vector<int>(slots, slots + kRows));
    d_pos.upload(positions);
    // The workspace is zeroed once; the caches start as NaN (0xffff): a position not yet written
    // must never reach a result.
    cu.check(cu.memset_d8(d_ws.ptr, 0, workspace_bytes), "cuMemsetD8 (workspace)");
    cu.check(cu.memset_d8(d_kc.ptr, 0xff, d_kc.bytes), "cuMemsetD8 (k cache)");
    cu.check(cu.memset_d8(d_vc.ptr, 0xff, d_vc.bytes), "cuMemsetD8 (v cache)");

    for (size_t t = 0; t < kSteps; ++t) {
        AotAttentionDecode args{};
        args.qkv = d_qkv.ptr + t * kRows * kWidth * 2;
        args.qkv_len = kRows * kWidth;
        args.ld_qkv = kWidth;
        args.q_norm = d_qn.ptr;
        args.q_norm_len = kDim;
        args.k_norm = d_kn.ptr;
        args.k_norm_len = kDim;
        args.cos_sin = d_cs.ptr;
        args.cos_sin_len = len_of<float>(d_cs);
        args.max_pos = kMaxPos;
        args.k_cache = d_kc.ptr;
        args.k_cache_len = len_of<bf16>(d_kc);
        args.v_cache = d_vc.ptr;
        args.v_cache_len = len_of<bf16>(d_vc);
        args.block_table = d_table.ptr;
        args.block_table_len = table.size();
        args.ld_bt = kLdBt;
        args.slot_of_row = d_slots.ptr;
        args.slot_of_row_len = kRows;
        args.positions = d_pos.ptr + t * kRows * 4;
        args.positions_len = kRows;
        args.out = d_out.ptr;
        args.out_len = len_of<bf16>(d_out);
        args.workspace = d_ws.ptr;
        args.workspace_bytes = workspace_bytes;
        args.m = kRows;
        args.q_heads = kQHeads;
        args.kv_heads = kKvHeads;
        args.head_dim = kDim;
        args.eps = eps;
        args.weight_offset = 0.0f;
        require(aot_attention_decode_bf16(backend, stream, &args), "aot_attention_decode_bf16");
    }
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const auto kc = d_kc.download<bf16>(len_of<bf16>(d_kc)), vc = d_vc.download<bf16>(len_of<bf16>(d_vc));
    const auto out = d_out.download<bf16>(len_of<bf16>(d_out));

    // Where position t of row r's sequence lives in a cache, at KV head kv.
    auto at = [&](size_t r, size_t t, size_t kv) {
        const size_t blk = static_cast<size_t>(table[static_cast<size_t>(slots[r]) * kLdBt + t / kBlock]);
        return ((blk * kKvHeads + kv) * kBlock + t % kBlock) * kDim;
    };
    auto raw = [&](size_t t, size_t r, size_t head) { return &qkv[(t * kRows + r) * kWidth + head * kDim]; };
    // A key within 2 ulps, or 2e-2 where the rotation cancels (an ulp of a rotated operand near 1
    // is 2^-7, and two of them may move a small result that far).
    bool keys_close = true, values_equal = true;
    for (size_t r = 0; r < kRows; ++r)
        for (size_t t = 0; t < kSteps; ++t)
            for (size_t kv = 0; kv < kKvHeads; ++kv) {
                const auto key = norm_rope_ref(raw(t, r, kQHeads + kv), k_norm.data(), &cos_sin[t * kDim], kDim, eps, 0.0f);
                const bf16* value = raw(t, r, kQHeads + kKvHeads + kv);
                for (size_t i = 0; i < kDim; ++i) {
                    const bf16 k = kc[at(r, t, kv) + i];
                    keys_close &= ulps(k, key[i]) <= kMaxUlps || std::fabs(to_f32(k) - to_f32(key[i])) <= 2e-2f;
                    values_equal &= vc[at(r, t, kv) + i] == value[i];
                }
            }
    expect(keys_close && values_equal, "attention_decode cache: " + std::to_string(kSteps) +
                                           " positions of 2 sequences, keys within 2 ulp of q/k-norm + RoPE, "
                                           "values exact");

    // The last step's output: the reference query, the keys and values the kernel cached. The
    // kernel multiplies V by probabilities rounded to bf16 (2^-8 of the largest |v| at most) and
    // rounds the output once (2^-8 of it at most); 2e-3 covers fp32 against float64.
    const size_t last = kSteps - 1;
    double worst = 0;
    for (size_t r = 0; r < kRows; ++r) {
        std::vector<bf16> q, keys, values;
        for (size_t h = 0; h < kQHeads; ++h) {
            const auto head = norm_rope_ref(raw(last, r, h), q_norm.data(), &cos_sin[last * kDim], kDim, eps, 0.0f);
            q.insert(q.end(), head.begin(), head.end());
        }
        double v_max[kKvHeads] = {0, 0};
        for (size_t t = 0; t <= last; ++t)
            for (size_t kv = 0; kv < kKvHeads; ++kv) {
                keys.insert(keys.end(), &kc[at(r, t, kv)], &kc[at(r, t, kv)] + kDim);
                values.insert(values.end(), &vc[at(r, t, kv)], &vc[at(r, t, kv)] + kDim);
                for (size_t i = 0; i < kDim; ++i)
                    v_max[kv] = std::max(v_max[kv], std::fabs(static_cast<double>(to_f32(vc[at(r, t, kv) + i]))));
            }
        const auto want = attention_ref(q, keys, values, last + 1, kQHeads, kKvHeads, kDim);
        for (size_t i = 0; i < want.size(); ++i) {
            const double bound = std::ldexp(std::fabs(want[i]), -7) + std::ldexp(v_max[i / kDim / (kQHeads / kKvHeads)], -8) + 2e-3;
            worst = std::max(worst, std::fabs(to_f32(out[r * kQHeads * kDim + i]) - want[i]) / bound);
        }
    }
    expect(worst <= 1.0, "attention_decode output at position " + std::to_string(last) +
                             " (two splits): error at most " + std::to_string(worst) + " of its bound");
}

// The GPU checks, on the example's context and stream.
void check_on_gpu(const CudaDriver& cu, const Args& a, CUcontext ctx, CUstream stream) {
    AotBackend* raw = nullptr;
    require(aot_backend_create_in_context(ctx, AOT_POLICY_AUTO, 0, &raw), "aot_backend_create_in_context");
    // Destroyed on every way out (an exception included).
    std::unique_ptr<AotBackend, AotStatus (*)(AotBackend*)> owned(raw, aot_backend_destroy);
    AotBackend* backend = owned.get();
    size_t len = 0;
    aot_backend_report_json(backend, nullptr, &len);
    std::string report(len, '\0');
    require(aot_backend_report_json(backend, report.data(), &len), "aot_backend_report_json");
    std::printf("backend loaded in the example's context: %zu bytes of load report\n", len);

    const size_t rows = a.rows, hidden = a.hidden, vocab = a.vocab;
    std::mt19937_64 rng(a.seed);
    const auto x = random_bf16(rng, rows * hidden, 4.0f), weight = random_bf16(rng, hidden, 1.0f),
               residual = random_bf16(rng, rows * hidden, 2.0f), w = random_bf16(rng, vocab * hidden, 0.05f),
               gate_up = random_bf16(rng, rows * 2 * hidden, 3.0f);
    DeviceBuffer d_x(cu, x.size() * 2), d_w8(cu, weight.size() * 2), d_res(cu, residual.size() * 2),
        d_normed(cu, x.size() * 2), d_w(cu, w.size() * 2), d_gate_up(cu, gate_up.size() * 2),
        d_act(cu, rows * hidden * 2), d_y16(cu, rows * vocab * 2), d_logits(cu, rows * vocab * 4),
        d_tokens(cu, rows * 4), d_emb(cu, rows * hidden * 2), d_ssq(cu, rows * 4);
    d_x.upload(x);
    d_w8.upload(weight);
    d_res.upload(residual);
    d_w.upload(w);
    d_gate_up.upload(gate_up);
    const float eps = 1e-6f;

    // RMSNorm.
    require(aot_rmsnorm_bf16(backend, stream, d_normed.ptr, len_of<bf16>(d_normed), d_x.ptr, len_of<bf16>(d_x),
                             d_w8.ptr, hidden, rows, hidden, eps, 0.0f),
            "aot_rmsnorm_bf16");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const auto normed = d_normed.download<bf16>(rows * hidden);
    const int norm_ulps = max_ulps(normed, rmsnorm_ref(x, weight, rows, hidden, eps, 0.0f));
    expect(norm_ulps <= kMaxUlps, "rmsnorm: within " + std::to_string(norm_ulps) + " bf16 ulp of the reference");

    // GEMV of the normed rows: f32 logits, and bf16 out.
    require(aot_gemv_bf16_f32(backend, stream, d_w.ptr, len_of<bf16>(d_w), vocab, hidden, d_normed.ptr,
                              len_of<bf16>(d_normed), hidden, rows, d_logits.ptr, len_of<float>(d_logits), vocab),
            "aot_gemv_bf16_f32");
    require(aot_gemv_bf16(backend, stream, d_w.ptr, len_of<bf16>(d_w), vocab, hidden, d_normed.ptr,
                          len_of<bf16>(d_normed), hidden, rows, d_y16.ptr, len_of<bf16>(d_y16), vocab),
            "aot_gemv_bf16");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const auto logits = d_logits.download<float>(rows * vocab);
    const auto y16 = d_y16.download<bf16>(rows * vocab);
    std::vector<double> y, magnitude;
    gemv_ref(w, normed, vocab, hidden, rows, y, magnitude);
    double worst_f32 = 0, worst_bf16 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
        const double bound = 5e-7 * magnitude[i] + 1e-30;
        worst_f32 = std::max(worst_f32, std::fabs(logits[i] - y[i]) / bound);
        // bf16 out: the fp32 error, then one rounding to bf16 (half an ulp of the value, 2^-9 relative).
        const double bound16 = bound + std::ldexp(std::fabs(y[i]), -8);
        worst_bf16 = std::max(worst_bf16, std::fabs(to_f32(y16[i]) - y[i]) / bound16);
    }
    expect(worst_f32 <= 1.0, "gemv f32: error at most " + std::to_string(worst_f32) +
                                 " of 5e-7 x the sum of the terms' magnitudes");
    expect(worst_bf16 <= 1.0, "gemv bf16: error at most " + std::to_string(worst_bf16) + " of its bound");

    // Sampling: greedy rows give the argmax of the GPU's own logits; seeded rows repeat.
    std::vector<float> temperature(rows, 0.0f), top_p(rows, 1.0f);
    std::vector<uint32_t> top_k(rows, 0);
    std::vector<unsigned long long> seed(rows), counter(rows, 0);
    for (size_t r = 0; r < rows; ++r) seed[r] = a.seed * 1000 + r;
    DeviceBuffer d_temp(cu, rows * 4), d_topk(cu, rows * 4), d_topp(cu, rows * 4), d_seed(cu, rows * 8),
        d_counter(cu, rows * 8);
    d_temp.upload(temperature);
    d_topk.upload(top_k);
    d_topp.upload(top_p);
    d_seed.upload(seed);
    d_counter.upload(counter);
    const AotSamplingParams params{d_temp.ptr, d_topk.ptr, d_topp.ptr, d_seed.ptr, d_counter.ptr, rows};
    require(aot_sample_tokens(backend, stream, d_tokens.ptr, rows, d_logits.ptr, rows * vocab, rows, vocab, vocab,
                              &params),
            "aot_sample_tokens");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const auto greedy = d_tokens.download<int>(rows);
    bool argmax_equal = true;
    for (size_t r = 0; r < rows; ++r) argmax_equal &= greedy[r] == argmax_ref(&logits[r * vocab], vocab);
    expect(argmax_equal, "sample_tokens greedy: the argmax of every row");

    std::fill(temperature.begin(), temperature.end(), 0.8f);
    std::fill(top_k.begin(), top_k.end(), 50u);
    std::fill(top_p.begin(), top_p.end(), 0.9f);
    d_temp.upload(temperature);
    d_topk.upload(top_k);
    d_topp.upload(top_p);
    std::vector<int> draws[2];
    for (auto& draw : draws) {
        require(aot_sample_tokens(backend, stream, d_tokens.ptr, rows, d_logits.ptr, rows * vocab, rows, vocab,
                                  vocab, &params),
                "aot_sample_tokens");
        cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
        draw = d_tokens.download<int>(rows);
    }
    bool in_range = true;
    for (int t : draws[0]) in_range &= t >= 0 && static_cast<size_t>(t) < vocab;
    expect(draws[0] == draws[1] && in_range, "sample_tokens seeded: the same tokens twice, each in the vocabulary");

    // Fused add + RMSNorm, in place.
    d_normed.upload(x);
    require(aot_fused_add_rmsnorm_bf16(backend, stream, d_normed.ptr, rows * hidden, d_res.ptr, rows * hidden,
                                       d_w8.ptr, hidden, rows, hidden, eps, 1.0f),
            "aot_fused_add_rmsnorm_bf16");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    std::vector<bf16> summed(rows * hidden);
    for (size_t i = 0; i < summed.size(); ++i) summed[i] = to_bf16(to_f32(x[i]) + to_f32(residual[i]));
    expect(d_res.download<bf16>(rows * hidden) == summed, "fused_add_rmsnorm: the residual is bf16(x + residual)");
    const int fused_ulps = max_ulps(d_normed.download<bf16>(rows * hidden),
                                    rmsnorm_ref(summed, weight, rows, hidden, eps, 1.0f));
    expect(fused_ulps <= kMaxUlps, "fused_add_rmsnorm: within " + std::to_string(fused_ulps) + " bf16 ulp");

    // SiLU-and-mul.
    require(aot_silu_and_mul_bf16(backend, stream, d_act.ptr, rows * hidden, d_gate_up.ptr, rows * 2 * hidden, rows,
                                  hidden),
            "aot_silu_and_mul_bf16");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const int silu_ulps = max_ulps(d_act.download<bf16>(rows * hidden), silu_and_mul_ref(gate_up, rows, hidden));
    expect(silu_ulps <= kMaxUlps, "silu_and_mul: within " + std::to_string(silu_ulps) + " bf16 ulp");

    // Embedding: rows of W (as a table) by the greedy tokens, with sums of squares.
    require(aot_embedding_bf16(backend, stream, d_emb.ptr, rows * hidden, hidden, d_ssq.ptr, rows, d_w.ptr,
                               vocab * hidden, vocab, hidden, d_tokens.ptr, rows, rows),
            "aot_embedding_bf16");
    cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize");
    const auto emb = d_emb.download<bf16>(rows * hidden);
    const auto ssq = d_ssq.download<float>(rows);
    bool rows_equal = true, ssq_close = true;
    for (size_t r = 0; r < rows; ++r) {
        const size_t t = static_cast<size_t>(draws[1][r]);
        double s = 0;
        for (size_t i = 0; i < hidden; ++i) {
            rows_equal &= emb[r * hidden + i] == w[t * hidden + i];
            s += std::pow(static_cast<double>(to_f32(w[t * hidden + i])), 2);
        }
        ssq_close &= std::fabs(ssq[r] - s) <= 1e-5 * s + 1e-12;
    }
    expect(rows_equal && ssq_close, "embedding: the table's rows exactly, sums of squares within 1e-5");

    check_attention(cu, backend, stream, rng);

    // Hostile pointers on a real backend: a host address, and a length past the allocation.
    std::vector<bf16> host(rows * hidden);
    expect_status(aot_rmsnorm_bf16(backend, stream, d_normed.ptr, rows * hidden,
                                   reinterpret_cast<AotDevicePtr>(host.data()), host.size(), d_w8.ptr, hidden, rows,
                                   hidden, eps, 0.0f),
                  AOT_STATUS_BAD_POINTER, "`x`");
    expect_status(aot_rmsnorm_bf16(backend, stream, d_normed.ptr, rows * hidden * 2, d_x.ptr, rows * hidden,
                                   d_w8.ptr, hidden, rows, hidden, eps, 0.0f),
                  AOT_STATUS_BAD_POINTER, "`out`");

    // A stream of another context is refused, naming the stream; the example's context is put back.
    CUcontext other;
    CUstream other_stream;
    cu.check(cu.ctx_create(&other, 0, device_of(cu, a)), "cuCtxCreate (a second context)");
    cu.check(cu.stream_create(&other_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate (its stream)");
    expect_status(aot_rmsnorm_bf16(backend, other_stream, d_normed.ptr, rows * hidden, d_x.ptr, rows * hidden,
                                   d_w8.ptr, hidden, rows, hidden, eps, 0.0f),
                  AOT_STATUS_WRONG_CONTEXT, "`stream` belongs to another CUDA context");
    cu.check(cu.stream_destroy(other_stream), "cuStreamDestroy (the second context's)");
    cu.check(cu.ctx_destroy(other), "cuCtxDestroy (the second context)");
    cu.check(cu.ctx_set_current(ctx), "cuCtxSetCurrent");

    require(aot_backend_destroy(owned.release()), "aot_backend_destroy");
}

}  // namespace

int main(int argc, char** argv) {
    Args args;
    try {
        args = parse_args(argc, argv);
    } catch (const Usage& e) {
        std::fprintf(stderr, "cpp-engine: %s\n", e.what());
        return 2;
    }
    check_without_gpu();
    if (failures > 0) {
        std::fprintf(stderr, "cpp-engine: %d no-GPU check(s) failed\n", failures);
        return 1;
    }

    CudaDriver cu;
    if (!cu.ok()) {
        AotBackend* backend = nullptr;
        const AotStatus s = aot_backend_create(args.device, AOT_POLICY_AUTO, 0, &backend);
        const bool named = s == AOT_STATUS_NO_DRIVER && backend == nullptr;
        std::fprintf(stderr, "cpp-engine: no GPU: %s; the backend says (status %d): %s\n", cu.why().c_str(), s,
                     last_error().c_str());
        return named ? 3 : 1;
    }
    int count = 0;
    if (cu.init(0) != CUDA_SUCCESS || cu.device_get_count(&count) != CUDA_SUCCESS || args.device >= count) {
        std::fprintf(stderr, "cpp-engine: no GPU: the driver lists %d device(s), --device %d asked\n", count,
                     args.device);
        return 3;
    }
    try {
        CUcontext ctx;
        cu.check(cu.ctx_create(&ctx, 0, device_of(cu, args)), "cuCtxCreate");
        CUstream stream;
        cu.check(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        check_on_gpu(cu, args, ctx, stream);
        // The backend is gone; the context and stream are still the example's to use and destroy.
        cu.check(cu.stream_synchronize(stream), "cuStreamSynchronize after aot_backend_destroy");
        cu.check(cu.stream_destroy(stream), "cuStreamDestroy");
        cu.check(cu.ctx_destroy(ctx), "cuCtxDestroy");
        expect(true, "the example's context and stream outlive the backend");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cpp-engine: %s\n", e.what());
        return 1;
    }
    if (failures > 0) {
        std::fprintf(stderr, "cpp-engine: %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("cpp-engine: every check passed\n");
    return 0;
}
