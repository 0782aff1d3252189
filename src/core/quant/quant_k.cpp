// The K-quant quantizers (Q2_K ... Q6_K, and Q8_K for activations) and the searches they share. Every
// float operation follows the order of llama.cpp's reference code (ggml-quants.c, quantize_row_*_ref),
// so that quantizing gives the same bytes as llama-quantize without an importance matrix. Compiled for
// baseline x86-64 (no FMA contraction), as ggml's reference quantizers are.
#include "core/quant/quant_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/quant/quant.h"

namespace cera::quant_detail {

void qkx2_search(Qkx2Search& s) {
    const int n = s.n, nmax = s.nmax;
    const float* x = s.x;
    const float* weights = s.weights;
    for (int is = 0; is <= s.nstep; ++is) {
        const float iscale = (s.rmin + s.rdelta * float(is) + float(nmax)) / (s.max - s.min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - s.min));
            l = l < 0 ? 0 : (l > nmax ? nmax : l);
            s.Laux[i] = uint8_t(l);
            const float w = weights[i];
            sum_l += w * float(l);
            sum_l2 += w * float(l) * float(l);
            sum_xl += w * float(l) * x[i];
        }
        const float D = s.sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (s.sum_w * sum_xl - s.sum_x * sum_l) / D;
            float this_min = (sum_l2 * s.sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * float(s.Laux[i]) + this_min - x[i];
                diff = s.use_mad ? std::fabs(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < s.best_error) {
                for (int i = 0; i < n; ++i) s.L[i] = s.Laux[i];
                s.best_error = cur_error;
                s.scale = this_scale;
                s.min = this_min;
            }
        }
    }
}

bool qkx2_search_avx512_usable() {
    static const bool usable = cpu_features().has_avx512_set();
    return usable;
}

namespace {

// The value of largest magnitude (the first of equals), its magnitude in *amax.
float max_by_magnitude(int n, const float* x, float* amax) {
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > *amax) {
            *amax = ax;
            max = x[i];
        }
    }
    return max;
}

// Weighted least-squares fit of x ~ scale * L + min over a grid of candidate inverse scales;
// returns scale, stores -min in *the_min. L in [0, nmax]. The candidates are ranked by their weighted
// squared error, or by their weighted absolute error with use_mad (Q2_K's choice).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep, bool use_mad = false) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = float(nmax) / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = uint8_t(l < 0 ? 0 : (l > nmax ? nmax : l));
        float diff = scale * float(L[i]) + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    Qkx2Search s{n, nmax, x, weights, rmin, rdelta, nstep, use_mad, sum_w, sum_x, max, min, scale, best_error, L, Laux};
    if (qkx2_search_avx512_usable())
        qkx2_search_avx512(s);
    else
        qkx2_search(s);
    *the_min = -s.min;
    return s.scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2 nmax), weighted by qw, or by x^2 without it
