// Random data and reference dequantization shared by the kernel tests (op_harness.h, cuda_fixture.h).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "core/quant/quant.h"

namespace cera {

inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// The reference values of a [rows, k] weight of `type` stored as GGUF bytes.
inline std::vector<float> dequant(GgmlType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t k) {
    std::vector<float> out(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r)
        dequantize_row_ref(type, bytes.data() + size_t(r) * row_size(type, k), out.data() + r * k, k);
    return out;
}

}  // namespace cera
