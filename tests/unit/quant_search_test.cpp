// The AVX-512 form of the K-quant grid search (qkx2_search_avx512) against the scalar reference loop:
// the same levels, scale, minimum and error, bit for bit, for Q2_K's, Q4_K's and Q5_K's parameters over
// inputs that move the minimum between steps (so later lanes are redone) and inputs that do not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/quant/quant.h"
#include "core/quant/quant_k.h"

namespace {

using cera::quant_detail::Qkx2Search;

struct Params {
    int n, nmax;
    float rmin, rdelta;
    int nstep;
    bool use_mad;
};

// The search's starting point as make_qkx2_quants sets it up (its first fit).
Qkx2Search start(const Params& p, const std::vector<float>& x, const std::vector<float>& w, uint8_t* L, uint8_t* Laux) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < p.n; ++i) {
        min = std::min(min, x[size_t(i)]);
        max = std::max(max, x[size_t(i)]);
        sum_w += w[size_t(i)];
        sum_x += w[size_t(i)] * x[size_t(i)];
    }
    if (min > 0) min = 0;
    const float iscale = float(p.nmax) / (max - min), scale = 1 / iscale;
    float err = 0;
    for (int i = 0; i < p.n; ++i) {
        const int l = cera::nearest_int(iscale * (x[size_t(i)] - min));
        L[i] = uint8_t(std::clamp(l, 0, p.nmax));
        const float d = scale * float(L[i]) + min - x[size_t(i)];
        err += w[size_t(i)] * (p.use_mad ? std::fabs(d) : d * d);
    }
    return {p.n,   p.nmax, x.data(), w.data(), p.rmin, p.rdelta, p.nstep, p.use_mad,
            sum_w, sum_x,  max,      min,      scale,  err,      L,       Laux};
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

TEST(QuantSearch, Avx512MatchesTheScalarLoopBitForBit) {
    if (!cera::cpu_features().has_avx512_set()) GTEST_SKIP() << "no AVX-512";
    const Params params[] = {
        {32, 15, -1.0f, 0.1f, 20, false},  // Q4_K
        {32, 31, -0.5f, 0.1f, 15, false},  // Q5_K
        {16, 3, -0.5f, 0.1f, 15, true},    // Q2_K
    };
    std::mt19937 rng(7);
    int moved = 0, cases = 0;
    for (const Params& p : params) {
        for (int c = 0; c < 3000; ++c) {
            std::vector<float> x(size_t(p.n)), w(size_t(p.n));
            std::normal_distribution<float> nd(float(c % 5) * 0.3f - 0.6f, 0.01f + float(c % 7));
            std::uniform_real_distribution<float> ud(0.0f, 1.0f);
            for (int i = 0; i < p.n; ++i) {
                x[size_t(i)] = c % 11 == 0 ? std::fabs(nd(rng)) : nd(rng);  // all positive: min stays 0
                if (c % 13 == 0 && i % 9 == 0) x[size_t(i)] *= 20.0f;       // outliers
                w[size_t(i)] = c % 3 == 0 ? 1.0f : 0.05f + ud(rng) + x[size_t(i)] * x[size_t(i)];
            }
            uint8_t L1[32], Laux1[32], L2[32], Laux2[32];
            Qkx2Search a = start(p, x, w, L1, Laux1), b = start(p, x, w, L2, Laux2);
            if (a.max == a.min) continue;
            const float min0 = a.min;
            cera::quant_detail::qkx2_search(a);
            cera::quant_detail::qkx2_search_avx512(b);
            ++cases;
            moved += a.min != min0;
            ASSERT_EQ(bits(a.scale), bits(b.scale)) << "case " << c << " nmax " << p.nmax;
            ASSERT_EQ(bits(a.min), bits(b.min)) << "case " << c << " nmax " << p.nmax;
            ASSERT_EQ(bits(a.best_error), bits(b.best_error)) << "case " << c << " nmax " << p.nmax;
            ASSERT_EQ(std::memcmp(L1, L2, size_t(p.n)), 0) << "case " << c << " nmax " << p.nmax;
        }
    }
    EXPECT_GT(moved, cases / 4);  // the restarts were exercised
    EXPECT_LT(moved, cases);      // and so were rounds with no restart
}

}  // namespace