// (llama.cpp's rmse_type 1): the rounding at -nmax / max, then the best of 18 nearby inverse scales.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, const float* qw = nullptr) {
    float amax;
    const float max = max_by_magnitude(n, x, &amax);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    auto clampl = [nmax](int l) { return l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l); };
    float iscale = float(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clampl(nearest_int(iscale * x[i]));
        L[i] = int8_t(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * float(l);
        suml2 += w * float(l) * float(l);
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(float(nmax) + 0.1f * float(is)) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clampl(nearest_int(iscale * x[i]));
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * float(l);
            suml2 += w * float(l) * float(l);
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + clampl(nearest_int(iscale * x[i])));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2 nmax), weights x^2: from the rounding at -nmax / max,
// each value in turn moves to the level that the current fit predicts for it when that raises the fit's
// sum(w x l)^2 / sum(w l^2), for up to five passes (llama.cpp's make_q3_quants with do_rmse, in its float
// order).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
    float amax;
    const float max = max_by_magnitude(n, x, &amax);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    auto clampl = [nmax](int l) { return l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l); };
    const float iscale = float(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clampl(nearest_int(iscale * x[i]));
        L[i] = int8_t(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * float(l);
        suml2 += w * float(l) * float(l);
    }
    for (int pass = 0; pass < 5; ++pass) {
        bool changed = false;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * float(L[i]);
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * float(L[i]) * float(L[i]);
            const int l = clampl(nearest_int(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w * x[i] * float(l);
            sl2 += w * float(l) * float(l);
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = int8_t(l);
                sumlx = slx;
                suml2 = sl2;
                changed = true;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Fit x ~ scale * L, L in [0, nmax], weighted by qw: the K-quants' sub-block scales and mins under an
// importance matrix (llama.cpp's make_qp_quants, in its float order). The best of nine inverse scales
// around nmax / max by weighted squared error, then up to five passes that move each level to where the
// fit of the others predicts it, when that raises sum(w x l)^2 / sum(w l^2). Levels are kept in uint8_t
// throughout, as there.
float make_qp_quants(int n, int nmax, const float* x, uint8_t* L, const float* qw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = float(nmax) / max;
    for (int i = 0; i < n; ++i) L[i] = uint8_t(nearest_int(iscale * x[i]));
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * float(L[i]);
        best_mse += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * float(is) + float(nmax)) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * float(l);
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest_int(iscale * x[i]));
        L[i] = uint8_t(l);
        sumlx += qw[i] * x[i] * float(l);
        suml2 += qw[i] * float(l) * float(l);
    }
    for (int pass = 0; pass < 5; ++pass) {
        bool changed = false;
        for (int i = 0; i < n; ++i) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * float(L[i]);
            float sl2 = suml2 - w * float(L[i]) * float(L[i]);
            if (!(slx > 0 && sl2 > 0)) continue;
            const int l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w * x[i] * float(l);
            sl2 += w * float(l) * float(l);
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = uint8_t(l);
                sumlx = slx;
                suml2 = sl2;
                changed = true;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// The importance weights of a group of n values under an importance matrix row qw: qw * sqrt(sigma2 +
// x^2), where sigma2 is the block's mean square (times a type's factor); their sum in *sum.
void importance_weights(int n, const float* x, const float* qw, float sigma2, float* w, float* sum) {
    for (int l = 0; l < n; ++l) w[l] = qw[l] * std::sqrt(sigma2 + x[l] * x[l]);
    float s = 0;
    for (int l = 0; l < n; ++l) s += w[l];
    *sum = s;
}

// x[0]^2 + ... + x[n-1]^2, summed in order (each type divides it into its sigma2).
float sum_squares(int n, const float* x) {
    float s = 0;
    for (int j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

// The 2-bit quants of a K-quant block in its qs layout: four 32-value groups of each 128 share a byte.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < kQK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q2_K: per 16 values an asymmetric 2-bit fit (weights |x|, absolute error), then the 16 scales and the
// 16 mins as 4-bit multiples of their largest / 15, and the quants again against the rounded pair.

// Packs 8 6-bit scales and 8 6-bit mins into the 12 bytes get_scale_min_k4 reads.
void pack_k4_scales(const uint8_t* ls, const uint8_t* lm, uint8_t* out) {
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = uint8_t((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= uint8_t((ls[j] >> 4) << 6);
            out[j] |= uint8_t((lm[j] >> 4) << 6);
        }
    }
}

void k4_requantize(const float* x, int nmax, uint16_t d_h, uint16_t dmin_h, const uint8_t* scales, uint8_t* L);

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per-32 (scale, min) fit, 6-bit sub-scales, final L.
void quant_k4_common(const float* x, int nmax, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                     uint8_t* scales_out, uint8_t* L) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32.0f);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
        ls[j] = uint8_t(nearest_int(inv_scale * scales[j]));
        lm[j] = uint8_t(nearest_int(inv_min * mins[j]));
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    std::memset(scales_out, 0, kKScaleSize);
    pack_k4_scales(ls, lm, scales_out);
    *d_out = f2h(max_scale / 63.f);
    *dmin_out = f2h(max_min / 63.f);
    k4_requantize(x, nmax, *d_out, *dmin_out, scales_out, L);
}

// Q4_K / Q5_K under an importance matrix row qw: the per-32 fits weighted by it, and the sub-block
// scales and mins fitted by make_qp_quants weighted by each sub-block's total weight.
void quant_k4_weighted(const float* x, const float* qw, int nmax, bool clamp63, uint16_t* d_out, uint16_t* dmin_out,
                       uint8_t* scales_out, uint8_t* L) {
    uint8_t Laux[32], ls[8], lm[8];
    float weights[32], sw[8], mins[8], scales[8];
    const float sigma2 = 2 * sum_squares(kQK_K, x) / kQK_K;
    for (int j = 0; j < 8; ++j) {
        importance_weights(32, x + 32 * j, qw + 32 * j, sigma2, weights, &sw[j]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    const float d_block = make_qp_quants(8, 63, scales, ls, sw);
    const float m_block = make_qp_quants(8, 63, mins, lm, sw);
    if (clamp63)
        for (int j = 0; j < 8; ++j) {
            ls[j] = std::min<uint8_t>(63, ls[j]);
            lm[j] = std::min<uint8_t>(63, lm[j]);
        }
    pack_k4_scales(ls, lm, scales_out);
    *d_out = f2h(d_block);
    *dmin_out = f2h(m_block);
    k4_requantize(x, nmax, *d_out, *dmin_out, scales_out, L);
}

// The quants of a Q4_K / Q5_K block against its rounded scales and mins.
void k4_requantize(const float* x, int nmax, uint16_t d_h, uint16_t dmin_h, const uint8_t* scales, uint8_t* L) {
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales, &sc, &m);
        const float d = h2f(d_h) * float(sc);
        if (d == 0.0f) continue;
        const float dm = h2f(dmin_h) * float(m);
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = uint8_t(l < 0 ? 0 : (l > nmax ? nmax : l));
        }
    }
}

// The quants of a Q2_K block against its packed scales and mins (d, dmin and scales set), into qs.
void q2_k_requantize(const float* x, BlockQ2_K& b, uint8_t* L) {
    for (int j = 0; j < 16; ++j) {
        const float d = h2f(b.d) * float(b.scales[j] & 0xF);
        if (d == 0.0f) continue;
        const float dm = h2f(b.dmin) * float(b.scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            const int l = nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = uint8_t(l < 0 ? 0 : (l > 3 ? 3 : l));
        }
    }
    pack_2bit(L, b.qs);
}

// Q2_K under an importance matrix row: the per-16 fits weighted by it, the 16 scales and mins fitted by
// make_qp_quants (4 bits) weighted by each group's total weight, and the quants again against them.
void quant_q2_k_weighted(const float* x, BlockQ2_K* y, int64_t n, const float* qw) {
    uint8_t L[kQK_K], Laux[16], ls[16], lm[16];
    float weights[16], mins[16], scales[16], sw[16];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, qw += kQK_K) {
        const float sigma2 = sum_squares(kQK_K, x) / kQK_K;
        for (int j = 0; j < 16; ++j) {
            importance_weights(16, x + 16 * j, qw + 16 * j, sigma2, weights, &sw[j]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
        }
        BlockQ2_K& b = y[i];
        b.d = f2h(make_qp_quants(16, 15, scales, ls, sw));
        b.dmin = f2h(make_qp_quants(16, 15, mins, lm, sw));
        for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(ls[j] | (lm[j] << 4));
        q2_k_requantize(x, b, L);
    }
}

// The quants of a Q3_K block against its packed scales (d and scales set), into hmask and qs.
void q3_k_requantize(const float* x, BlockQ3_K& b, int8_t* L) {
    for (int j = 0; j < 16; ++j) {
        int sc = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
        sc = (sc | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        const float d = h2f(b.d) * float(sc);
        if (d == 0.0f) continue;
        for (int ii = 0; ii < 16; ++ii) {
            const int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = int8_t((l < -4 ? -4 : (l > 3 ? 3 : l)) + 4);
        }
    }
    std::memset(b.hmask, 0, sizeof b.hmask);
    uint8_t low[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
        int l = L[j];
        if (l > 3) {
            b.hmask[j % 32] = uint8_t(b.hmask[j % 32] | (1 << (j / 32)));
            l -= 4;
        }
        low[j] = uint8_t(l);
    }
    pack_2bit(low, b.qs);
}

// Q3_K under an importance matrix row: per 16 values a symmetric fit weighted by it, the 16 scales fitted
// by make_qx_quants (6 bits, weighted by each group's total weight) with d stored as fitted.
void quant_q3_k_weighted(const float* x, BlockQ3_K* y, int64_t n, const float* qw) {
    int8_t L[kQK_K], ls[16];
    float weights[16], scales[16], sw[16];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, qw += kQK_K) {
        const float sigma2 = 2 * sum_squares(kQK_K, x) / kQK_K;
        for (int j = 0; j < 16; ++j) {
            importance_weights(16, x + 16 * j, qw + 16 * j, sigma2, weights, &sw[j]);
            scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, weights);
        }
        BlockQ3_K& b = y[i];
        std::memset(b.scales, 0, sizeof b.scales);
        const float d_block = make_qx_quants(16, 32, scales, ls, sw);
        for (int j = 0; j < 16; ++j) {
            int l = ls[j];
            if (j < 8)
                b.scales[j] = uint8_t(l & 0xF);
            else
                b.scales[j - 8] = uint8_t(b.scales[j - 8] | ((l & 0xF) << 4));
            l >>= 4;
            b.scales[j % 4 + 8] = uint8_t(b.scales[j % 4 + 8] | (l << (2 * (j / 4))));
        }
        b.d = f2h(d_block);
        q3_k_requantize(x, b, L);
    }
}

}  // namespace

