// sample-ab: two versions of the sampling kernel (build.sh) on the same rows of logits, timed in
// alternation (each launch alone between events; the median of --reps), and their tokens compared
// over many draws (both implement src/ops/sampling.rs's definition, so they must agree).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using Launch = void (*)(int, int*, const float*, int, int, const float*, const uint32_t*, const float*, const uint64_t*,
                        const uint64_t*, cudaStream_t);
void launch_a(int, int*, const float*, int, int, const float*, const uint32_t*, const float*, const uint64_t*,
              const uint64_t*, cudaStream_t);
void launch_b(int, int*, const float*, int, int, const float*, const uint32_t*, const float*, const uint64_t*,
              const uint64_t*, cudaStream_t);

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                 \
        }                                                                                 \
    } while (0)

// Rows like tests/gpu_sampling.rs's kinds: 8, a trained model's shape (a bell-shaped tail of
// spread about 2.5 and 1 to 11 tokens 8 to 20 above it); 1, flat (uniform in +-0.5).
static std::vector<float> rows_of(int kind, int rows, int vocab, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-2.5f, 2.5f), flat(-0.5f, 0.5f), peak(8.0f, 20.0f);
    std::uniform_int_distribution<int> spikes(1, 11), at(0, vocab - 1);
    std::vector<float> v(static_cast<size_t>(rows) * vocab);
    for (int r = 0; r < rows; ++r) {
        float* row = v.data() + static_cast<size_t>(r) * vocab;
        for (int i = 0; i < vocab; ++i) row[i] = kind == 8 ? u(rng) + u(rng) + u(rng) : flat(rng);
        if (kind == 8) {
            for (int s = spikes(rng); s > 0; --s) row[at(rng)] = peak(rng);
        }
    }
    return v;
}

int main(int argc, char** argv) {
    int rows = 8, vocab = 151936, reps = 50, draws = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--rows")) rows = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--vocab")) vocab = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--draws")) draws = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "usage: sample-ab [--rows 8] [--vocab 151936] [--reps 50] [--draws 64]\n");
            return 2;
        }
    }
    struct Config {
        const char* name;
        int kind;
        float t;
        uint32_t k;
        float p;
    };
    const Config configs[] = {
        {"greedy", 8, 0.0f, 0, 1.0f},
        {"temperature 0.7", 8, 0.7f, 0, 1.0f},
        {"top-k 50", 8, 0.7f, 50, 1.0f},
        {"top-p 0.9", 8, 0.7f, 0, 0.9f},
        {"top-k 50 + top-p 0.9", 8, 0.7f, 50, 0.9f},
        {"Qwen3 thinking (0.6, 20, 0.95)", 8, 0.6f, 20, 0.95f},
        {"Qwen3 non-thinking (0.7, 20, 0.8)", 8, 0.7f, 20, 0.8f},
        {"flat rows, temperature 1.0", 1, 1.0f, 0, 1.0f},
        {"flat rows, top-k 20 + top-p 0.95", 1, 1.0f, 20, 0.95f},
    };
    std::mt19937_64 rng(20261201);
    const std::vector<float> host8 = rows_of(8, rows, vocab, rng), host1 = rows_of(1, rows, vocab, rng);
    float *d8, *d1, *temp, *top_p;
    uint32_t* top_k;
    uint64_t *seed, *counter;
    int* tokens;
    const size_t bytes = host8.size() * sizeof(float);
    CHECK(cudaMalloc(&d8, bytes));
    CHECK(cudaMalloc(&d1, bytes));
    CHECK(cudaMemcpy(d8, host8.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d1, host1.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&temp, rows * sizeof(float)));
    CHECK(cudaMalloc(&top_p, rows * sizeof(float)));
    CHECK(cudaMalloc(&top_k, rows * sizeof(uint32_t)));
    CHECK(cudaMalloc(&seed, rows * sizeof(uint64_t)));
    CHECK(cudaMalloc(&counter, rows * sizeof(uint64_t)));
    CHECK(cudaMalloc(&tokens, rows * sizeof(int)));
    std::vector<uint64_t> seeds(rows);
    for (auto& s : seeds) s = rng();
    CHECK(cudaMemcpy(seed, seeds.data(), rows * sizeof(uint64_t), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const Launch launches[2] = {launch_a, launch_b};

    std::printf("sample-ab: %d rows x %d logits, median of %d launches each, A and B alternating; tokens over %d draws\n",
                rows, vocab, reps, draws);
    std::printf("%-36s %10s %10s %8s  %s\n", "config", "A us", "B us", "B / A", "tokens");
    bool all_equal = true;
    for (const Config& c : configs) {
        const float* logits = c.kind == 8 ? d8 : d1;
        const std::vector<float> tv(rows, c.t), pv(rows, c.p);
        const std::vector<uint32_t> kv(rows, c.k);
        CHECK(cudaMemcpy(temp, tv.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(top_p, pv.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(top_k, kv.data(), rows * sizeof(uint32_t), cudaMemcpyHostToDevice));
        // Tokens: the same draws (counters) through both versions.
        bool equal = true;
        for (int d = 0; d < draws; ++d) {
            const std::vector<uint64_t> cv(rows, static_cast<uint64_t>(d));
            CHECK(cudaMemcpy(counter, cv.data(), rows * sizeof(uint64_t), cudaMemcpyHostToDevice));
            std::vector<int> got[2];
            for (int v = 0; v < 2; ++v) {
                CHECK(cudaMemset(tokens, 0xff, rows * sizeof(int)));
                launches[v](rows, tokens, logits, vocab, vocab, temp, top_k, top_p, seed, counter, s);
                CHECK(cudaStreamSynchronize(s));
                got[v].resize(rows);
                CHECK(cudaMemcpy(got[v].data(), tokens, rows * sizeof(int), cudaMemcpyDeviceToHost));
            }
            equal = equal && got[0] == got[1];
        }
        all_equal = all_equal && equal;
        std::vector<float> ms[2];
        for (int r = 0; r < reps; ++r) {
            for (int v = 0; v < 2; ++v) {
                CHECK(cudaEventRecord(e0, s));
                launches[v](rows, tokens, logits, vocab, vocab, temp, top_k, top_p, seed, counter, s);
                CHECK(cudaEventRecord(e1, s));
                CHECK(cudaEventSynchronize(e1));
                float t;
                CHECK(cudaEventElapsedTime(&t, e0, e1));
                ms[v].push_back(t);
            }
        }
        float med[2];
        for (int v = 0; v < 2; ++v) {
            std::sort(ms[v].begin(), ms[v].end());
            med[v] = ms[v][ms[v].size() / 2] * 1e3f;
        }
        std::printf("%-36s %10.1f %10.1f %8.3f  %s\n", c.name, med[0], med[1], med[1] / med[0], equal ? "equal" : "DIFFER");
    }
    CHECK(cudaGetLastError());
    std::printf("%s\n", all_equal ? "every draw equal" : "TOKENS DIFFER");
    return all_equal ? 0 : 1;
}
