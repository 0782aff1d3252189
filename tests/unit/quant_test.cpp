// Quant formats against independent references:
//  - hand-built blocks: each element's code is placed with an encoder written here from the format
//    description, and the dequantized value must equal the format's formula;
//  - quantize -> dequantize error bounds derived from each format's math, over several distributions;
//  - the fixtures' quantized GGUFs (written by llama-quantize from their F32 twins): dequantized
//    tensors stay within the format bound of the F32 weights, and quantizing the F32 weights here
//    reproduces llama-quantize's bytes exactly.
#include "core/quant/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cera/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "gguf/gguf.h"
#include "test_util.h"

using namespace cera;

namespace {

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
    std::vector<uint8_t> q(row_size(t, int64_t(x.size())));
    quantize_row_ref(t, x.data(), q.data(), int64_t(x.size()));
    return q;
}

std::vector<float> dequantize(GgmlType t, const void* q, int64_t n) {
    std::vector<float> y(size_t(n), std::nanf(""));
    dequantize_row_ref(t, q, y.data(), n);
    return y;
}

// ------------------------------------------------------------------ hand-built blocks

// Sets bits of a little-endian bit field: `nbits` bits at bit offset `bit` of `bytes`.
void put_bits(uint8_t* bytes, int bit, int nbits, int value) {
    for (int b = 0; b < nbits; ++b) {
        const int pos = bit + b;
        if ((value >> b) & 1) bytes[pos / 8] |= uint8_t(1u << (pos % 8));
        else bytes[pos / 8] &= uint8_t(~(1u << (pos % 8)));
    }
}

TEST(QuantHandBuilt, Q4_0AndQ4_1) {
    // element e < 16 lives in the low nibble of byte e, element e >= 16 in the high nibble of byte e - 16
    BlockQ4_0 b0{};
    BlockQ4_1 b1{};
    b0.d = fp32_to_fp16(0.25f);
    b1.d = fp32_to_fp16(0.5f);
    b1.m = fp32_to_fp16(-3.0f);
    int code[32];
    for (int e = 0; e < 32; ++e) {
        code[e] = (e * 7 + 3) % 16;
        put_bits(b0.qs, (e % 16) * 8 + (e / 16) * 4, 4, code[e]);
        put_bits(b1.qs, (e % 16) * 8 + (e / 16) * 4, 4, code[e]);
    }
    auto y0 = dequantize(GgmlType::kQ4_0, &b0, 32);
    auto y1 = dequantize(GgmlType::kQ4_1, &b1, 32);
    for (int e = 0; e < 32; ++e) {
        EXPECT_EQ(y0[e], 0.25f * float(code[e] - 8)) << e;
        EXPECT_EQ(y1[e], 0.5f * float(code[e]) - 3.0f) << e;
    }
}

TEST(QuantHandBuilt, Q5_0AndQ5_1) {
    // low 4 bits as Q4; bit 4 of element e is bit e of the 32-bit little-endian qh
    BlockQ5_0 b0{};
    BlockQ5_1 b1{};
    b0.d = fp32_to_fp16(0.125f);
    b1.d = fp32_to_fp16(2.0f);
    b1.m = fp32_to_fp16(1.5f);
    int code[32];
    for (int e = 0; e < 32; ++e) {
        code[e] = (e * 13 + 5) % 32;
        put_bits(b0.qs, (e % 16) * 8 + (e / 16) * 4, 4, code[e] & 15);
        put_bits(b1.qs, (e % 16) * 8 + (e / 16) * 4, 4, code[e] & 15);
        put_bits(b0.qh, e, 1, code[e] >> 4);
        put_bits(b1.qh, e, 1, code[e] >> 4);
    }
    auto y0 = dequantize(GgmlType::kQ5_0, &b0, 32);
    auto y1 = dequantize(GgmlType::kQ5_1, &b1, 32);
    for (int e = 0; e < 32; ++e) {
        EXPECT_EQ(y0[e], 0.125f * float(code[e] - 16)) << e;
        EXPECT_EQ(y1[e], 2.0f * float(code[e]) + 1.5f) << e;
    }
}

TEST(QuantHandBuilt, Q8_0) {
    BlockQ8_0 b[2]{};
    b[0].d = fp32_to_fp16(0.01f);
    b[1].d = fp32_to_fp16(-3.0f);
    for (int e = 0; e < 32; ++e) b[0].qs[e] = int8_t(e * 8 - 127), b[1].qs[e] = int8_t(31 - e);
    auto y = dequantize(GgmlType::kQ8_0, b, 64);
    for (int e = 0; e < 32; ++e) {
        EXPECT_EQ(y[e], fp16_to_fp32(b[0].d) * float(e * 8 - 127));
        EXPECT_EQ(y[32 + e], -3.0f * float(31 - e));
    }
}