void quant_q2_k(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockQ2_K*>(dst);
    if (qw) return quant_q2_k_weighted(x, y, n, qw);
    uint8_t L[kQK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        BlockQ2_K& b = y[i];
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(nearest_int(iscale * scales[j]));
            b.d = f2h(max_scale / 15.f);
        } else {
            for (int j = 0; j < 16; ++j) b.scales[j] = 0;
            b.d = f2h(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(b.scales[j] | (nearest_int(iscale * mins[j]) << 4));
            b.dmin = f2h(max_min / 15.f);
        } else {
            b.dmin = f2h(0.f);
        }
        q2_k_requantize(x, b, L);
    }
}

// Q3_K: per 16 values a symmetric 3-bit fit (make_q3_quants), the 16 scales as signed 6-bit multiples
// of the largest in magnitude / -32, and the quants again against the rounded scales; the high bit of
// each quant goes to hmask (bit k of byte m: value 32 k + m), the low two bits to qs.
void quant_q3_k(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockQ3_K*>(dst);
    if (qw) return quant_q3_k_weighted(x, y, n, qw);
    int8_t L[kQK_K];
    float scales[16];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > amax) {
                amax = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        BlockQ3_K& b = y[i];
        std::memset(b.scales, 0, sizeof b.scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) {
                int l = int8_t(nearest_int(iscale * scales[j]));
                l = (l < -32 ? -32 : (l > 31 ? 31 : l)) + 32;  // 0 .. 63
                if (j < 8)
                    b.scales[j] = uint8_t(l & 0xF);
                else
                    b.scales[j - 8] = uint8_t(b.scales[j - 8] | ((l & 0xF) << 4));
                b.scales[j % 4 + 8] = uint8_t(b.scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
            }
            b.d = f2h(1 / iscale);
        } else {
            b.d = f2h(0.f);
        }
        q3_k_requantize(x, b, L);
    }
}

