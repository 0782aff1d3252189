// IQ4_NL and IQ4_XS: 4-bit codes that index a fixed non-uniform grid (kIQ4NLValues) under a per-32
// scale; IQ4_XS stores that scale as 6 bits under one fp16 per 256 elements. The quantizers follow
// llama.cpp's (ggml-quants.c, quantize_iq4_nl / quantize_iq4_xs) float operation for float operation,
// so that a tensor quantized here has llama-quantize's bytes. Compiled for baseline x86-64 (no FMA
// contraction), as ggml's quantizers are.
#include <cmath>
#include <cstring>

#include "core/quant/quant.h"
#include "core/quant/quant_k.h"

namespace cera::quant_detail {
namespace {

// The index of the grid level nearest to x; halfway between two levels, the upper one.
int nearest_level(float x) {
    const int8_t* v = kIQ4NLValues;
    if (x <= float(v[0])) return 0;
    if (x >= float(v[15])) return 15;
    int lo = 0, hi = 15;  // v[lo] <= x < v[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < float(v[mid]))
            hi = mid;
        else
            lo = mid;
    }
    return x - float(v[hi - 1]) < float(v[hi]) - x ? hi - 1 : hi;
}

// The weighted least-squares scale of the levels L for x, and its figure of merit d * sum(w q x).
struct Fit {
    float sumqx = 0, sumq2 = 0;
};
Fit fit_levels(const float* x, const float* w, float id, int n, uint8_t* L) {
    Fit f;
    for (int j = 0; j < n; ++j) {
        const int l = nearest_level(id * x[j]);
        if (L != nullptr) L[j] = uint8_t(l);
        const float q = float(kIQ4NLValues[l]);
        f.sumqx += w[j] * q * x[j];
        f.sumq2 += w[j] * q * q;
    }
    return f;
}

constexpr int kTries = 7;  // candidate inverse scales on each side of the first guess

// The scale of one 32-block: the levels for the scale that maps its largest magnitude to the grid's
// end, refitted by least squares, then the best of 2 * kTries + 1 neighbouring inverse scales by
// the weighted error. Writes the levels of the first guess to L; returns 0 for an all-zero block.
float block_scale(const float* x, const float* w, uint8_t* L) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
        const float ax = std::fabs(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < kGroupMaxEps) return 0;
    const float v0 = float(kIQ4NLValues[0]);
    float d = -max / v0;
    Fit f = fit_levels(x, w, 1 / d, 32, L);
    d = f.sumq2 > 0 ? f.sumqx / f.sumq2 : 0.f;
    float best = d * f.sumqx;
    for (int t = -kTries; t <= kTries; ++t) {
        const float id = float(t + kIQ4NLValues[0]) / max;
        f = fit_levels(x, w, id, 32, nullptr);
        if (f.sumq2 > 0 && f.sumqx * f.sumqx > best * f.sumq2) {
            d = f.sumqx / f.sumq2;
            best = d * f.sumqx;
        }
    }
    return d;
}

// The error weights of n values: the importance matrix scaled by the value's size against the
// group's spread, or without one the squared value.
void error_weights(const float* x, const float* qw, float sigma2, int n, float* w) {
    for (int j = 0; j < n; ++j) w[j] = qw != nullptr ? qw[j] * std::sqrt(sigma2 + x[j] * x[j]) : x[j] * x[j];
}

float spread(const float* x, int n) {
    float s = 0;
    for (int j = 0; j < n; ++j) s += x[j] * x[j];
    return s * (2.f / float(n));
}

void pack_codes(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(L[j] | (L[16 + j] << 4));
}

}  // namespace

void quant_iq4_nl(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockIQ4_NL*>(dst);
    float w[32];
    uint8_t L[32];
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        error_weights(x, qw != nullptr ? qw + 32 * i : nullptr, spread(x, 32), 32, w);
        const float d = block_scale(x, w, L);
        y[i].d = f2h(d);
        const float id = d != 0 ? 1 / d : 0;
        for (int j = 0; j < 32; ++j) L[j] = uint8_t(nearest_level(id * x[j]));
        pack_codes(L, y[i].qs);
    }
}

void quant_iq4_xs(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockIQ4_XS*>(dst);
    float w[32], scales[8];
    uint8_t L[32];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        const float sigma2 = spread(x, kQK_K);
        float amax_scale = 0, max_scale = 0;
        for (int b = 0; b < 8; ++b) {
            error_weights(x + 32 * b, qw != nullptr ? qw + kQK_K * i + 32 * b : nullptr, sigma2, 32, w);
            scales[b] = block_scale(x + 32 * b, w, L);
            if (std::fabs(scales[b]) > amax_scale) {
                amax_scale = std::fabs(scales[b]);
                max_scale = scales[b];
            }
        }
        // the sub-scales as 6-bit multiples of d, the largest at -32 (the signed range's long end)
        const float d = -max_scale / 32;
        y[i].d = f2h(d);
        y[i].scales_h = 0;
        std::memset(y[i].scales_l, 0, sizeof y[i].scales_l);
        const float id = d != 0 ? 1 / d : 0.f;
        for (int b = 0; b < 8; ++b) {
            int l = nearest_int(id * scales[b]);
            l = l < -32 ? -32 : (l > 31 ? 31 : l);
            const float dl = d * float(l);
            const float idl = dl != 0 ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j) L[j] = uint8_t(nearest_level(idl * x[32 * b + j]));
            pack_codes(L, y[i].qs + 16 * b);
            const int u = l + 32;
            y[i].scales_l[b / 2] |= uint8_t((u & 0xF) << (4 * (b % 2)));
            y[i].scales_h |= uint16_t((u >> 4) << (2 * b));
        }
    }
}

void dequant_iq4_nl(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * float(kIQ4NLValues[x[i].qs[j] & 0xF]);
            y[j + 16] = d * float(kIQ4NLValues[x[i].qs[j] >> 4]);
        }
    }
}

void dequant_iq4_xs(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ4_XS*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(x[i].d);
        for (int b = 0; b < 8; ++b, y += 32) {
            const float dl = d * float(iq4_xs_scale(x[i], b) - 32);
            const uint8_t* qs = x[i].qs + 16 * b;
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * float(kIQ4NLValues[qs[j] & 0xF]);
                y[j + 16] = dl * float(kIQ4NLValues[qs[j] >> 4]);
            }
        }
    }
}

}  // namespace cera::quant_detail