// Q4_K / Q5_K: 8 sub-blocks of 32. Sub-block s has a 6-bit scale and min packed in 12 bytes:
// s < 4: scale = bits 0..5 of byte s, min = bits 0..5 of byte s + 4;
// s >= 4: scale = low nibble of byte s + 4 | (bits 6..7 of byte s - 4) << 4,
//         min = high nibble of byte s + 4 | (bits 6..7 of byte s) << 4.
// Element e = 64 g + 32 h + l (g: pair of sub-blocks, h: which half): the nibble h of qs[32 g + l];
// Q5_K's 5th bit is bit 2 g + h of qh[l].
void put_k4_scale(uint8_t* scales, int s, int sc, int m) {
    if (s < 4) {
        put_bits(scales, 8 * s, 6, sc);
        put_bits(scales, 8 * (s + 4), 6, m);
    } else {
        put_bits(scales, 8 * (s + 4), 4, sc & 15);
        put_bits(scales, 8 * (s - 4) + 6, 2, sc >> 4);
        put_bits(scales, 8 * (s + 4) + 4, 4, m & 15);
        put_bits(scales, 8 * s + 6, 2, m >> 4);
    }
}

TEST(QuantHandBuilt, Q4_KAndQ5_K) {
    BlockQ4_K b4{};
    BlockQ5_K b5{};
    b4.d = b5.d = fp32_to_fp16(0.0625f);
    b4.dmin = b5.dmin = fp32_to_fp16(0.03125f);
    int sc[8], mn[8], code4[256], code5[256];
    for (int s = 0; s < 8; ++s) {
        sc[s] = (s * 23 + 17) % 64;
        mn[s] = (s * 41 + 60) % 64;
        put_k4_scale(b4.scales, s, sc[s], mn[s]);
        put_k4_scale(b5.scales, s, sc[s], mn[s]);
    }
    for (int e = 0; e < 256; ++e) {
        const int g = e / 64, h = (e / 32) % 2, l = e % 32;
        code4[e] = (e * 5 + 1) % 16;
        code5[e] = (e * 11 + 7) % 32;
        put_bits(b4.qs, 8 * (32 * g + l) + 4 * h, 4, code4[e]);
        put_bits(b5.qs, 8 * (32 * g + l) + 4 * h, 4, code5[e] & 15);
        put_bits(b5.qh, 8 * l + 2 * g + h, 1, code5[e] >> 4);
    }
    auto y4 = dequantize(GgmlType::kQ4_K, &b4, 256);
    auto y5 = dequantize(GgmlType::kQ5_K, &b5, 256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32;
        EXPECT_FLOAT_EQ(y4[e], 0.0625f * sc[s] * code4[e] - 0.03125f * mn[s]) << e;
        EXPECT_FLOAT_EQ(y5[e], 0.0625f * sc[s] * code5[e] - 0.03125f * mn[s]) << e;
    }
}

TEST(QuantHandBuilt, Q6_K) {
    // 16 sub-blocks of 16 with int8 scales. Element e = 128 n + 32 r + l (n half, r quarter, l < 32):
    // low 4 bits = nibble (r / 2) of ql[64 n + 32 (r % 2) + l]; high 2 bits = bits 2 r.. of qh[32 n + l].
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    int code[256];
    for (int s = 0; s < 16; ++s) b.scales[s] = int8_t(s * 17 - 120);
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, r = (e / 32) % 4, l = e % 32;
        code[e] = (e * 29 + 3) % 64;
        put_bits(b.ql, 8 * (64 * n + 32 * (r % 2) + l) + 4 * (r / 2), 4, code[e] & 15);
        put_bits(b.qh, 8 * (32 * n + l) + 2 * r, 2, code[e] >> 4);
    }
    auto y = dequantize(GgmlType::kQ6_K, &b, 256);
    for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(y[e], 0.5f * b.scales[e / 16] * (code[e] - 32)) << e;
}

TEST(QuantHandBuilt, IQ4_NLAndIQ4_XS) {
    // The grid of 16 levels (ggml-common.h kvalues_iq4nl), written out here from the format.
    const int grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    // IQ4_NL: fp16 d, then 16 bytes: low nibble of byte l = element l, high nibble = element l + 16.
    BlockIQ4_NL nl{};
    nl.d = fp32_to_fp16(0.25f);
    int cn[32];
    for (int e = 0; e < 32; ++e) {
        cn[e] = (e * 7 + 5) % 16;
        put_bits(nl.qs, 8 * (e % 16) + 4 * (e / 16), 4, cn[e]);
    }
    auto yn = dequantize(GgmlType::kIQ4_NL, &nl, 32);
    for (int e = 0; e < 32; ++e) EXPECT_FLOAT_EQ(yn[e], 0.25f * grid[cn[e]]) << e;
    // IQ4_XS: fp16 d, 16-bit scales_h (2 high bits of sub-block s's 6-bit scale at bit 2 s), 4 bytes
    // scales_l (low 4 bits in nibble s % 2 of byte s / 2), then sub-block s's 16 bytes as IQ4_NL's;
    // the value is d * (scale - 32) * grid[code].
    BlockIQ4_XS xs{};
    xs.d = fp32_to_fp16(0.5f);
    int sc[8], cx[256];
    for (int s = 0; s < 8; ++s) {
        sc[s] = (s * 23 + 9) % 64;
        put_bits(xs.scales_l, 4 * s, 4, sc[s] & 15);
        put_bits(reinterpret_cast<uint8_t*>(&xs.scales_h), 2 * s, 2, sc[s] >> 4);
    }
    for (int e = 0; e < 256; ++e) {
        cx[e] = (e * 11 + 3) % 16;
        put_bits(xs.qs, 8 * (16 * (e / 32) + e % 16) + 4 * ((e % 32) / 16), 4, cx[e]);
    }
    auto yx = dequantize(GgmlType::kIQ4_XS, &xs, 256);
    for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(yx[e], 0.5f * (sc[e / 32] - 32) * grid[cx[e]]) << e;
}

