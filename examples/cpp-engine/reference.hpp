// CPU references of the ops the example launches, written from the kernels' arithmetic (fp32
// math, one bf16 rounding per stored value), and the bf16 helpers they need.
#pragma once

#include <algorithm>
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

// The rotary table decode attention reads, [max_pos][d]: per position p, cos(p f_i) for the d / 2
// frequencies f_i = theta^(-2i / d), then sin(p f_i); computed in double, stored as float.
inline std::vector<float> cos_sin_table(size_t max_pos, size_t d, double theta) {
    std::vector<float> table(max_pos * d);
    for (size_t p = 0; p < max_pos; ++p)
        for (size_t i = 0; i < d / 2; ++i) {
            const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / d);
            table[p * d + i] = static_cast<float>(std::cos(angle));
            table[p * d + d / 2 + i] = static_cast<float>(std::sin(angle));
        }
    return table;
}

// One head of the new token (`d` values at `x`) through RMSNorm with weights `w` (+ `offset`) and
// NeoX RoPE from the table row `cs`: x_i pairs with x_{i + d/2}. Rounded to bf16 where the kernel
// stores: the normalised value, its product with the weight, the rotated value.
inline std::vector<bf16> norm_rope_ref(const bf16* x, const bf16* w, const float* cs, size_t d, float eps,
                                       float offset) {
    double ssq = 0;
    for (size_t i = 0; i < d; ++i) ssq += std::pow(static_cast<double>(to_f32(x[i])), 2);
    const double scale = 1.0 / std::sqrt(ssq / static_cast<double>(d) + eps);
    std::vector<double> n(d);
    for (size_t i = 0; i < d; ++i) {
        const float normed = to_f32(to_bf16(static_cast<float>(to_f32(x[i]) * scale)));
        n[i] = to_f32(to_bf16((to_f32(w[i]) + offset) * normed));
    }
    std::vector<bf16> out(d);
    const size_t half = d / 2;
    for (size_t i = 0; i < half; ++i) {
        const double c = cs[i], s = cs[i + half];
        out[i] = to_bf16(static_cast<float>(n[i] * c - n[i + half] * s));
        out[i + half] = to_bf16(static_cast<float>(n[i + half] * c + n[i] * s));
    }
    return out;
}

// softmax(q k / sqrt(d)) v for one row in double, unrounded: `q` is [q_heads][d], `keys` and
// `values` [ctx][kv_heads][d]; query head h reads KV head h / (q_heads / kv_heads).
inline std::vector<double> attention_ref(const std::vector<bf16>& q, const std::vector<bf16>& keys,
                                         const std::vector<bf16>& values, size_t ctx, size_t q_heads,
                                         size_t kv_heads, size_t d) {
    const size_t group = q_heads / kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> out(q_heads * d, 0.0), score(ctx);
    for (size_t h = 0; h < q_heads; ++h) {
        const size_t kv = h / group;
        double max = -INFINITY;
        for (size_t t = 0; t < ctx; ++t) {
            double s = 0;
            for (size_t i = 0; i < d; ++i)
                s += static_cast<double>(to_f32(q[h * d + i])) * to_f32(keys[(t * kv_heads + kv) * d + i]);
            score[t] = s * scale;
            max = std::max(max, score[t]);
        }
        double total = 0;
        for (size_t t = 0; t < ctx; ++t) total += score[t] = std::exp(score[t] - max);
        for (size_t t = 0; t < ctx; ++t)
            for (size_t i = 0; i < d; ++i)
                out[h * d + i] += score[t] / total * to_f32(values[(t * kv_heads + kv) * d + i]);
    }
    return out;
}
