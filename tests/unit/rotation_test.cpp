// The rotation of the tq4 KV caches (core/rotation.h) against its definition, H D / sqrt(n) with H the
// Sylvester-Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) as an explicit product; its inverse; the
// CPU backend's rotate_heads over several heads; and the sign pattern is fixed (saved caches depend on it).
#include "core/rotation.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backends/backend.h"

namespace cera {
namespace {

std::vector<float> by_definition(const std::vector<float>& x) {
    const size_t n = x.size();
    std::vector<float> y(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
        double acc = 0;
        for (size_t j = 0; j < n; ++j) {
            const double h = (std::popcount(i & j) % 2) ? -1.0 : 1.0;
            acc += h * double(rotation_sign(int64_t(j))) * double(x[j]);
        }
        y[i] = float(acc / std::sqrt(double(n)));
    }
    return y;
}

std::vector<float> random_vector(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng);
    return x;
}

TEST(Rotation, EqualsTheSignedHadamardProductAndInvertsIt) {
    for (int64_t n : {2, 8, 32, 64, 128, 256}) {
        SCOPED_TRACE(n);
        const std::vector<float> x = random_vector(size_t(n), unsigned(n));
        std::vector<float> y = x;
        rotate_head(y.data(), n, false);
        const std::vector<float> want = by_definition(x);
        double norm_x = 0, norm_y = 0;
        for (size_t i = 0; i < y.size(); ++i) {
            EXPECT_NEAR(y[i], want[i], 1e-5f) << i;
            norm_x += double(x[i]) * x[i];
            norm_y += double(y[i]) * y[i];
        }
        EXPECT_NEAR(norm_y, norm_x, 1e-4 * norm_x);
        rotate_head(y.data(), n, true);
        for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5f) << i;
    }
}

TEST(Rotation, FitsPowersOfTwoOnly) {
    EXPECT_TRUE(rotation_fits(64));
    EXPECT_TRUE(rotation_fits(1024));
    EXPECT_FALSE(rotation_fits(96));
    EXPECT_FALSE(rotation_fits(1));
    EXPECT_FALSE(rotation_fits(2048));
}

// The signs are part of the cache format (a saved tq4 state holds rows rotated with them): the first
// sixteen as first defined, and about as many of each over a head of 1024.
TEST(Rotation, SignsAreFixed) {
    std::string first;
    for (int64_t i = 0; i < 16; ++i) first += rotation_sign(i) > 0 ? '+' : '-';
    EXPECT_EQ(first, "---+++-+--++--+-");
    int plus = 0;
    for (int64_t i = 0; i < 1024; ++i) plus += rotation_sign(i) > 0;
    EXPECT_GT(plus, 450);
    EXPECT_LT(plus, 574);
}

// A decode step's few heads and a prefill chunk's many (shared over the thread pool).
TEST(Rotation, CpuBackendRotatesEveryHead) {
    auto be = create_backend({});
    constexpr int kHead = 64, kHeads = 3;
    for (int rows : {5, 100}) {
        SCOPED_TRACE(rows);
        const std::vector<float> x = random_vector(size_t(kHead * kHeads * rows), 11);
        Tensor t = be->alloc(GgmlType::kF32, {kHead * kHeads, rows});
        be->write(t, x.data(), x.size() * 4);
        be->rotate_heads(t, kHead, false);
        std::vector<float> got(x.size());
        be->read(got.data(), t, got.size() * 4);
        for (int h = 0; h < kHeads * rows; ++h) {
            const std::vector<float> head(x.begin() + h * kHead, x.begin() + (h + 1) * kHead);
            const std::vector<float> want = by_definition(head);
            for (int i = 0; i < kHead; ++i) ASSERT_NEAR(got[size_t(h * kHead + i)], want[size_t(i)], 1e-5f) << h;
        }
        be->rotate_heads(t, kHead, true);
        be->read(got.data(), t, got.size() * 4);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-5f);
        be->free(t);
    }
}

}  // namespace
}  // namespace cera