void quant_q4_k(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockQ4_K*>(dst);
    uint8_t L[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        if (qw)
            quant_k4_weighted(x, qw + i * kQK_K, 15, false, &y[i].d, &y[i].dmin, y[i].scales, L);
        else
            quant_k4_common(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* q = y[i].qs;
        for (int j = 0; j < kQK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
    }
}

void quant_q5_k(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockQ5_K*>(dst);
    uint8_t L[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        if (qw)
            quant_k4_weighted(x, qw + i * kQK_K, 31, true, &y[i].d, &y[i].dmin, y[i].scales, L);
        else
            quant_k4_common(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* qh = y[i].qh;
        uint8_t* ql = y[i].qs;
        std::memset(qh, 0, kQK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int g = 0; g < kQK_K; g += 64, m1 <<= 2, m2 <<= 2, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[g + j], l2 = L[g + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = uint8_t(l1 | (l2 << 4));
            }
        }
    }
}

// Under an importance matrix row the per-16 fits are weighted by it directly (no sigma2 term).
void quant_q6_k(const float* x, void* dst, int64_t n, const float* qw) {
    auto* y = static_cast<BlockQ6_K*>(dst);
    int8_t L[kQK_K];
    float scales[16];
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ++ib) {
            const float* w = qw ? qw + i * kQK_K + 16 * ib : nullptr;
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, w);
            scales[ib] = scale;
            if (std::fabs(scale) > max_abs_scale) {
                max_abs_scale = std::fabs(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[i], 0, sizeof(BlockQ6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = f2h(1 / iscale);
        for (int ib = 0; ib < 16; ++ib) {
            const int s = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = int8_t(s < 127 ? s : 127);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = h2f(y[i].d) * float(y[i].scales[j]);
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = l < -32 ? -32 : (l > 31 ? 31 : l);
                L[16 * j + ii] = int8_t(l + 32);
            }
        }
        uint8_t* ql = y[i].ql;
        uint8_t* qh = y[i].qh;
        for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int a = L[j + l], b = L[j + l + 32], c = L[j + l + 64], e = L[j + l + 96];
                ql[l] = uint8_t((a & 0xF) | ((c & 0xF) << 4));
                ql[l + 32] = uint8_t((b & 0xF) | ((e & 0xF) << 4));
                qh[l] = uint8_t((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
            }
        }
    }
}

// Activation format: symmetric 8-bit with the largest magnitude at -127 (as ggml's Q8_K).
void quant_q8_k(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < kQK_K; ++j)
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        if (amax == 0.0f) {
            std::memset(&y[i], 0, sizeof(BlockQ8_K));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < kQK_K; ++j) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = int8_t(v < 127 ? v : 127);
        }
        for (int j = 0; j < kQK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[16 * j + ii];
            y[i].bsums[j] = int16_t(sum);
        }
        y[i].d = 1 / iscale;
    }
}