TEST(QuantHandBuilt, Q2_KAndQ3_K) {
    // Q2_K: 16 sub-blocks of 16; scales[s] low nibble = scale, high nibble = min.
    // Element e = 128 n + 32 j + 16 p + l: 2 bits at shift 2 j of qs[32 n + 16 p + l].
    BlockQ2_K b2{};
    b2.d = fp32_to_fp16(0.25f);
    b2.dmin = fp32_to_fp16(0.125f);
    // Q3_K: 16 6-bit scales (offset 32): low 4 bits in nibble (s / 8) of scales[s % 8], high 2 bits at
    // bit 2 (s / 4) of scales[8 + s % 4]; 2 low bits of a code as Q2_K, bit 2 = bit (e / 32) of hmask[e % 32],
    // and the value is (code - 4) with the high bit inverted: stored bit 1 means "no -4".
    BlockQ3_K b3{};
    b3.d = fp32_to_fp16(0.5f);
    int c2[256], c3[256], s3[16];
    for (int s = 0; s < 16; ++s) {
        b2.scales[s] = uint8_t(((s * 7) % 16) | (((s * 3 + 1) % 16) << 4));
        s3[s] = (s * 37 + 11) % 64;
        put_bits(b3.scales, 8 * (s % 8) + 4 * (s / 8), 4, s3[s] & 15);
        put_bits(b3.scales, 8 * (8 + s % 4) + 2 * (s / 4), 2, s3[s] >> 4);
    }
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, j = (e / 32) % 4, p = (e / 16) % 2, l = e % 16;
        c2[e] = (e * 3 + 1) % 4;
        c3[e] = (e * 5 + 2) % 8;  // value c3 - 4 in [-4, 3]
        put_bits(b2.qs, 8 * (32 * n + 16 * p + l) + 2 * j, 2, c2[e]);
        put_bits(b3.qs, 8 * (32 * n + 16 * p + l) + 2 * j, 2, c3[e] & 3);
        put_bits(b3.hmask, 8 * (e % 32) + e / 32, 1, c3[e] >> 2);
    }
    auto y2 = dequantize(GgmlType::kQ2_K, &b2, 256);
    auto y3 = dequantize(GgmlType::kQ3_K, &b3, 256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 16;
        EXPECT_FLOAT_EQ(y2[e], 0.25f * (b2.scales[s] & 15) * c2[e] - 0.125f * (b2.scales[s] >> 4)) << e;
        EXPECT_FLOAT_EQ(y3[e], 0.5f * (s3[s] - 32) * (c3[e] - 4)) << e;
    }
}

TEST(QuantTable, SupportAndErrors) {
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                       GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                       GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS}) {
        EXPECT_TRUE(can_dequantize(t)) << type_name(t);
        const QuantTraits* qt = quant_traits(t);
        ASSERT_NE(qt, nullptr);
        EXPECT_EQ(qt->block_size, type_info(t).block_size);
        EXPECT_EQ(qt->type_size, type_info(t).type_size);
    }
    for (GgmlType t :
         {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
          GgmlType::kQ5_1, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
          GgmlType::kQ8_K, GgmlType::kQ8_1, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS})
        EXPECT_TRUE(can_quantize(t)) << type_name(t);
    EXPECT_FALSE(can_dequantize(GgmlType::kIQ2_XXS));
    EXPECT_FALSE(can_quantize(GgmlType::kIQ3_S));
    float x[256] = {};
    uint8_t buf[1024] = {};
    try {
        dequantize_row_ref(GgmlType::kIQ2_XXS, buf, x, 256);
        FAIL() << "no throw";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
        EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos);
    }
    EXPECT_THROW(quantize_row_ref(GgmlType::kIQ2_XXS, x, buf, 256), Error);
}

// ------------------------------------------------------------------ error bounds

// Largest error the format allows for one block of 32 (x: its values), from its construction:
//   Q8_0: x/d rounded, d = amax/127: 0.5 d. Q4_0 / Q5_0: d = max/-8 (/-16) puts the largest
//   magnitude at code 0, the opposite extreme may clip by one step: 1 d. Q4_1 / Q5_1: d = range/15
//   (/31) from the min: 0.5 d. Each plus the fp16 rounding of d (and m): 2^-11 relative on
//   nmax * d and on |m|, and 2^-24 absolute for fp16 subnormals.
double block32_bound(GgmlType t, const float* x) {
    double amax = 0, mn = x[0], mx = x[0];
    for (int i = 0; i < 32; ++i) amax = std::max(amax, double(std::fabs(x[i]))), mn = std::min(mn, double(x[i])),
                                 mx = std::max(mx, double(x[i]));
    const double fp16_rel = std::ldexp(1.0, -11), abs_slack = 64 * std::ldexp(1.0, -24);
    switch (t) {
        case GgmlType::kQ8_0: return 0.5 * amax / 127 + amax * fp16_rel + abs_slack;
        case GgmlType::kQ4_0: return 1.0 * amax / 8 + amax * fp16_rel + abs_slack;
        case GgmlType::kQ5_0: return 1.0 * amax / 16 + amax * fp16_rel + abs_slack;
        case GgmlType::kQ4_1: return 0.5 * (mx - mn) / 15 + (mx - mn + std::fabs(mn)) * fp16_rel * 1.01 + abs_slack;
        case GgmlType::kQ5_1: return 0.5 * (mx - mn) / 31 + (mx - mn + std::fabs(mn)) * fp16_rel * 1.01 + abs_slack;
        default: return -1;
    }
}

