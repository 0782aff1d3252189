// Core: fp16/bf16 conversions, the type table, errors.
#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "core/fp16.h"

namespace cera {
namespace {

TEST(Fp16, RoundTripsEveryHalf) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = fp16_to_fp32(uint16_t(h));
        if (std::isnan(f)) continue;
        EXPECT_EQ(fp32_to_fp16(f), uint16_t(h)) << h;
    }
}

TEST(Fp16, KnownValues) {
    EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
    EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
    EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808000)), 0x3f80);  // tie -> even
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f818000)), 0x3f82);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}

TEST(Dtype, Table) {
    EXPECT_STREQ(type_name(GgmlType::kQ4_K), "Q4_K");
    EXPECT_EQ(row_size(GgmlType::kQ8_0, 64), 68u);
    EXPECT_EQ(row_size(GgmlType::kQ6_K, 512), 420u);
    EXPECT_EQ(type_info(4u), nullptr);  // removed Q4_2
    EXPECT_EQ(type_from_name("BF16"), GgmlType::kBF16);
    EXPECT_FALSE(type_from_name("Q9_9").has_value());
}

TEST(Error, ThrowErrorFormats) {
    try {
        throw_error(ErrorCode::kMissing, "key '%s' is missing", "a.b");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kMissing);
        EXPECT_STREQ(e.what(), "key 'a.b' is missing");
    }
}

}  // namespace
}  // namespace cera
