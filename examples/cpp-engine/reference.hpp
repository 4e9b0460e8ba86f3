// CPU references of the ops the example launches, written from the kernels' arithmetic (fp32
// math, one bf16 rounding per stored value), and the bf16 helpers they need.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using bf16 = uint16_t;

inline float to_f32(bf16 h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as __float2bfloat16_rn.
inline bf16 to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16>(u >> 16);
}

// Distance in bf16 units in the last place (values of one sign ordered as integers).
inline int ulps(bf16 a, bf16 b) {
    auto ordered = [](bf16 h) { return (h & 0x8000) ? -static_cast<int>(h & 0x7fff) : static_cast<int>(h); };
    return std::abs(ordered(a) - ordered(b));
}

inline std::vector<bf16> rmsnorm_ref(const std::vector<bf16>& x, const std::vector<bf16>& w, size_t rows,
                                     size_t hidden, float eps, float offset) {
    std::vector<bf16> out(rows * hidden);
    for (size_t r = 0; r < rows; ++r) {
        double ssq = 0;
        for (size_t i = 0; i < hidden; ++i) ssq += std::pow(static_cast<double>(to_f32(x[r * hidden + i])), 2);
        const double scale = 1.0 / std::sqrt(ssq / static_cast<double>(hidden) + eps);
        for (size_t i = 0; i < hidden; ++i) {
            const float normed = to_f32(to_bf16(static_cast<float>(to_f32(x[r * hidden + i]) * scale)));
            out[r * hidden + i] = to_bf16((to_f32(w[i]) + offset) * normed);
        }
    }
    return out;
}

// y[t][r] = sum_i w[r][i] x[t][i] in double, and the sum of the terms' magnitudes (the scale of
// the kernel's fp32 rounding).
inline void gemv_ref(const std::vector<bf16>& w, const std::vector<bf16>& x, size_t n, size_t k, size_t m,
                     std::vector<double>& y, std::vector<double>& magnitude) {
    y.assign(m * n, 0.0);
    magnitude.assign(m * n, 0.0);
    for (size_t t = 0; t < m; ++t)
        for (size_t r = 0; r < n; ++r) {
            double s = 0, a = 0;
            for (size_t i = 0; i < k; ++i) {
                const double term = static_cast<double>(to_f32(w[r * k + i])) * to_f32(x[t * k + i]);
                s += term;
                a += std::fabs(term);
            }
            y[t * n + r] = s;
            magnitude[t * n + r] = a;
        }
}

inline std::vector<bf16> silu_and_mul_ref(const std::vector<bf16>& in, size_t rows, size_t d) {
    std::vector<bf16> out(rows * d);
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < d; ++i) {
            const double g = to_f32(in[r * 2 * d + i]);
            const float act = to_f32(to_bf16(static_cast<float>(g / (1.0 + std::exp(-g)))));
            out[r * d + i] = to_bf16(act * to_f32(in[r * 2 * d + d + i]));
        }
    return out;
}

// The sampling kernel's order of logits: larger first, ties to the lower index.
inline uint32_t logit_key(float f) {
    if (std::isnan(f)) return 0;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

inline int argmax_ref(const float* row, size_t vocab) {
    size_t best = 0;
    for (size_t i = 1; i < vocab; ++i)
        if (logit_key(row[i]) > logit_key(row[best])) best = i;
    return static_cast<int>(best);
}