// K-quants: per sub-block, an element whose value lies inside the range the (dequantized)
// sub-block scale and min can represent is rounded to the nearest code: error <= step / 2.
// Elements outside it are clipped to the nearest end. Returns the number of violations.
struct KCheck {
    int64_t violations = 0, clipped = 0, n = 0;
};

void check_k_block(GgmlType t, const uint8_t* blk, const float* x, const float* y, KCheck& kc) {
    const double eps_rel = 1e-5;
    auto check = [&](int e, double step, double lo, double hi) {
        const double v = x[e], err = std::fabs(double(y[e]) - v);
        ++kc.n;
        const double slack = eps_rel * (std::fabs(v) + std::fabs(lo) + std::fabs(hi)) + 1e-30;
        if (v >= lo - 0.5 * step && v <= hi + 0.5 * step) {
            if (err > 0.5 * step + slack) ++kc.violations;
        } else {
            ++kc.clipped;
            const double edge = v < lo ? lo : hi;
            if (std::fabs(double(y[e]) - edge) > slack + 1e-7 * std::fabs(edge)) ++kc.violations;
        }
    };
    if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) {
        const uint16_t* dd = reinterpret_cast<const uint16_t*>(blk);
        const uint8_t* scales = blk + 4;
        const int nmax = t == GgmlType::kQ4_K ? 15 : 31;
        for (int s = 0; s < 8; ++s) {
            uint8_t sc, m;
            get_scale_min_k4(s, scales, &sc, &m);
            const double step = double(fp16_to_fp32(dd[0])) * sc, mn = double(fp16_to_fp32(dd[1])) * m;
            for (int e = 32 * s; e < 32 * s + 32; ++e) {
                if (step == 0) {  // every code gives -mn: only the min is stored
                    ++kc.n;
                    if (std::fabs(double(y[e]) + mn) > 1e-6 * std::fabs(mn) + 1e-30) ++kc.violations;
                    continue;
                }
                check(e, step, -mn, step * nmax - mn);
            }
        }
    } else if (t == GgmlType::kQ6_K) {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
        for (int s = 0; s < 16; ++s) {
            const double step = double(fp16_to_fp32(b->d)) * b->scales[s];
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                if (step == 0) {
                    ++kc.n;
                    if (y[e] != 0.0f) ++kc.violations;
                    continue;
                }
                const double a = -32 * step, c = 31 * step;
                check(e, std::fabs(step), std::min(a, c), std::max(a, c));
            }
        }
    }
}

// Distributions of test rows: each a mix of blocks that exercise the edge cases.
std::vector<float> make_row(int kind, int64_t n, std::mt19937& rng) {
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
        switch (kind) {
            case 0: x[i] = g(rng); break;                              // gaussian
            case 1: x[i] = 0.5f + 0.25f * u(rng); break;               // positive, offset (asymmetric)
            case 2: x[i] = 0.0f; break;                                // all zero
            case 3: x[i] = -0.75f; break;                              // constant
            case 4: x[i] = (i % 97 == 5) ? 40.0f * g(rng) : 0.1f * g(rng); break;  // outliers
            case 5: x[i] = 1e-6f * g(rng); break;                      // tiny (fp16 subnormal scales)
            case 6: x[i] = 1e3f * u(rng); break;                       // large
            default: x[i] = (i / 32) % 2 ? g(rng) : 0.0f; break;       // alternating zero / non-zero blocks
        }
    }
    return x;
}

const char* kKindNames[] = {"gaussian", "offset", "zero", "constant", "outliers", "tiny", "large", "mixed"};

TEST(QuantRoundTrip, Block32TypesWithinFormatBound) {
    std::mt19937 rng(1234);
    const int64_t n = 32 * 64;
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1}) {
        for (int kind = 0; kind < 8; ++kind) {
            SCOPED_TRACE(std::string(type_name(t)) + " " + kKindNames[kind]);
            auto x = make_row(kind, n, rng);
            auto q = quantize(t, x);
            auto y = dequantize(t, q.data(), n);
            for (int64_t b = 0; b < n / 32; ++b) {
                const double bound = block32_bound(t, &x[size_t(32 * b)]);
                for (int64_t i = 32 * b; i < 32 * b + 32; ++i)
                    ASSERT_LE(std::fabs(double(y[size_t(i)]) - x[size_t(i)]), bound) << "element " << i;
            }
            if (kind == 2) {
                for (float v : y) ASSERT_EQ(v, 0.0f);
            }
        }
    }
}

