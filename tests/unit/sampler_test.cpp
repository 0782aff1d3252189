// The sampler chain against exact math on hand-made distributions, a brute-force
// reference on a large random vocabulary, and empirical frequencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "backends/top_logits_host.h"
#include "cera/error.h"
#include "cera/sampler.h"

namespace cera {
namespace {

SamplerParams plain() {  // every filter off, temperature 1
    SamplerParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

std::vector<float> log_probs(std::vector<double> p) {
    std::vector<float> l;
    for (double x : p) l.push_back(float(std::log(x)));
    return l;
}

std::map<int32_t, double> as_map(std::span<const TokenProb> d) {
    std::map<int32_t, double> m;
    for (const auto& t : d) m[t.id] = t.p;
    return m;
}

TEST(Sampler, GreedyPicksArgMaxLowestIdOnTies) {
    SamplerParams p = plain();
    p.temperature = 0.0f;
    Sampler s(p, 5);
    std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f};
    EXPECT_EQ(s.sample(l.data()), 1);
    auto d = s.distribution(l.data());
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].id, 1);
    EXPECT_EQ(d[0].p, 1.0f);
    p.temperature = -1.0f;  // negative is greedy too
    Sampler s2(p, 5);
    l[4] = 7.0f;
    EXPECT_EQ(s2.sample(l.data()), 4);
}

TEST(Sampler, TemperatureOneIsSoftmax) {
    Sampler s(plain(), 4);
    auto l = log_probs({0.1, 0.2, 0.3, 0.4});
    auto m = as_map(s.distribution(l.data()));
    ASSERT_EQ(m.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(m[i], 0.1 * (i + 1), 1e-6);
}

TEST(Sampler, TemperatureScalesLogits) {
    SamplerParams p = plain();
    p.temperature = 2.0f;
    Sampler s(p, 3);
    std::vector<float> l = {0.0f, float(std::log(2.0)), float(std::log(4.0))};  // T=2 -> 1 : sqrt2 : 2
    auto d = s.distribution(l.data());
    auto m = as_map(d);
    const double z = 1 + std::sqrt(2.0) + 2;
    EXPECT_NEAR(m[0], 1 / z, 1e-6);
    EXPECT_NEAR(m[1], std::sqrt(2.0) / z, 1e-6);
    EXPECT_NEAR(m[2], 2 / z, 1e-6);
    EXPECT_EQ(d[0].id, 2);  // most likely first
    EXPECT_NEAR(d[0].logit, std::log(4.0) / 2, 1e-6);
}

TEST(Sampler, TopKKeepsKBestRenormalised) {
    SamplerParams p = plain();
    p.top_k = 2;
    Sampler s(p, 5);
    auto l = log_probs({0.1, 0.4, 0.05, 0.25, 0.2});
    auto d = s.distribution(l.data());
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].id, 1);
    EXPECT_EQ(d[1].id, 3);
    EXPECT_NEAR(d[0].p, 0.4 / 0.65, 1e-6);
    EXPECT_NEAR(d[1].p, 0.25 / 0.65, 1e-6);
    p.top_k = 1;
    Sampler s1(p, 5);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s1.sample(l.data()), 1);
}

TEST(Sampler, TopPCutOff) {
    auto l = log_probs({0.05, 0.5, 0.15, 0.3});  // sorted: 0.5 0.3 0.15 0.05; cum 0.5 0.8 0.95 1
    auto kept = [&](float top_p) {
        SamplerParams p = plain();
        p.top_p = top_p;
        Sampler s(p, 4);
        return as_map(s.distribution(l.data()));
    };
    EXPECT_EQ(kept(0.4f).size(), 1u);
    EXPECT_EQ(kept(0.5f - 1e-4f).size(), 1u);
    EXPECT_EQ(kept(0.5f + 1e-4f).size(), 2u);
    EXPECT_EQ(kept(0.79f).size(), 2u);
    EXPECT_EQ(kept(0.81f).size(), 3u);
    EXPECT_EQ(kept(0.96f).size(), 4u);
    auto m = kept(0.79f);
    EXPECT_NEAR(m[1], 0.5 / 0.8, 1e-6);
    EXPECT_NEAR(m[3], 0.3 / 0.8, 1e-6);
}