// ---- 32-element blocks under an importance matrix row (llama.cpp's quantize_row_q4_0_impl and
// siblings): the weights take sigma2 over the whole row, so x is one row of n values.

namespace {

// Packs 32 levels of 5 bits: the low nibbles in qs (value j and j + 16 share a byte), bit 4 in qh.
void pack_5bit(const uint8_t* L, uint8_t* qs, uint8_t* qh_out) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
        qh |= uint32_t((L[j] & 0x10u) >> 4) << j;
        qh |= uint32_t((L[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    std::memcpy(qh_out, &qh, 4);
}

// Symmetric types: x ~ d * (L - nmax).
template <class Block>
void quant_sym_weighted(const float* x, Block* y, int64_t n, const float* qw, int nmax) {
    float weights[32];
    int8_t L[32];
    float sum;
    const float sigma2 = sum_squares(int(n), x) / float(n);
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32, qw += 32) {
        importance_weights(32, x, qw, sigma2, weights, &sum);
        y[ib].d = f2h(make_qx_quants(32, nmax, x, L, weights));
        if constexpr (std::is_same_v<Block, BlockQ4_0>) {
            for (int j = 0; j < 16; ++j) y[ib].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
        } else {
            pack_5bit(reinterpret_cast<const uint8_t*>(L), y[ib].qs, y[ib].qh);
        }
    }
}

// Types with a minimum: x ~ d * L - m.
template <class Block>
void quant_min_weighted(const float* x, Block* y, int64_t n, const float* qw, int nmax) {
    float weights[32];
    uint8_t L[32], Laux[32];
    float sum, min;
    const float sigma2 = sum_squares(int(n), x) / float(n);
    for (int64_t ib = 0; ib < n / 32; ++ib, x += 32, qw += 32) {
        importance_weights(32, x, qw, sigma2, weights, &sum);
        const float d = make_qkx2_quants(32, nmax, x, weights, L, &min, Laux, -0.9f, 0.05f, 36);
        y[ib].d = f2h(d);
        y[ib].m = f2h(-min);
        if constexpr (std::is_same_v<Block, BlockQ4_1>) {
            for (int j = 0; j < 16; ++j) y[ib].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
        } else {
            pack_5bit(L, y[ib].qs, y[ib].qh);
        }
    }
}

}  // namespace

void quant_q4_0_weighted(const float* x, void* dst, int64_t n, const float* qw) {
    quant_sym_weighted(x, static_cast<BlockQ4_0*>(dst), n, qw, 8);
}
void quant_q5_0_weighted(const float* x, void* dst, int64_t n, const float* qw) {
    quant_sym_weighted(x, static_cast<BlockQ5_0*>(dst), n, qw, 16);
}
void quant_q4_1_weighted(const float* x, void* dst, int64_t n, const float* qw) {
    quant_min_weighted(x, static_cast<BlockQ4_1*>(dst), n, qw, 15);
}
void quant_q5_1_weighted(const float* x, void* dst, int64_t n, const float* qw) {
    quant_min_weighted(x, static_cast<BlockQ5_1*>(dst), n, qw, 31);
}

}  // namespace cera::quant_detail