TEST(QuantRoundTrip, KQuantsWithinFormatBound) {
    std::mt19937 rng(99);
    const int64_t n = 256 * 16;
    // RMS error relative to RMS value on gaussian rows: roughly step / sqrt(12) with the step
    // spread over the sub-block range (about 4.5 sigma for 32 gaussian values): 4.5 / 15 / 3.46 = 0.087
    // for Q4_K, half that for Q5_K, and for Q6_K 4.5 / 63 / 3.46 = 0.021; the bound allows 1.3x.
    const std::map<GgmlType, double> rms_bound = {
        {GgmlType::kQ4_K, 0.087 * 1.3}, {GgmlType::kQ5_K, 0.043 * 1.3}, {GgmlType::kQ6_K, 0.021 * 1.3}};
    for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
        for (int kind = 0; kind < 8; ++kind) {
            SCOPED_TRACE(std::string(type_name(t)) + " " + kKindNames[kind]);
            auto x = make_row(kind, n, rng);
            auto q = quantize(t, x);
            auto y = dequantize(t, q.data(), n);
            KCheck kc;
            const size_t bs = type_info(t).type_size;
            for (int64_t b = 0; b < n / 256; ++b) check_k_block(t, q.data() + b * bs, &x[256 * b], &y[256 * b], kc);
            EXPECT_EQ(kc.violations, 0) << kc.clipped << " clipped of " << kc.n;
            double se = 0, sx = 0;
            for (int64_t i = 0; i < n; ++i) se += std::pow(double(y[i]) - x[i], 2), sx += double(x[i]) * x[i];
            if (kind == 0) {
                EXPECT_LE(std::sqrt(se / sx), rms_bound.at(t));
            }
            if (kind == 2 || kind == 3) {
                // zero and constant rows are represented exactly (constant: by the min for Q4_K/Q5_K,
                // by the symmetric scale for Q6_K up to the scale's own rounding)
                for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i], 1e-3 * std::fabs(x[i])) << i;
            }
        }
    }
}

TEST(QuantRoundTrip, ActivationFormats) {
    std::mt19937 rng(7);
    for (int kind = 0; kind < 8; ++kind) {
        SCOPED_TRACE(kKindNames[kind]);
        auto x = make_row(kind, 512, rng);
        // Q8_K: float scale, codes in [-127, 127], bsums = sums of 16 codes.
        auto q = quantize(GgmlType::kQ8_K, x);
        auto y = dequantize(GgmlType::kQ8_K, q.data(), 512);
        for (int b = 0; b < 2; ++b) {
            const auto* blk = reinterpret_cast<const BlockQ8_K*>(q.data()) + b;
            double amax = 0;
            for (int i = 0; i < 256; ++i) amax = std::max(amax, double(std::fabs(x[256 * b + i])));
            for (int i = 0; i < 256; ++i)
                ASSERT_LE(std::fabs(double(y[256 * b + i]) - x[256 * b + i]), 0.5 * amax / 127 * (1 + 1e-5));
            for (int s = 0; s < 16; ++s) {
                int sum = 0;
                for (int i = 0; i < 16; ++i) sum += blk->qs[16 * s + i];
                ASSERT_EQ(blk->bsums[s], sum);
            }
        }
        // Q8_1: as Q8_0 plus s = d * sum(codes)
        auto q1 = quantize(GgmlType::kQ8_1, x);
        auto q0 = quantize(GgmlType::kQ8_0, x);
        for (int b = 0; b < 16; ++b) {
            const auto* b1 = reinterpret_cast<const BlockQ8_1*>(q1.data()) + b;
            const auto* b0 = reinterpret_cast<const BlockQ8_0*>(q0.data()) + b;
            ASSERT_EQ(b1->d, b0->d);
            ASSERT_EQ(0, std::memcmp(b1->qs, b0->qs, 32));
            int sum = 0;
            for (int i = 0; i < 32; ++i) sum += b1->qs[i];
            // s is rounded from sum * (unrounded d): fp16 rounding of both, plus fp16's subnormal spacing
            ASSERT_NEAR(fp16_to_fp32(b1->s), double(sum) * fp16_to_fp32(b1->d),
                        std::fabs(double(sum) * fp16_to_fp32(b1->d)) * 2e-3 + std::abs(sum) * std::ldexp(1.0, -25) +
                            std::ldexp(1.0, -24));
        }
    }
}

