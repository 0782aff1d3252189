// Inside the quantizer table (quant.cpp): the K-quant quantizers of quant_k.cpp and the helpers both
// files use. Not for use outside src/core/quant.
#pragma once
#include <cstdint>

#include "core/fp16.h"

namespace cera::quant_detail {

// Below this largest magnitude a group is all zeros (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

inline float h2f(uint16_t h) { return fp16_to_fp32(h); }
inline uint16_t f2h(float f) { return fp32_to_fp16(f); }

// x[0..n) (n a multiple of 256) into n / 256 blocks of each type at dst.
void quant_q2_k(const float* x, void* dst, int64_t n);
void quant_q3_k(const float* x, void* dst, int64_t n);
void quant_q4_k(const float* x, void* dst, int64_t n);
void quant_q5_k(const float* x, void* dst, int64_t n);
void quant_q6_k(const float* x, void* dst, int64_t n);
void quant_q8_k(const float* x, void* dst, int64_t n);

}  // namespace cera::quant_detail
