// The CPU matmul's kernel-level contracts that the op harness (op_harness_test.cpp, which checks
// every type, shape and kernel table through the backend against the reference) does not reach:
// activation quantizers that match the scalar bytes, output rows with a stride (ldy > rows) and no
// thread pool, the packed-weight registry keyed by address, the ISA choice, unsupported types.
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
    for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
        if (cera::cpu::isa_supported(isa)) out.push_back(isa);
    return out;
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

// ldy > rows leaves the padding alone and writes the same values as ldy = rows, with and without a
// thread pool, on every table and a float, a 32-block and a K-quant type.
TEST(Matmul, StridedOutputAndNoPool) {
    std::mt19937 rng(42);
    std::normal_distribution<float> g(0.0f, 1.0f);
    ThreadPool pool(2);
    for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_0, GgmlType::kQ4_K}) {
        const int64_t rows = 37, k = 512, nt = 7, ldy = rows + 3;
        const auto w = make_weights(type, rows, k, rng);
        std::vector<float> x(size_t(nt * k));
        for (auto& v : x) v = g(rng);
        for (Isa isa : available_isas()) {
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
                SCOPED_TRACE(testing::Message()
                             << type_name(type) << " isa=" << cpu::isa_name(isa) << " threads=" << (p ? 2 : 1));
                const cpu::KernelTable& tab = cpu::kernel_table(isa);
                std::vector<float> dense_y(size_t(nt * rows)), y(size_t(nt * ldy), -12345.0f);
                cpu::matmul(tab, type, w.data(), rows, k, x.data(), nt, dense_y.data(), rows, p);
                cpu::matmul(tab, type, w.data(), rows, k, x.data(), nt, y.data(), ldy, p);
                for (int64_t t = 0; t < nt; ++t) {
                    for (int64_t r = 0; r < rows; ++r)
                        ASSERT_EQ(y[size_t(t * ldy + r)], dense_y[size_t(t * rows + r)])
                            << "row " << r << " token " << t;
                    for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[size_t(t * ldy + r)], -12345.0f);
                }
            }
        }
    }
}