TEST(QuantRoundTrip, HalfTypes) {
    std::mt19937 rng(3);
    auto x = make_row(0, 1000, rng);
    x[0] = 65504.0f, x[1] = -1e-7f, x[2] = 0.0f, x[3] = 1.0f / 3;
    auto yh = dequantize(GgmlType::kF16, quantize(GgmlType::kF16, x).data(), 1000);
    auto yb = dequantize(GgmlType::kBF16, quantize(GgmlType::kBF16, x).data(), 1000);
    auto yf = dequantize(GgmlType::kF32, quantize(GgmlType::kF32, x).data(), 1000);
    for (int i = 0; i < 1000; ++i) {
        EXPECT_LE(std::fabs(yh[i] - x[i]), std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.0, -25)) << i;
        EXPECT_LE(std::fabs(yb[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << i;
        EXPECT_EQ(yf[i], x[i]);
    }
}

// ------------------------------------------------------------------ fixture files

struct FilePair {
    std::string quant, f32;
};

std::vector<FilePair> fixture_pairs() {
    using test::data_path;
    return {
        {test::source_path("models/tiny-lfm2-Q8_0.gguf"), data_path("fixtures/tiny-lfm2/model.gguf")},
        {data_path("fixtures/tiny-lfm2/model-Q4_0.gguf"), data_path("fixtures/tiny-lfm2/model.gguf")},
        {data_path("fixtures/tiny-lfm2/model-Q4_K_M.gguf"), data_path("fixtures/tiny-lfm2/model.gguf")},
        {data_path("fixtures/tiny-lfm2moe/model-Q4_K_M.gguf"), data_path("fixtures/tiny-lfm2moe/model.gguf")},
        {data_path("fixtures/tiny-qwen3/model-Q4_0.gguf"), data_path("fixtures/tiny-qwen3/model.gguf")},
    };
}

struct TypeStats {
    int tensors = 0, exact = 0;
    int64_t elements = 0;
    double se = 0, sx = 0;
};

// For every quantized tensor of every fixture: dequantization within the format bound of the F32
// weights, and our quantizer reproduces the file's bytes.
TEST(QuantFixtures, MatchLlamaQuantize) {
    std::map<GgmlType, TypeStats> stats;
    for (const FilePair& fp : fixture_pairs()) {
        SCOPED_TRACE(fp.quant);
        auto qf = gguf::File::open(fp.quant);
        auto ff = gguf::File::open(fp.f32);
        int n_quant = 0;
        for (const gguf::TensorInfo& ti : qf->tensors()) {
            SCOPED_TRACE(ti.name + " " + type_name(ti.type));
            const gguf::TensorInfo* ref = ff->find_tensor(ti.name);
            ASSERT_NE(ref, nullptr);
            ASSERT_EQ(ref->type, GgmlType::kF32);
            ASSERT_EQ(ref->ne, ti.ne);
            const int64_t k = ti.ne[0], rows = ti.rows();
            const float* x = reinterpret_cast<const float*>(ref->data);
            if (ti.type == GgmlType::kF32) {
                EXPECT_EQ(0, std::memcmp(ti.data, ref->data, ti.n_bytes));
                continue;
            }
            ++n_quant;
            ASSERT_TRUE(can_dequantize(ti.type));
            const size_t rs = row_size(ti.type, k);
            ASSERT_EQ(rs * size_t(rows), ti.n_bytes);
            std::vector<float> y(static_cast<size_t>(k));
            std::vector<uint8_t> q(rs);
            TypeStats& st = stats[ti.type];
            bool exact = true;
            KCheck kc;
            for (int64_t r = 0; r < rows; ++r) {
                const uint8_t* qrow = ti.data + size_t(r) * rs;
                const float* xr = x + r * k;
                dequantize_row_ref(ti.type, qrow, y.data(), k);
                const int64_t bsz = type_info(ti.type).block_size;
                for (int64_t b = 0; b < k / bsz; ++b) {
                    if (bsz == 32) {
                        const double bound = block32_bound(ti.type, xr + 32 * b);
                        for (int64_t i = 32 * b; i < 32 * b + 32; ++i)
                            ASSERT_LE(std::fabs(double(y[i]) - xr[i]), bound) << "row " << r << " element " << i;
                    } else {
                        check_k_block(ti.type, qrow + b * type_info(ti.type).type_size, xr + 256 * b, &y[256 * b], kc);
                    }
                }
                for (int64_t i = 0; i < k; ++i) st.se += std::pow(double(y[i]) - xr[i], 2), st.sx += double(xr[i]) * xr[i];
                quantize_row_ref(ti.type, xr, q.data(), k);
                if (std::memcmp(q.data(), qrow, rs) != 0) exact = false;
            }
            EXPECT_EQ(kc.violations, 0) << kc.clipped << " clipped of " << kc.n;
            EXPECT_TRUE(exact) << "our quantizer differs from llama-quantize's bytes";
            st.tensors++;
            st.exact += exact;
            st.elements += k * rows;
        }
        EXPECT_GT(n_quant, 0);
    }
    // RMS error relative to the weights' RMS, per type (trained weights, heavier tails than gaussian):
    // about step / sqrt(12) / rms with the step from the format (see the round-trip test), 1.5x margin.
    const std::map<GgmlType, double> rms_bound = {
        {GgmlType::kQ8_0, 0.006}, {GgmlType::kQ4_0, 0.15}, {GgmlType::kQ5_0, 0.075}, {GgmlType::kQ5_1, 0.06},
        {GgmlType::kQ4_K, 0.13},  {GgmlType::kQ6_K, 0.035}};
    for (const auto& [t, st] : stats) {
        const double rel = std::sqrt(st.se / st.sx);
        std::printf("  %-5s %3d tensors, %9lld elements, %3d bit-exact, rms rel error %.4f\n", type_name(t),
                    st.tensors, (long long)st.elements, st.exact, rel);
        ASSERT_TRUE(rms_bound.count(t)) << type_name(t);
        EXPECT_LE(rel, rms_bound.at(t)) << type_name(t);
    }
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0,
                       GgmlType::kQ5_1})
        EXPECT_GT(stats[t].tensors, 0) << type_name(t) << " not covered by the fixtures";
}