TEST(Sampler, MinPCutOff) {
    auto l = log_probs({0.05, 0.5, 0.15, 0.3});
    auto kept = [&](float min_p) {
        SamplerParams p = plain();
        p.min_p = min_p;
        Sampler s(p, 4);
        return as_map(s.distribution(l.data()));
    };
    EXPECT_EQ(kept(0.09f).size(), 4u);   // 0.05 >= 0.045
    EXPECT_EQ(kept(0.11f).size(), 3u);   // 0.05 < 0.055 <= 0.15
    EXPECT_EQ(kept(0.29f).size(), 3u);   // 0.15 >= 0.145
    EXPECT_EQ(kept(0.31f).size(), 2u);
    EXPECT_EQ(kept(0.59f).size(), 2u);
    EXPECT_EQ(kept(0.61f).size(), 1u);
    auto m = kept(0.2f);
    EXPECT_NEAR(m[2], 0.15 / 0.95, 1e-6);
}

TEST(Sampler, FiltersComposeInOrder) {
    // top-k 3 -> {0.5, 0.3, 0.15} renormalised by 0.95: 0.526 0.316 0.158;
    // top-p 0.8 on those keeps 2 (cum 0.526, 0.842); min-p 0.7 then drops 0.3 (< 0.7*0.5).
    auto l = log_probs({0.05, 0.5, 0.15, 0.3});
    SamplerParams p = plain();
    p.top_k = 3;
    p.top_p = 0.8f;
    Sampler a(p, 4);
    EXPECT_EQ(a.distribution(l.data()).size(), 2u);
    p.min_p = 0.7f;
    Sampler b(p, 4);
    EXPECT_EQ(b.distribution(l.data()).size(), 1u);
    // top-p sees temperature-1 probabilities: a high temperature does not widen the cut.
    p = plain();
    p.top_p = 0.79f;
    p.temperature = 5.0f;
    Sampler c(p, 4);
    EXPECT_EQ(c.distribution(l.data()).size(), 2u);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
    SamplerParams p = plain();
    p.repeat_penalty = 2.0f;
    Sampler s(p, 4);
    s.accept(0);
    s.accept(1);
    s.accept(1);  // counted once for the repetition penalty
    std::vector<float> l = {2.0f, -1.0f, 0.5f, 0.0f};
    auto d = s.distribution(l.data());
    std::map<int32_t, float> got;
    for (const auto& t : d) got[t.id] = t.logit;
    EXPECT_FLOAT_EQ(got[0], 1.0f);
    EXPECT_FLOAT_EQ(got[1], -2.0f);
    EXPECT_FLOAT_EQ(got[2], 0.5f);
    EXPECT_FLOAT_EQ(got[3], 0.0f);
}

TEST(Sampler, FrequencyAndPresencePenalties) {
    SamplerParams p = plain();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    Sampler s(p, 4);
    for (int32_t t : {2, 2, 2, 1}) s.accept(t);
    std::vector<float> l = {1.0f, 1.0f, 1.0f, 1.0f};
    std::map<int32_t, float> got;
    for (const auto& t : s.distribution(l.data())) got[t.id] = t.logit;
    EXPECT_FLOAT_EQ(got[0], 1.0f);
    EXPECT_FLOAT_EQ(got[1], 1.0f - 0.5f - 0.25f);
    EXPECT_FLOAT_EQ(got[2], 1.0f - 1.5f - 0.25f);
    EXPECT_FLOAT_EQ(got[3], 1.0f);
}

TEST(Sampler, PenaltyWindowForgetsOldTokens) {
    SamplerParams p = plain();
    p.temperature = 0.0f;
    p.repeat_penalty = 10.0f;
    p.penalty_last_n = 2;
    Sampler s(p, 3);
    std::vector<float> l = {3.0f, 2.0f, 1.0f};
    EXPECT_EQ(s.sample(l.data()), 0);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);  // 0 -> 0.3
    s.accept(1);
    EXPECT_EQ(s.sample(l.data()), 2);  // 0 -> 0.3, 1 -> 0.2
    s.accept(2);                       // window {1, 2}: 0 is free again
    EXPECT_EQ(s.history(), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(s.sample(l.data()), 0);
    s.reset();
    EXPECT_TRUE(s.history().empty());
    p.penalty_last_n = 0;  // window 0: penalties off
    Sampler off(p, 3);
    off.accept(0);
    EXPECT_EQ(off.sample(l.data()), 0);
}

