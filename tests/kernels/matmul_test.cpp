// Op harness for the CPU matmul: every ISA this CPU has, against a float64 reference built from the
// reference dequantizer, over every weight type and awkward shapes (k = one block and several
// blocks, 1/3/17/33 rows, 1/2/7/64 tokens, with and without threads, ldy > rows).
//
// Tolerances. Let S = sum_i |w_i x_i| and, per activation block b (32 elements for Q4_0/Q5_0/Q8_0,
// 256 for K-quants), A_b = max |x| over the block and W_b = sum_{i in b} |w_i|.
//  - float accumulation (every path): |err| <= 2 k u S, u = 2^-24 (worst case of a length-k sum);
//  - integer paths quantize the activations to 8 bits: x_i = d_b q_i + e_i with |e_i| <= d_b / 2,
//    d_b = A_b / 127, so the result moves by at most sum_b (A_b / 254) W_b (plus the float term).
// The ref ISA must equal matmul_ref exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "cera/error.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

using namespace cera;
using cera::cpu::Isa;

namespace {

std::vector<Isa> available_isas() {
    std::vector<Isa> out;
    for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512})
        if (cera::cpu::isa_supported(isa)) out.push_back(isa);
    return out;
}

// The activation block each ISA's kernel quantizes over for a weight type (0: f32 activations).
int act_block(Isa isa, GgmlType t) {
    if (isa == Isa::kRef) return 0;
    switch (t) {
        case GgmlType::kQ4_0:
        case GgmlType::kQ5_0:
        case GgmlType::kQ8_0: return 32;
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
        case GgmlType::kQ6_K: return isa == Isa::kAvx512 ? 256 : 0;
        default: return 0;
    }
}

// Random weight rows in `type`: quantized from gaussian values where we have a quantizer,
// random codes with sane fp16 scales otherwise (Q2_K, Q3_K).
std::vector<uint8_t> make_weights(GgmlType type, int64_t rows, int64_t k, std::mt19937& rng) {
    const size_t rs = row_size(type, k);
    std::vector<uint8_t> w(rs * size_t(rows));
    std::normal_distribution<float> g(0.0f, 1.0f);
    if (can_quantize(type)) {
        std::vector<float> x(static_cast<size_t>(k));
        for (int64_t r = 0; r < rows; ++r) {
            for (auto& v : x) v = g(rng) * (r % 3 == 0 ? 0.02f : 1.0f);
            quantize_row_ref(type, x.data(), w.data() + size_t(r) * rs, k);
        }
        return w;
    }
    for (auto& b : w) b = uint8_t(rng());
    const size_t bs = type_info(type).type_size;
    const size_t d_off = type == GgmlType::kQ2_K ? 80 : 108;  // d (and Q2_K's dmin) at the end
    for (size_t off = 0; off < w.size(); off += bs) {
        const uint16_t d = fp32_to_fp16(0.01f + 0.05f * float(rng() % 100) / 100.0f);
        std::memcpy(&w[off + d_off], &d, 2);
        if (type == GgmlType::kQ2_K) std::memcpy(&w[off + d_off + 2], &d, 2);
    }
    return w;
}

struct Case {
    GgmlType type;
    std::vector<int64_t> ks;
};

std::vector<Case> cases() {
    return {
        {GgmlType::kF32, {1, 7, 33, 96}},  {GgmlType::kF16, {5, 16, 100}},   {GgmlType::kBF16, {3, 48, 80}},
        {GgmlType::kQ4_0, {32, 96, 320}}, {GgmlType::kQ4_1, {32, 160}},     {GgmlType::kQ5_0, {32, 96, 320}},
        {GgmlType::kQ5_1, {32, 160}},     {GgmlType::kQ8_0, {32, 96, 320}}, {GgmlType::kQ2_K, {256}},
        {GgmlType::kQ3_K, {256, 512}},    {GgmlType::kQ4_K, {256, 768}},    {GgmlType::kQ5_K, {256, 768}},
        {GgmlType::kQ6_K, {256, 768}},
    };
}

