// The CUDA weight images (src/backends/cuda/weight_image.cpp) are host code: decoded here on the host as
// kernels.h and quant_device.cuh document them, they must give the reference dequantization (to
// float rounding: the two may contract the multiply-add differently).
// The GPU suites check the kernels that read them; this checks the layout itself, without a GPU.
#include <gtest/gtest.h>

#if CERA_TEST_HAVE_CUDA
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/kernels.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

namespace cera::cuda {
namespace {

std::vector<uint8_t> quantized_rows(GgmlType t, int64_t rows, int64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(rows * k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (1.0f + float(i % 97) / 16.0f);  // uneven scales
    const size_t rb = row_size(t, k);
    std::vector<uint8_t> q(rb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) quantize_row_ref(t, x.data() + r * k, q.data() + size_t(r) * rb, k);
    return q;
}

// Q4_K: item j of block b = sub-block j (quant bytes 128 b + 16 j .., element l in the low nibble of
// byte l, l + 16 in the high one); scale stream bytes 20 b: d, dmin (f16), then scale, min of each
// sub-block (bytes 4 + 2 j, 5 + 2 j).
TEST(CudaImage, Q4kItemsDecodeToTheReference) {
    const int64_t rows = 5, k = 768, nb = k / 256;
    const std::vector<uint8_t> gguf = quantized_rows(GgmlType::kQ4_K, rows, k, 7);
    std::vector<uint8_t> img(weight_image_bytes(GgmlType::kQ4_K, rows, k));
    ASSERT_EQ(img.size(), size_t(rows * nb * (128 + 20)));
    make_weight_image(GgmlType::kQ4_K, gguf.data(), rows, k, img.data());
    const uint8_t* q = img.data();
    const uint8_t* m = q + rows * nb * 128;
    std::vector<float> ref(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_ref(GgmlType::kQ4_K, gguf.data() + size_t(r) * row_size(GgmlType::kQ4_K, k), ref.data(), k);
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t blk = r * nb + b;
            uint16_t dh, mh;
            std::memcpy(&dh, m + 20 * blk, 2);
            std::memcpy(&mh, m + 20 * blk + 2, 2);
            for (int j = 0; j < 8; ++j) {
                const float d = fp16_to_fp32(dh) * float(m[20 * blk + 4 + 2 * j]);
                const float mn = fp16_to_fp32(mh) * float(m[20 * blk + 5 + 2 * j]);
                for (int l = 0; l < 32; ++l) {
                    const uint8_t byte = q[128 * blk + 16 * j + (l % 16)];
                    const int v = l < 16 ? byte & 15 : byte >> 4;
                    const float want = ref[size_t(256 * b + 32 * j + l)];
                    ASSERT_NEAR(d * float(v) - mn, want, 1e-6f * (1.0f + std::fabs(want)))
                        << "row " << r << " block " << b << " sub-block " << j << " element " << l;
                }
            }
        }
    }
}

// Q4_0: the quants (16 bytes a block, GGUF nibble order), then the f16 scales.
TEST(CudaImage, Q40SplitsQuantsAndScales) {
    const int64_t rows = 3, k = 256, nb = k / 32;
    const std::vector<uint8_t> gguf = quantized_rows(GgmlType::kQ4_0, rows, k, 11);
    std::vector<uint8_t> img(weight_image_bytes(GgmlType::kQ4_0, rows, k));
    ASSERT_EQ(img.size(), size_t(rows * nb * 18));
    make_weight_image(GgmlType::kQ4_0, gguf.data(), rows, k, img.data());
    const uint8_t* m = img.data() + rows * nb * 16;
    std::vector<float> ref(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_ref(GgmlType::kQ4_0, gguf.data() + size_t(r) * row_size(GgmlType::kQ4_0, k), ref.data(), k);
        for (int64_t b = 0; b < nb; ++b) {
            uint16_t dh;
            std::memcpy(&dh, m + 2 * (r * nb + b), 2);
            for (int l = 0; l < 32; ++l) {
                const uint8_t byte = img[size_t(16 * (r * nb + b) + l % 16)];
                const int v = (l < 16 ? byte & 15 : byte >> 4) - 8;
                const float want = ref[size_t(32 * b + l)];
                ASSERT_NEAR(fp16_to_fp32(dh) * float(v), want, 1e-6f * (1.0f + std::fabs(want)))
                    << "row " << r << " block " << b;
            }
        }
    }
}

}  // namespace
}  // namespace cera::cuda

#else
TEST(CudaImage, NeedsCudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