TEST(Sampler, SameSeedSameSequence) {
    SamplerParams p = plain();
    p.seed = 1234;
    std::vector<float> l(100);
    std::mt19937 g(7);
    std::normal_distribution<float> nd;
    for (auto& x : l) x = nd(g);
    auto run = [&](uint64_t seed) {
        p.seed = seed;
        Sampler s(p, 100);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) out.push_back(s.sample(l.data()));
        return out;
    };
    EXPECT_EQ(run(1234), run(1234));
    EXPECT_NE(run(1234), run(1235));
    Sampler s(p, 100);  // reset() restarts the stream
    std::vector<int32_t> a, b;
    for (int i = 0; i < 50; ++i) a.push_back(s.sample(l.data()));
    s.reset();
    for (int i = 0; i < 50; ++i) b.push_back(s.sample(l.data()));
    EXPECT_EQ(a, b);
}

// Draw many times; each frequency within 5 standard deviations of its probability,
// and Pearson's chi-square below the 0.9999 quantile.
void expect_frequencies(Sampler& s, const std::vector<float>& logits, const std::map<int32_t, double>& want,
                        int draws) {
    std::map<int32_t, int> hits;
    for (int i = 0; i < draws; ++i) ++hits[s.sample(logits.data())];
    double chi2 = 0.0;
    for (const auto& [id, n] : hits) EXPECT_TRUE(want.count(id)) << "drew filtered-out token " << id;
    for (const auto& [id, prob] : want) {
        const double expect = prob * draws;
        const double sd = std::sqrt(draws * prob * (1 - prob));
        EXPECT_NEAR(hits[id], expect, 5 * sd + 1) << "token " << id;
        chi2 += (hits[id] - expect) * (hits[id] - expect) / expect;
    }
    // chi-square 0.9999 quantiles for 1..5 degrees of freedom
    const double q[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74};
    EXPECT_LT(chi2, q[want.size() - 1]);
}

TEST(Sampler, EmpiricalFrequenciesMatchProbabilities) {
    SamplerParams p = plain();
    p.seed = 42;
    Sampler s(p, 5);
    auto l = log_probs({0.4, 0.25, 0.2, 0.1, 0.05});
    expect_frequencies(s, l, {{0, 0.4}, {1, 0.25}, {2, 0.2}, {3, 0.1}, {4, 0.05}}, 5000);

    p.top_k = 3;
    p.temperature = 0.5f;  // squares the probabilities: 0.16 0.0625 0.04 over 0.2625
    Sampler t(p, 5);
    const double z = 0.16 + 0.0625 + 0.04;
    expect_frequencies(t, l, {{0, 0.16 / z}, {1, 0.0625 / z}, {2, 0.04 / z}}, 5000);
}

