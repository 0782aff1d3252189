// The CPU row kernels no backend op reaches (dot_f32, softmax; rms_norm, silu_mul and add are checked
// through the backend by the op harness, op_harness_test.cpp): every ISA this CPU has against the
// scalar references (float64), over lengths that are not multiples of the vector width and length 1.
// Tolerances: a sum of n products in f32: 2 n u relative to the sum of magnitudes (u = 2^-24); the
// vector exp is accurate to ~2e-7 relative, so 2e-6 relative, and softmax adds the rounding of
// x - max (|x - max| u) and of its f32 normalizer sum (n u).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"

using namespace cera;
using cera::cpu::Isa;

namespace {

std::vector<Isa> available_isas() {
    std::vector<Isa> out;
    for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
        if (cera::cpu::isa_supported(isa)) out.push_back(isa);
    return out;
}

const int64_t kLengths[] = {1, 3, 15, 16, 17, 64, 100, 1024, 4099};

std::vector<float> randv(int64_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = g(rng);
    return v;
}

class Ops : public testing::TestWithParam<Isa> {
   protected:
    void SetUp() override { cpu::force_isa(GetParam()); }
    void TearDown() override { cpu::force_isa(available_isas().back()); }
};

TEST_P(Ops, Dot) {
    std::mt19937 rng(3);
    for (int64_t n : kLengths) {
        auto a = randv(n, rng), b = randv(n, rng);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
            exact += double(a[i]) * b[i];
            mag += std::fabs(double(a[i]) * b[i]);
        }
        EXPECT_NEAR(cpu::dot_f32(a.data(), b.data(), n), exact, 2.0 * n * 6e-8 * mag + 1e-30) << n;
        EXPECT_NEAR(cpu::dot_f32_ref(a.data(), b.data(), n), exact, 6e-8 * std::fabs(exact) + 1e-30) << n;
    }
}

TEST_P(Ops, Softmax) {
    std::mt19937 rng(4);
    for (int64_t n : kLengths) {
        auto x = randv(n, rng, 5.0f);
        if (n > 2) x[1] = -1e30f;  // a masked position gives exactly 0
        std::vector<double> want(x.size());
        double mx = -1e300, sum = 0;
        for (float v : x) mx = std::max(mx, double(v));
        for (int64_t i = 0; i < n; ++i) sum += want[i] = std::exp(double(x[i]) - mx);
        auto y = x, yref = x;
        cpu::softmax(y.data(), n);
        cpu::softmax_ref(yref.data(), n);
        double total = 0;
        for (int64_t i = 0; i < n; ++i) {
            want[i] /= sum;
            total += y[i];
            // x - max is rounded to f32 first: exp's relative error grows by |x - max| * 2^-24
            const double arg_err = std::fabs(double(x[i]) - mx) * 1.2e-7;
            EXPECT_NEAR(yref[i], want[i], (1e-6 + arg_err) * want[i] + 1e-38) << n << " " << i;
            // plus the f32 sum of n terms in the normalizer: n u
            EXPECT_NEAR(y[i], want[i], (2e-6 + arg_err + double(n) * 6e-8) * want[i] + 1e-38) << n << " " << i;
        }
        if (n > 2) {
            EXPECT_EQ(y[1], 0.0f);
        }
        EXPECT_NEAR(total, 1.0, 1e-5);
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Ops, testing::ValuesIn(available_isas()),
                         [](const testing::TestParamInfo<Isa>& i) { return std::string(cpu::isa_name(i.param)); });

}  // namespace
