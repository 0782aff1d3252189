// The statistics of the sampled speculative decoding tests (speculative_test.cpp for the session,
// batcher_speculative_test.cpp for the batched engine): a row's top-k distribution and Pearson's
// chi-square of sampled counts against it.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

namespace cera::test {

// Softmax over the k best logits of a row (the sampler with top_k = k, temperature 1, top-p and min-p
// off), as an id -> p map.
inline std::map<int32_t, double> top_k_softmax(std::span<const float> row, int k) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    double sum = 0;
    std::map<int32_t, double> p;
    for (int i = 0; i < k; ++i) sum += std::exp(double(row[ids[i]]) - double(row[ids[0]]));
    for (int i = 0; i < k; ++i) p[ids[i]] = std::exp(double(row[ids[i]]) - double(row[ids[0]])) / sum;
    return p;
}

// Pearson's chi-square of counts against probabilities, categories with an expected count under 5 pooled;
// returns the statistic and the degrees of freedom. Samples of ids outside p fail the calling test.
inline std::pair<double, int> chi_square(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& p,
                                         int n) {
    double stat = 0, pooled_e = 0, pooled_o = 0;
    int cats = 0;
    for (const auto& [id, pr] : p) {
        const double e = pr * n;
        const double o = counts.count(id) ? counts.at(id) : 0;
        if (e < 5) {
            pooled_e += e, pooled_o += o;
            continue;
        }
        stat += (o - e) * (o - e) / e;
        ++cats;
    }
    int outside = 0;  // samples of ids the distribution gives no mass
    for (const auto& [id, c] : counts)
        if (!p.count(id)) outside += c;
    EXPECT_EQ(outside, 0);
    if (pooled_e > 0) {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        ++cats;
    }
    return {stat, cats - 1};
}

// The chi-square critical value at significance 0.001 (Wilson-Hilferty).
inline double chi_square_critical(int df) {
    const double z = 3.090, a = 2.0 / (9.0 * df);
    return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

}  // namespace cera::test