// A large random vocabulary exercises the chunked partial sort; compare with a
// brute-force implementation of the same chain (full sort, double precision).
TEST(Sampler, LargeVocabularyMatchesBruteForce) {
    const int32_t n = 20000;
    std::mt19937 g(99);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> l(n);
    for (auto& x : l) x = nd(g);

    struct Case {
        int32_t top_k;
        float top_p, min_p, temp;
    };
    for (const Case& c : {Case{0, 0.9f, 0.0f, 1.0f}, Case{0, 0.999f, 0.0f, 0.7f}, Case{100, 0.95f, 0.05f, 1.3f},
                          Case{0, 1.0f, 0.01f, 1.0f}, Case{0, 0.5f, 0.001f, 2.0f}}) {
        SamplerParams p = plain();
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.temperature = c.temp;
        Sampler s(p, n);
        auto d = s.distribution(l.data());

        std::vector<int32_t> idx(n);
        std::iota(idx.begin(), idx.end(), 0);
        std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        int32_t keep = c.top_k > 0 ? c.top_k : n;
        double z = 0;
        for (int32_t i = 0; i < keep; ++i) z += std::exp(double(l[idx[i]]) - l[idx[0]]);
        if (c.top_p < 1.0f) {
            double cum = 0;
            for (int32_t i = 0; i < keep; ++i) {
                cum += std::exp(double(l[idx[i]]) - l[idx[0]]) / z;
                if (cum >= c.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if (c.min_p > 0.0f) {
            int32_t m = 0;
            while (m < keep && double(l[idx[m]]) >= double(l[idx[0]]) + std::log(double(c.min_p))) ++m;
            keep = std::max(m, 1);
        }
        ASSERT_EQ(int32_t(d.size()), keep) << "top_p " << c.top_p << " min_p " << c.min_p;
        double zt = 0;
        for (int32_t i = 0; i < keep; ++i) zt += std::exp((double(l[idx[i]]) - l[idx[0]]) / c.temp);
        for (int32_t i = 0; i < keep; ++i) {
            EXPECT_EQ(d[size_t(i)].id, idx[i]);
            EXPECT_NEAR(d[size_t(i)].p, std::exp((double(l[idx[i]]) - l[idx[0]]) / c.temp) / zt, 1e-5);
        }
        // sample() draws only from the kept set
        std::map<int32_t, bool> kept;
        for (int32_t i = 0; i < keep; ++i) kept[idx[i]] = true;
        for (int i = 0; i < 200; ++i) EXPECT_TRUE(kept.count(s.sample(l.data())));
    }
}

// Top-k and greedy gather only the raw top (k + window) ids plus the window's; with penalties
// that raise and lower logits, the result must equal penalising every logit first.
TEST(Sampler, TopKWithPenaltiesMatchesPenalisingEverything) {
    const int32_t n = 30000;
    std::mt19937 g(3);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> l(n);
    for (auto& x : l) x = nd(g);
    std::vector<int32_t> best(n);
    std::iota(best.begin(), best.end(), 0);
    std::sort(best.begin(), best.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    // The window: the 20 best ids (pushed down) and 10 poor ones (pulled up by a negative penalty).
    std::vector<int32_t> window(best.begin(), best.begin() + 20);
    window.insert(window.end(), best.end() - 10, best.end());
    window.push_back(best[0]);  // one repeat
    for (float freq : {0.0f, -30.0f}) {
        SamplerParams p = plain();
        p.repeat_penalty = 1.5f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = freq;
        p.penalty_last_n = 64;
        p.top_k = 25;
        Sampler s(p, n);
        for (int32_t t : window) s.accept(t);

        std::vector<double> pen(l.begin(), l.end());
        std::map<int32_t, int> count;
        for (int32_t t : window) ++count[t];
        for (const auto& [t, c] : count) {
            double x = l[t];
            x = x <= 0 ? x * 1.5 : x / 1.5;
            pen[t] = x - (c * double(freq) + 0.5);
        }
        std::vector<int32_t> idx(n);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return pen[a] > pen[b]; });
        auto d = s.distribution(l.data());
        ASSERT_EQ(d.size(), 25u);
        double z = 0;
        for (int i = 0; i < 25; ++i) z += std::exp(pen[idx[i]] - pen[idx[0]]);
        for (int i = 0; i < 25; ++i) {
            EXPECT_EQ(d[size_t(i)].id, idx[i]) << "freq " << freq << " rank " << i;
            EXPECT_NEAR(d[size_t(i)].p, std::exp(pen[idx[i]] - pen[idx[0]]) / z, 1e-5);
        }
        p.temperature = 0.0f;  // greedy takes the same path with k = 1
        Sampler gs(p, n);
        for (int32_t t : window) gs.accept(t);
        EXPECT_EQ(gs.sample(l.data()), idx[0]) << "freq " << freq;
    }
}

// A row with ties (values on a coarse grid), -inf and NaN entries.
std::vector<float> tied_row(int32_t n, std::mt19937& g) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::uniform_int_distribution<int> kind(0, 99);
    std::vector<float> l(static_cast<size_t>(n));
    for (auto& x : l) {
        const int c = kind(g);
        x = c == 0 ? -INFINITY : c == 1 ? NAN : std::round(nd(g) * 4.0f) / 4.0f;
    }
    return l;
}

TEST(TopLogits, HostReferenceMatchesFullSort) {
    std::mt19937 g(11);
    for (int32_t n : {1, 7, 300, 5000}) {
        for (int32_t m : {1, 3, 40, 104, 1024}) {
            const auto l = tied_row(n, g);
            std::vector<int32_t> valid;
            for (int32_t i = 0; i < n; ++i)
                if (l[size_t(i)] > -INFINITY) valid.push_back(i);
            std::stable_sort(valid.begin(), valid.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
            const std::vector<int32_t> gather = {0, n - 1, n, -1, n / 2};
            std::vector<int32_t> out(size_t(1 + 2 * m) + gather.size());
            top_logits_host(l.data(), n, m, gather.data(), int64_t(gather.size()), out.data());
            const int32_t c = std::min<int32_t>(m, int32_t(valid.size()));
            ASSERT_EQ(out[0], c) << "n " << n << " m " << m;
            for (int32_t j = 0; j < c; ++j) {
                EXPECT_EQ(out[size_t(1 + j)], valid[size_t(j)]) << "n " << n << " m " << m << " rank " << j;
                float v;
                std::memcpy(&v, &out[size_t(1 + m + j)], 4);
                EXPECT_EQ(v, l[size_t(valid[size_t(j)])]);
            }
            for (size_t k = 0; k < gather.size(); ++k) {
                float v;
                std::memcpy(&v, &out[size_t(1 + 2 * m) + k], 4);
                const int32_t i = gather[k];
                if (i < 0 || i >= n || std::isnan(l[size_t(i)])) EXPECT_TRUE(std::isnan(v)) << k;
                else EXPECT_EQ(v, l[size_t(i)]) << k;
            }
        }
    }
}

// Sampling from the best top_needed() logits and the window's (what a device backend sends back)
// draws exactly the tokens sample() draws from the whole rows, step after step.
TEST(Sampler, SampleTopMatchesSample) {
    const int32_t n = 5000;
    std::mt19937 g(5);
    struct Case {
        int32_t k;
        float temp, top_p, min_p, rep, freq;
    };
    const Case cases[] = {{1, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f},    {5, 0.8f, 0.95f, 0.05f, 1.0f, 0.0f},
                          {40, 1.5f, 0.9f, 0.0f, 1.3f, 0.5f},  {100, 0.7f, 1.0f, 0.1f, 0.8f, -0.5f},
                          {64, 2.0f, 0.5f, 0.0f, 1.1f, 0.0f},  {40, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f}};
    for (const Case& cs : cases) {
        SamplerParams p;
        p.top_k = cs.k, p.temperature = cs.temp, p.top_p = cs.top_p, p.min_p = cs.min_p;
        p.repeat_penalty = cs.rep, p.frequency_penalty = cs.freq, p.penalty_last_n = 32, p.seed = 1234;
        Sampler a(p, n), b(p, n);
        const int32_t m = b.top_needed();
        ASSERT_GT(m, 0) << "k " << cs.k;
        std::vector<int32_t> out;
        std::vector<float> logits_m(static_cast<size_t>(m)), win(32);
        std::vector<int32_t> ids_m(static_cast<size_t>(m));
        for (int step = 0; step < 300; ++step) {
            auto l = tied_row(n, g);
            // Now and then a window token leads, so penalties decide the top.
            if (step % 3 == 0 && !b.history().empty()) l[size_t(b.history().back())] = 40.0f;
            const int32_t ta = a.sample(l.data());
            const auto window = b.window();
            out.assign(size_t(1 + 2 * m) + window.size(), 0);
            top_logits_host(l.data(), n, m, window.data(), int64_t(window.size()), out.data());
            const int32_t c = out[0];
            ASSERT_GT(c, 0);
            std::memcpy(ids_m.data(), &out[1], size_t(c) * 4);
            std::memcpy(logits_m.data(), &out[size_t(1 + m)], size_t(c) * 4);
            std::memcpy(win.data(), &out[size_t(1 + 2 * m)], window.size() * 4);
            const int32_t tb = b.sample_top(ids_m.data(), logits_m.data(), c, win.data());
            ASSERT_EQ(ta, tb) << "k " << cs.k << " step " << step;
            a.accept(ta);
            b.accept(tb);
        }
    }
    SamplerParams greedy;
    greedy.temperature = 0.0f;
    EXPECT_EQ(Sampler(greedy, n).top_needed(), 0);
    SamplerParams no_k;
    no_k.top_k = 0;
    EXPECT_EQ(Sampler(no_k, n).top_needed(), 0);
    SamplerParams big_k;
    big_k.top_k = 1000;  // 8 (k + window) >= n_vocab: the whole row is needed
    EXPECT_EQ(Sampler(big_k, n).top_needed(), 0);
}

TEST(Sampler, RejectsBadParams) {
    SamplerParams p = plain();
    p.repeat_penalty = 0.0f;
    EXPECT_THROW(Sampler(p, 4), Error);
    p = plain();
    p.top_p = NAN;
    EXPECT_THROW(Sampler(p, 4), Error);
    p = plain();
    p.penalty_last_n = -1;
    EXPECT_THROW(Sampler(p, 4), Error);
    EXPECT_THROW(Sampler(plain(), 0), Error);
}

TEST(Sampler, LogitBiasAddsToTheRawLogits) {
    // Greedy: a bias moves the pick; the device arg-max and top-k shortcuts are off for a biased row.
    SamplerParams p = plain();
    p.temperature = 0.0f;
    p.logit_bias = {{1, 0.5f}, {0, -100.0f}};
    Sampler s(p, 4);
    EXPECT_FALSE(s.picks_argmax());
    const std::vector<float> l = {2.0f, 1.6f, 1.8f, 0.0f};
    EXPECT_EQ(s.sample(l.data()), 1);  // 1.6 + 0.5 beats 1.8; 0 is banned
    // Sampling with top-k: the distribution is the biased one, whatever the vocabulary size.
    std::mt19937 rng(3);
    std::vector<float> big(4000);
    for (float& x : big) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    p = plain();
    p.top_k = 5;
    p.logit_bias = {{17, 50.0f}};
    Sampler k(p, 4000);
    EXPECT_EQ(k.top_needed(), 0);
    const auto d = k.distribution(big.data());
    ASSERT_EQ(d.size(), 5u);
    EXPECT_EQ(d[0].id, 17);
    EXPECT_NEAR(d[0].p, 1.0, 1e-6);
    p.logit_bias = {{4000, 1.0f}};
    EXPECT_THROW(Sampler(p, 4000), Error);
    p.logit_bias = {{3, NAN}};
    EXPECT_THROW(Sampler(p, 4000), Error);
}

TEST(Sampler, LogProbsAreTheLogSoftmaxAfterBiasAndPenalties) {
    std::mt19937 rng(7);
    const int32_t n = 3000;
    std::vector<float> l(n);
    for (float& x : l) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
    SamplerParams p = plain();
    p.temperature = 0.3f;  // neither the temperature nor the truncations change the log-probabilities
    p.top_k = 10;
    p.top_p = 0.5f;
    p.logit_bias = {{5, 3.0f}, {9, -100.0f}};
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    Sampler s(p, n);
    for (int32_t t : {5, 5, 7}) s.accept(t);
    // Reference: the biased, penalised logits' log-softmax in double.
    std::vector<double> ref(l.begin(), l.end());
    ref[5] += 3.0, ref[9] -= 100.0;
    ref[5] -= 2 * 0.5 + 0.25, ref[7] -= 0.5 + 0.25;
    const double mx = *std::max_element(ref.begin(), ref.end());
    double z = 0.0;
    for (double x : ref) z += std::exp(x - mx);
    for (double& x : ref) x -= mx + std::log(z);
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[size_t(a)] > ref[size_t(b)]; });
    const int32_t t = s.sample(l.data());
    std::vector<TokenLogprob> top(4);
    const float lp = s.log_probs(l.data(), t, 4, top.data());
    EXPECT_NEAR(lp, ref[size_t(t)], 1e-4);
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(top[size_t(i)].id, order[size_t(i)]);
        EXPECT_NEAR(top[size_t(i)].logprob, ref[size_t(order[size_t(i)])], 1e-4);
    }
    EXPECT_NEAR(s.log_probs(l.data(), 9, 0, nullptr), ref[9], 1e-3);
    // The random stream is untouched: the next draw is the one a sampler that never reported would make.
    Sampler twin(p, n);
    for (int32_t x : {5, 5, 7}) twin.accept(x);
    EXPECT_EQ(twin.sample(l.data()), t);
    EXPECT_EQ(s.sample(l.data()), twin.sample(l.data()));
}

TEST(Sampler, AllMinusInfinityStillReturnsAToken) {
    Sampler s(plain(), 3);
    std::vector<float> l(3, -INFINITY);
    const int32_t t = s.sample(l.data());
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 3);
}

}  // namespace
}  // namespace cera