// Q3_KV (the tq3 cache rows) against its definition: the sign and the nearest of the four Gaussian
// magnitudes of x / rms, rms the block's root mean square; the scale the least-squares one of those codes
// (to its fp16 rounding); element j's bits where blocks.h puts them. A cache-only type: no GGUF id.
TEST(QuantQ3Kv, BlocksFollowTheDefinition) {
    EXPECT_EQ(type_info(uint32_t(GgmlType::kQ3_KV)), nullptr);
    EXPECT_FALSE(type_from_name("Q3_KV").has_value());
    EXPECT_EQ(type_info(GgmlType::kQ3_KV).type_size, 14u);
    std::mt19937 rng(77);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-3.0f, 3.0f);
    const int n_blocks = 2000;
    std::vector<float> x(32 * size_t(n_blocks));
    for (int b = 0; b < n_blocks; ++b) {
        const float scale = std::ldexp(1.0f, int(b % 13) - 6);
        for (int j = 0; j < 32; ++j) x[32 * size_t(b) + j] = scale * (b % 3 == 2 ? ud(rng) : nd(rng));
        if (b % 7 == 3) x[32 * size_t(b) + size_t(b % 32)] *= 20.0f;  // an outlier
    }
    for (int j = 0; j < 32; ++j) x[j] = j == 0 ? -0.0f : 0.0f;  // a block of zeros, -0 first
    std::vector<BlockQ3_KV> q(static_cast<size_t>(n_blocks));
    quantize_row_ref(GgmlType::kQ3_KV, x.data(), q.data(), int64_t(x.size()));
    const std::vector<float> y = dequantize(GgmlType::kQ3_KV, q.data(), int64_t(x.size()));
    const double levels[4] = {0.2450942, 0.7560053, 1.3439093, 2.1519457};
    double err2 = 0, sum2 = 0;
    int checked = 0;
    for (int b = 0; b < n_blocks; ++b) {
        const float* xb = x.data() + 32 * size_t(b);
        const BlockQ3_KV& blk = q[size_t(b)];
        double ss = 0;
        for (int j = 0; j < 32; ++j) ss += double(xb[j]) * xb[j];
        const double rms = std::sqrt(ss / 32);
        double sxv = 0, svv = 0;
        for (int j = 0; j < 32; ++j) {
            const int m = blk.qs[j / 4] >> (2 * (j % 4)) & 3, sg = blk.qh[j / 8] >> (j % 8) & 1;
            const double v = (sg ? -1 : 1) * levels[m];
            EXPECT_FLOAT_EQ(y[32 * size_t(b) + j], fp16_to_fp32(blk.d) * float(v)) << b << " " << j;
            sxv += xb[j] * v, svv += v * v;
            if (rms == 0) continue;
            const double t = std::fabs(xb[j]) / rms;
            int want = 0;
            for (int l = 1; l < 4; ++l)
                if (std::fabs(t - levels[l]) < std::fabs(t - levels[want])) want = l;
            const bool near_bound = std::fabs(std::fabs(t - levels[want]) - std::fabs(t - levels[m])) < 1e-5;
            if (!near_bound) {
                EXPECT_EQ(m, want) << "block " << b << " element " << j;
            }
            if (xb[j] != 0) {
                EXPECT_EQ(sg, xb[j] < 0 ? 1 : 0) << "block " << b << " element " << j;
            }
            ++checked;
        }
        if (rms == 0) {
            EXPECT_EQ(blk.d, 0) << "a block of zeros";
            continue;
        }
        EXPECT_NEAR(fp16_to_fp32(blk.d), sxv / svv, std::ldexp(sxv / svv, -11) * 1.01) << "block " << b;
        if (b % 3 == 0 && b % 7 != 3)
            for (int j = 0; j < 32; ++j) err2 += std::pow(double(y[32 * size_t(b) + j]) - xb[j], 2) / (rms * rms);
        if (b % 3 == 0 && b % 7 != 3) sum2 += 32;
    }
    EXPECT_EQ(checked, 32 * (n_blocks - 1));
    // Gaussian blocks: the Lloyd-Max quantizer of 8 levels has a relative mean square error of 0.0345 at
    // the true deviation; the block's own estimate of it (32 values) and the fitted scale keep close to it.
    const double rel = err2 / sum2;
    std::printf("  Q3_KV relative mean square error on Gaussian blocks: %.4f\n", rel);
    EXPECT_LT(rel, 0.04);
    EXPECT_GT(rel, 0.025);
}