TEST(Matmul, EveryIsaEveryTypeAgainstReference) {
    std::mt19937 rng(42);
    std::normal_distribution<float> g(0.0f, 1.0f);
    ThreadPool pool(2);
    const std::vector<Isa> isas = available_isas();
    for (const Case& cs : cases()) {
        for (int64_t k : cs.ks) {
            for (int64_t rows : {1, 3, 17, 33}) {
                const auto w = make_weights(cs.type, rows, k, rng);
                std::vector<float> wd(size_t(rows * k));
                for (int64_t r = 0; r < rows; ++r)
                    dequantize_row_ref(cs.type, w.data() + size_t(r) * row_size(cs.type, k), &wd[size_t(r * k)], k);
                for (int64_t nt : {1, 2, 7, 64}) {
                    std::vector<float> x(size_t(nt * k));
                    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 61 == 3) ? 8.0f * g(rng) : g(rng);
                    const int64_t ldy = rows + (nt % 2);  // odd token counts also get a padded y
                    std::vector<float> yref(size_t(nt * ldy), 0.0f);
                    cpu::matmul_ref(cs.type, w.data(), rows, k, x.data(), nt, yref.data(), ldy);
                    for (Isa isa : isas) {
                        cpu::force_isa(isa);
                        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
                            SCOPED_TRACE(testing::Message() << type_name(cs.type) << " k=" << k << " rows=" << rows
                                                            << " n_tokens=" << nt << " isa=" << cpu::isa_name(isa)
                                                            << " threads=" << (p ? 2 : 1));
                            std::vector<float> y(size_t(nt * ldy), -12345.0f);
                            cpu::matmul(cs.type, w.data(), rows, k, x.data(), nt, y.data(), ldy, p);
                            const int ab = act_block(isa, cs.type);
                            for (int64_t t = 0; t < nt; ++t) {
                                for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[size_t(t * ldy + r)], -12345.0f);
                                for (int64_t r = 0; r < rows; ++r) {
                                    const float* wr = &wd[size_t(r * k)];
                                    const float* xt = &x[size_t(t * k)];
                                    double exact = 0, s_abs = 0, q_bound = 0;
                                    for (int64_t i = 0; i < k; ++i) {
                                        exact += double(wr[i]) * xt[i];
                                        s_abs += std::fabs(double(wr[i]) * xt[i]);
                                    }
                                    if (ab > 0) {
                                        for (int64_t b0 = 0; b0 < k; b0 += ab) {
                                            double amax = 0, wsum = 0;
                                            for (int64_t i = b0; i < b0 + ab; ++i) {
                                                amax = std::max(amax, double(std::fabs(xt[i])));
                                                wsum += std::fabs(double(wr[i]));
                                            }
                                            q_bound += amax / 254.0 * wsum;
                                        }
                                    }
                                    const double tol = 2.0 * double(k) * std::ldexp(1.0, -24) * s_abs +
                                                       q_bound * 1.0001 + 1e-30;
                                    const float got = y[size_t(t * ldy + r)];
                                    ASSERT_LE(std::fabs(double(got) - exact), tol) << "row " << r << " token " << t;
                                    if (isa == Isa::kRef) {
                                        ASSERT_EQ(got, yref[size_t(t * ldy + r)]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    cpu::force_isa(isas.back());
}

// Registered weights go through the packed layouts (repack.h) where the ISA has kernels for them:
// the same bound against the float64 reference, over row counts around the 16-row groups, odd
// block counts, and token counts around the 8-token tiles.
TEST(Matmul, PackedWeightsAgainstReference) {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    ThreadPool pool(2);
    const std::vector<Isa> isas = available_isas();
    const std::vector<Case> packed_cases = {
        {GgmlType::kQ4_0, {32, 96, 320}},
        {GgmlType::kQ8_0, {32, 96, 320}},
        {GgmlType::kQ4_K, {256, 768}},
        {GgmlType::kQ6_K, {256, 768}},
    };
    int packed_seen = 0;
    for (const Case& cs : packed_cases) {
        for (int64_t k : cs.ks) {
            for (int64_t rows : {1, 16, 17, 33, 50}) {
                const auto w = make_weights(cs.type, rows, k, rng);
                std::vector<float> wd(size_t(rows * k));
                for (int64_t r = 0; r < rows; ++r)
                    dequantize_row_ref(cs.type, w.data() + size_t(r) * row_size(cs.type, k), &wd[size_t(r * k)], k);
                for (Isa isa : isas) {
                    cpu::force_isa(isa);
                    const bool packed = cpu::register_weight(cs.type, w.data(), rows, k);
                    packed_seen += packed;
                    for (int64_t nt : {1, 2, 7, 9, 19, 64}) {
                        std::vector<float> x(size_t(nt * k));
                        for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 61 == 3) ? 8.0f * g(rng) : g(rng);
                        const int64_t ldy = rows + (nt % 2);
                        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
                            SCOPED_TRACE(testing::Message() << type_name(cs.type) << " k=" << k << " rows=" << rows
                                                            << " n_tokens=" << nt << " isa=" << cpu::isa_name(isa)
                                                            << " packed=" << packed << " threads=" << (p ? 2 : 1));
                            std::vector<float> y(size_t(nt * ldy), -12345.0f);
                            cpu::matmul(cs.type, w.data(), rows, k, x.data(), nt, y.data(), ldy, p);
                            const int ab = act_block(isa, cs.type);
                            for (int64_t t = 0; t < nt; ++t) {
                                for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[size_t(t * ldy + r)], -12345.0f);
                                for (int64_t r = 0; r < rows; ++r) {
                                    const float* wr = &wd[size_t(r * k)];
                                    const float* xt = &x[size_t(t * k)];
                                    double exact = 0, s_abs = 0, q_bound = 0;
                                    for (int64_t i = 0; i < k; ++i) {
                                        exact += double(wr[i]) * xt[i];
                                        s_abs += std::fabs(double(wr[i]) * xt[i]);
                                    }
                                    for (int64_t b0 = 0; ab > 0 && b0 < k; b0 += ab) {
                                        double amax = 0, wsum = 0;
                                        for (int64_t i = b0; i < b0 + ab; ++i) {
                                            amax = std::max(amax, double(std::fabs(xt[i])));
                                            wsum += std::fabs(double(wr[i]));
                                        }
                                        q_bound += amax / 254.0 * wsum;
                                    }
                                    const double tol =
                                        2.0 * double(k) * std::ldexp(1.0, -24) * s_abs + q_bound * 1.0001 + 1e-30;
                                    ASSERT_LE(std::fabs(double(y[size_t(t * ldy + r)]) - exact), tol)
                                        << "row " << r << " token " << t;
                                }
                            }
                        }
                    }
                    if (packed) cpu::unregister_weight(w.data());
                }
            }
        }
    }
    if (available_isas().back() == Isa::kAvx512) {
        EXPECT_GT(packed_seen, 0);
    }
    cpu::force_isa(isas.back());
}

// Every table's activation quantizer writes the same bytes as the scalar quantize_act_row, on
// gaussian rows, rows with all-zero blocks, repeated largest magnitudes of both signs, and ties.
TEST(Matmul, ActivationQuantizersMatchTheScalarBytes) {
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const cpu::KernelTable* tables[] = {&cpu::kernel_table_ref(), &cpu::kernel_table_avx2(), &cpu::kernel_table_avx512()};
    const std::vector<Isa> isas = available_isas();
    for (int64_t k : {256, 512, 4608}) {
        for (int variant = 0; variant < 4; ++variant) {
            std::vector<float> x(static_cast<size_t>(k));
            for (auto& v : x) v = g(rng);
            if (variant == 1)
                for (int64_t i = 32; i < 64; ++i) x[size_t(i)] = 0.0f;  // a zero 32-block
            if (variant == 2) {
                for (int64_t i = 0; i < 256; ++i) x[size_t(i)] = 0.0f;  // a zero 256-block with
                x[300] = 5.0f, x[301] = -5.0f, x[302] = 5.0f;           // repeated largest magnitudes
            }
            if (variant == 3)
                for (auto& v : x) v = float(int(v * 4.0f)) * 0.5f + 0.25f;  // many exact .5 ties
            for (cpu::ActFormat f : {cpu::ActFormat::kAct32, cpu::ActFormat::kActQ8K}) {
                const size_t bytes = cpu::act_row_bytes(f, k);
                std::vector<uint8_t> want(bytes, 0xAB), got(bytes, 0xAB);
                cpu::quantize_act_row(f, x.data(), k, want.data());
                for (Isa isa : isas) {
                    std::fill(got.begin(), got.end(), uint8_t(0xAB));
                    tables[int(isa)]->quantize_act(f, x.data(), k, got.data());
                    EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0)
                        << "k=" << k << " variant=" << variant << " format=" << int(f) << " isa=" << cpu::isa_name(isa);
                }
            }
        }
    }
}

// The registry is keyed by address: new contents at a registered address (a freed and reused
// buffer) must not be computed with the old packed copy, and registering them again repacks.
TEST(Matmul, PackedCopyIsNotUsedForNewContentsAtTheSameAddress) {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t rows = 40, k = 256, nt = 3;
    std::vector<float> x(size_t(nt * k));
    for (auto& v : x) v = g(rng);
    for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
        cpu::force_isa(available_isas().back());
        auto w = make_weights(type, rows, k, rng);
        const bool packed = cpu::register_weight(type, w.data(), rows, k);
        for (int round = 0; round < 2; ++round) {
            const auto other = make_weights(type, rows, k, rng);
            std::memcpy(w.data(), other.data(), w.size());  // new contents, same address
            if (round == 1) EXPECT_EQ(cpu::register_weight(type, w.data(), rows, k), packed);
            // the same contents at an unregistered address: the same 8-bit activations, so only the
            // float summation order differs from the packed path
            const std::vector<uint8_t> copy(w);
            std::vector<float> y(size_t(nt * rows)), want(size_t(nt * rows));
            cpu::matmul(type, w.data(), rows, k, x.data(), nt, y.data(), rows, nullptr);
            cpu::matmul(type, copy.data(), rows, k, x.data(), nt, want.data(), rows, nullptr);
            for (size_t i = 0; i < y.size(); ++i)
                ASSERT_NEAR(y[i], want[i], 1e-3 * (1.0 + std::fabs(want[i])))
                    << type_name(type) << " round " << round << " at " << i;
        }
        if (packed) {
            cpu::unregister_weight(w.data());
            cpu::unregister_weight(w.data());
        }
    }
}

TEST(Matmul, IntegerPathsAreTighterThanTheirBound) {
    // The bound above must not be vacuous: on gaussian data the 8-bit activation error stays
    // well inside it, and a deliberately wrong result (one weight block dropped) falls outside.
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t k = 512, rows = 8;
    const auto w = make_weights(GgmlType::kQ4_0, rows, k, rng);
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = g(rng);
    std::vector<float> wd(size_t(rows * k));
    for (int64_t r = 0; r < rows; ++r)
        dequantize_row_ref(GgmlType::kQ4_0, w.data() + size_t(r) * row_size(GgmlType::kQ4_0, k), &wd[size_t(r * k)], k);
    for (Isa isa : available_isas()) {
        cpu::force_isa(isa);
        std::vector<float> y(static_cast<size_t>(rows));
        cpu::matmul(GgmlType::kQ4_0, w.data(), rows, k, x.data(), 1, y.data(), rows, nullptr);
        for (int64_t r = 0; r < rows; ++r) {
            double exact = 0, dropped = 0, q_bound = 0;
            for (int64_t i = 0; i < k; ++i) exact += double(wd[size_t(r * k + i)]) * x[size_t(i)];
            for (int64_t i = 0; i < 32; ++i) dropped += double(wd[size_t(r * k + i)]) * x[size_t(i)];
            for (int64_t b0 = 0; b0 < k; b0 += 32) {
                double amax = 0, wsum = 0;
                for (int64_t i = b0; i < b0 + 32; ++i) {
                    amax = std::max(amax, double(std::fabs(x[size_t(i)])));
                    wsum += std::fabs(double(wd[size_t(r * k + i)]));
                }
                q_bound += amax / 254.0 * wsum;
            }
            EXPECT_LE(std::fabs(y[size_t(r)] - exact), 0.5 * q_bound + 1e-4) << cpu::isa_name(isa);
            EXPECT_GT(std::fabs(dropped), 0.0);
        }
    }
    cpu::force_isa(available_isas().back());
}

TEST(Matmul, ActiveIsaIsTheBestUnlessForced) {
    // CERA_CPU_ISA is not set by ctest: the first choice is the best the CPU has.
    const auto isas = available_isas();
    cpu::force_isa(isas.back());
    EXPECT_EQ(cpu::active_isa(), isas.back());
    EXPECT_STREQ(cpu::isa_name(Isa::kAvx512), "avx512");
    EXPECT_STREQ(cpu::isa_name(Isa::kRef), "ref");
}

TEST(Matmul, UnsupportedTypeThrows) {
    float x[32] = {}, y[1];
    uint8_t w[64] = {};
    for (Isa isa : available_isas()) {
        cpu::force_isa(isa);
        EXPECT_THROW(cpu::matmul(GgmlType::kIQ4_NL, w, 1, 32, x, 1, y, 1, nullptr), Error);
    }
    cpu::force_isa(available_isas().back());
}

}  // namespace
