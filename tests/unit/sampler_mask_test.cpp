// Sampler::sample(logits, allowed): under every setting, the distribution among the allowed tokens
// is the one the plain sampler gives for the logits with every other token at -inf, and every draw
// is an allowed token.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "cera/sampler.h"

namespace cera {
namespace {

TEST(SamplerMask, EqualsMinusInfinityLogitsUnderEverySetting) {
    const int32_t n = 3000;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> logits(n);
    for (float& l : logits) l = nd(rng);
    const std::vector<SamplerParams> settings = {
        {.temperature = 0.0f},
        {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f},
        {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
        {.temperature = 1.3f, .top_k = 0, .top_p = 0.5f, .min_p = 0.0f},
        {.temperature = 0.7f,
         .top_k = 5,
         .top_p = 1.0f,
         .min_p = 0.2f,
         .repeat_penalty = 1.3f,
         .frequency_penalty = 0.2f,
         .presence_penalty = 0.5f,
         .penalty_last_n = 16},
        {.temperature = 0.0f, .repeat_penalty = 1.5f, .penalty_last_n = 8},
    };
    std::vector<SamplerParams> biased = settings;  // and each with a logit bias
    for (SamplerParams& p : biased) p.logit_bias = {{3, 4.0f}, {13, -2.0f}, {2999, 1.5f}, {4, 3.0f}};
    const std::vector<SamplerParams> all = [&] {
        std::vector<SamplerParams> v = settings;
        v.insert(v.end(), biased.begin(), biased.end());
        return v;
    }();
    for (int density : {1, 10, 300}) {  // allowed: every density-th token, plus a few
        std::vector<uint64_t> mask((n + 63) / 64, 0);
        std::vector<float> masked(n, -std::numeric_limits<float>::infinity());
        for (int32_t id = 0; id < n; ++id)
            if (id % density == 3 || id == 2999) {
                mask[size_t(id) >> 6] |= 1ull << (id & 63);
                masked[size_t(id)] = logits[size_t(id)];
            }
        for (const SamplerParams& p : all) {
            SCOPED_TRACE(::testing::Message()
                         << "density " << density << " temp " << p.temperature << " k " << p.top_k);
            Sampler a(p, n), b(p, n);
            for (int32_t t : {3, 13, 2999, 3, 7, 103}) a.accept(t), b.accept(t);  // some in the window
            std::map<int32_t, float> want, got;
            for (const TokenProb& tp : b.distribution(masked.data()))
                if (tp.p > 0) want[tp.id] = tp.p;
            for (const TokenProb& tp : a.distribution(logits.data(), mask.data())) got[tp.id] = tp.p;
            ASSERT_EQ(got.size(), want.size());
            for (const auto& [id, pr] : want) EXPECT_NEAR(got[id], pr, 1e-5) << id;
            for (int i = 0; i < 200; ++i) {
                const int32_t t = a.sample(logits.data(), mask.data());
                ASSERT_TRUE((mask[size_t(t) >> 6] >> (t & 63)) & 1) << t;
            }
        }
    }
}

}  // namespace
}  // namespace cera