// Every table's activation quantizer writes the same bytes as the scalar quantize_act_row, on
// gaussian rows, rows with all-zero blocks, repeated largest magnitudes of both signs, and ties.
TEST(Matmul, ActivationQuantizersMatchTheScalarBytes) {
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    // Tables only for the ISAs this CPU runs: building the AVX-512 table executes AVX-512 code.
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
            if (variant == 3) {
                for (auto& v : x) v = float(int(v * 4.0f)) * 0.5f + 0.25f;  // many exact .5 ties
                x[5] = 1e-40f, x[6] = -3e-39f, x[7] = std::nanf(""),
                x[8] = 1.00390625f;  // bf16: subnormals, NaN, a tie
            }
            for (cpu::ActFormat f : {cpu::ActFormat::kBF16, cpu::ActFormat::kAct32, cpu::ActFormat::kActQ8K}) {
                if (f != cpu::ActFormat::kBF16 && variant == 3) {
                    x[5] = x[6] = x[8] = 0.25f, x[7] = 0.75f;  // the 8-bit formats take finite rows
                }
                const size_t bytes = cpu::act_row_bytes(f, k);
                std::vector<uint8_t> want(bytes, 0xAB), got(bytes, 0xAB);
                cpu::quantize_act_row(f, x.data(), k, want.data());
                for (Isa isa : isas) {
                    std::fill(got.begin(), got.end(), uint8_t(0xAB));
                    cpu::kernel_table(isa).quantize_act(f, x.data(), k, got.data());
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
    for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                          GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                          GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kQ2_K, GgmlType::kQ3_K}) {
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

// The packed drivers split a group into halves of 8 rows for several tokens and take it whole for
// one (AVX2), in tiles of up to 4 or 8 tokens: every count of real rows in the last group (below 8,
// 8, above 8) and every token count up to two tiles gives the unpacked kernel's values on the same
// activations.
TEST(Matmul, PackedTilesCoverPartialGroupsAndTokenTiles) {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t k = 512;
    for (Isa isa : available_isas()) {
        const cpu::KernelTable& tab = cpu::kernel_table(isa);
        for (int id = 0; id < cpu::kMaxTypeId; ++id) {
            if (tab.packed[id].fn == nullptr) continue;
            const auto type = GgmlType(id);
            for (int64_t rows : {5, 8, 13, 29}) {
                auto w = make_weights(type, rows, k, rng);
                const std::vector<uint8_t> copy(w);
                ASSERT_TRUE(cpu::register_weight(tab, type, w.data(), rows, k, false)) << type_name(type);
                for (int64_t nt : {1, 2, 3, 4, 5, 9}) {
                    std::vector<float> x(size_t(nt * k)), y(size_t(nt * rows)), want(size_t(nt * rows));
                    for (auto& v : x) v = g(rng);
                    cpu::matmul(tab, type, w.data(), rows, k, x.data(), nt, y.data(), rows, nullptr);
                    cpu::matmul(tab, type, copy.data(), rows, k, x.data(), nt, want.data(), rows, nullptr);
                    for (size_t i = 0; i < y.size(); ++i)
                        ASSERT_NEAR(y[i], want[i], 1e-3 * (1.0 + std::fabs(want[i])))
                            << cpu::isa_name(isa) << " " << type_name(type) << " rows " << rows << " tokens " << nt
                            << " at " << i;
                }
                cpu::unregister_weight(w.data());
            }
        }
    }
}

// The AVX-512 table's two BF16 paths (kernel_table_avx512(bf16_dot)): f32 FMAs on the f32 activations,
// or vdpbf16ps on them rounded to bfloat16 (where the CPU has AVX512_BF16); whichever the CPU's own
// table does not take is checked only here. Packed and plain kernels, odd and even k, one token and
// tiles of several, against a double-precision sum over the same operands.
TEST(Matmul, Avx512Bf16PathsMatchADoubleReference) {
    if (!cera::cpu::isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512";
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<bool> paths{false};
    if (cpu_features().avx512bf16) paths.push_back(true);
    for (bool dot : paths) {
        const cpu::KernelTable& tab = cpu::kernel_table_avx512(dot);
        EXPECT_EQ(tab.matmul[int(GgmlType::kBF16)].act, dot ? cpu::ActFormat::kBF16 : cpu::ActFormat::kF32);
        for (int64_t k : {255, 512}) {
            const int64_t rows = 29;
            auto w = make_weights(GgmlType::kBF16, rows, k, rng);
            const std::vector<uint8_t> plain(w);
            ASSERT_TRUE(cpu::register_weight(tab, GgmlType::kBF16, w.data(), rows, k, false));
            for (int64_t nt : {1, 3, 8, 9}) {
                std::vector<float> x(size_t(nt * k)), y(size_t(nt * rows)), y_plain(size_t(nt * rows));
                for (auto& v : x) v = g(rng);
                cpu::matmul(tab, GgmlType::kBF16, w.data(), rows, k, x.data(), nt, y.data(), rows, nullptr);
                cpu::matmul(tab, GgmlType::kBF16, plain.data(), rows, k, x.data(), nt, y_plain.data(), rows, nullptr);
                for (int64_t t = 0; t < nt; ++t)
                    for (int64_t r = 0; r < rows; ++r) {
                        double want = 0.0, mag = 0.0;
                        for (int64_t i = 0; i < k; ++i) {
                            uint16_t h;
                            std::memcpy(&h, plain.data() + size_t(r * k + i) * 2, 2);
                            const float xi = x[size_t(t * k + i)];
                            const double p =
                                double(bf16_to_fp32(h)) * double(dot ? bf16_to_fp32(fp32_to_bf16(xi)) : xi);
                            want += p, mag += std::fabs(p);
                        }
                        const size_t at = size_t(t * rows + r);
                        // f32 sums of k products: a few units of 2^-24 of the magnitude each
                        const double tol = 1e-5 * mag + 1e-30;
                        ASSERT_NEAR(y[at], want, tol)
                            << "dot " << dot << " k " << k << " tokens " << nt << " row " << r;
                        ASSERT_NEAR(y_plain[at], want, tol) << "plain, dot " << dot << " k " << k << " tokens " << nt;
                    }
            }
            cpu::unregister_weight(w.data());
        }
    }
}

// The AMX table's tile kernels (kernels_amx.cpp: packed F16 and BF16, plain F32) over what the op
// harness's small shapes do not reach: several token blocks and k chunks a call, partial blocks, k not
// a multiple of 32, strided output, two threads splitting the rows; against a double-precision sum of
// the same operands, within the split-operand bound (op_harness.h).
TEST(Matmul, AmxProductsMatchADoubleReference) {
    if (!cera::cpu::isa_supported(Isa::kAmx)) GTEST_SKIP() << "no AMX-BF16";
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    ThreadPool pool(2);
    const cpu::KernelTable& tab = cpu::kernel_table(Isa::kAmx);
    for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32}) {
        for (int64_t k : {1152, 1001}) {
            const int64_t rows = 100, ldy = rows + 5;
            auto w = make_weights(type, rows, k, rng);
            const std::vector<uint8_t> plain(w);
            if (type != GgmlType::kF32) ASSERT_TRUE(cpu::register_weight(tab, type, w.data(), rows, k, false));
            for (int64_t nt : {16, 45, 300}) {
                std::vector<float> x(size_t(nt * k)), y(size_t(nt * ldy), -7.0f);
                for (auto& v : x) v = g(rng);
                cpu::matmul(tab, type, w.data(), rows, k, x.data(), nt, y.data(), ldy, &pool, true);
                for (int64_t t = 0; t < nt; ++t) {
                    for (int64_t r = 0; r < rows; ++r) {
                        double want = 0.0, mag = 0.0;
                        for (int64_t i = 0; i < k; ++i) {
                            double wi;
                            if (type == GgmlType::kF32) {
                                float f;
                                std::memcpy(&f, plain.data() + size_t(r * k + i) * 4, 4);
                                wi = f;
                            } else {
                                uint16_t h;
                                std::memcpy(&h, plain.data() + size_t(r * k + i) * 2, 2);
                                wi = type == GgmlType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
                            }
                            const double p = wi * double(x[size_t(t * k + i)]);
                            want += p, mag += std::fabs(p);
                        }
                        const double tol = (0x1p-15 + 3.0 * double(k + 2) * 0x1p-24) * 1.01 * mag;
                        ASSERT_NEAR(y[size_t(t * ldy + r)], want, tol)
                            << type_name(type) << " k " << k << " tokens " << nt << " token " << t << " row " << r;
                    }
                    for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[size_t(t * ldy + r)], -7.0f);
                }
            }
            if (type != GgmlType::kF32) cpu::unregister_weight(w.data());
        }
    }
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
    float x[256] = {}, y[1];
    uint8_t w[66] = {};
    for (Isa isa : available_isas()) {
        cpu::force_isa(isa);
        EXPECT_THROW(cpu::matmul(GgmlType::kIQ2_XXS, w, 1, 256, x, 1, y, 1, nullptr), Error);
    }
    cpu::force_isa(available_isas().back());
}

}  // namespace