// Q4_KV (the kivi4 cache's value rows) against its definition: scale byte e is sign (bit 7) and k (bits 0-6),
// the scale 2^((k - 88) / 4); a block takes k0, the largest k whose scale is at most max|x| / 8, or k0 + 1,
// whichever codes q = clamp(floor(x / d + 8.5), 0, 15) leave the smaller squared error, with d's sign
// opposite to the block's extreme (which so gets code 0, as Q4_0's does). A cache-only type: no GGUF id.
TEST(QuantQ4Kv, BlocksFollowTheDefinition) {
    EXPECT_EQ(type_info(uint32_t(GgmlType::kQ4_KV)), nullptr);
    EXPECT_FALSE(type_from_name("Q4_KV").has_value());
    EXPECT_EQ(type_info(GgmlType::kQ4_KV).type_size, 17u);
    EXPECT_EQ(kQ4KVScales.v[0], 0.0f);
    EXPECT_EQ(kQ4KVScales.v[128], 0.0f);
    for (int e = 1; e < 256; ++e) {
        if (e == 128) continue;
        const double want = (e & 128 ? -1 : 1) * std::exp2(((e & 127) - 88) / 4.0);
        EXPECT_NEAR(kQ4KVScales.v[e], want, std::fabs(want) * 1e-7) << e;
    }
    std::mt19937 rng(78);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int n_blocks = 3000;
    std::vector<float> x(32 * size_t(n_blocks));
    for (int b = 0; b < n_blocks; ++b) {
        const float scale = std::ldexp(1.0f, int(b % 21) - 12) * (1.0f + float(b % 11) / 11.0f);
        for (int j = 0; j < 32; ++j) x[32 * size_t(b) + j] = scale * nd(rng);
        if (b % 7 == 3) x[32 * size_t(b) + size_t(b % 32)] *= 8.0f;  // an outlier
    }
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;  // a block of zeros
    std::vector<BlockQ4_KV> q(static_cast<size_t>(n_blocks));
    quantize_row_ref(GgmlType::kQ4_KV, x.data(), q.data(), int64_t(x.size()));
    const std::vector<float> y = dequantize(GgmlType::kQ4_KV, q.data(), int64_t(x.size()));
    std::vector<uint8_t> q40(row_size(GgmlType::kQ4_0, int64_t(x.size())));
    quantize_row_ref(GgmlType::kQ4_0, x.data(), q40.data(), int64_t(x.size()));
    const std::vector<float> y40 = dequantize(GgmlType::kQ4_0, q40.data(), int64_t(x.size()));
    auto codes_err = [](const float* xb, float d, int* codes) {
        double err = 0;
        for (int j = 0; j < 32; ++j) {
            codes[j] = std::clamp(int(std::floor(xb[j] * (1.0f / d) + 8.5f)), 0, 15);
            err += std::pow(double(xb[j]) - double(float(codes[j] - 8) * d), 2);
        }
        return err;
    };
    double err_kv = 0, err_40 = 0;
    for (int b = 0; b < n_blocks; ++b) {
        const float* xb = x.data() + 32 * size_t(b);
        const BlockQ4_KV& blk = q[size_t(b)];
        float amax = 0, mx = 0;
        for (int j = 0; j < 32; ++j)
            if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), mx = xb[j];
        for (int j = 0; j < 32; ++j) {
            const int c = j < 16 ? blk.qs[j] & 15 : blk.qs[j - 16] >> 4;
            ASSERT_EQ(y[32 * size_t(b) + j], float(c - 8) * kQ4KVScales.v[blk.e]) << b << " " << j;
        }
        if (amax == 0) {
            EXPECT_EQ(blk.e & 127, 0) << "a block of zeros";
            continue;
        }
        int k0 = 1;
        while (k0 < 127 && kQ4KVScales.v[k0 + 1] <= amax / 8) ++k0;
        const int k = blk.e & 127;
        ASSERT_TRUE(k == k0 || k == k0 + 1) << "block " << b << " k " << k << " k0 " << k0;
        EXPECT_EQ(blk.e >> 7, mx > 0 ? 1 : 0) << "block " << b;
        int mine[32], other[32];
        const uint8_t sign = blk.e & 128;
        const double e_mine = codes_err(xb, kQ4KVScales.v[blk.e], mine);
        const double e_other = codes_err(xb, kQ4KVScales.v[(k == k0 ? k0 + 1 : k0) | sign], other);
        EXPECT_LE(e_mine, e_other * (1 + 1e-5)) << "block " << b;
        for (int j = 0; j < 32; ++j) EXPECT_EQ(mine[j], j < 16 ? blk.qs[j] & 15 : blk.qs[j - 16] >> 4) << b << " " << j;
        double ss = 0;
        for (int j = 0; j < 32; ++j) ss += double(xb[j]) * xb[j];
        for (int j = 0; j < 32; ++j) {
            err_kv += std::pow(double(y[32 * size_t(b) + j]) - xb[j], 2) / ss;
            err_40 += std::pow(double(y40[32 * size_t(b) + j]) - xb[j], 2) / ss;
        }
    }
    // One byte of scale in quarter octaves costs little against Q4_0's f16 scale.
    std::printf("  relative square error, Q4_KV %.5f, Q4_0 %.5f\n", err_kv / n_blocks, err_40 / n_blocks);
    EXPECT_LT(err_kv, 1.05 * err_40);
}

}  // namespace
