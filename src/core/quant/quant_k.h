// Inside the quantizer table (quant.cpp): the K-quant quantizers of quant_k.cpp, the IQ4 formats of
// quant_iq4.cpp and the helpers they share. Not for use outside src/core/quant.
#pragma once
#include <cstdint>

#include "core/fp16.h"

namespace cera::quant_detail {

// Below this largest magnitude a group is all zeros (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

inline float h2f(uint16_t h) { return fp16_to_fp32(h); }
inline uint16_t f2h(float f) { return fp32_to_fp16(f); }

// The grid search of make_qkx2_quants (Q2_K, Q4_K, Q5_K), after its first fit: for each step is in
// [0, nstep], a fit at the inverse scale (rmin + rdelta * is + nmax) / (max - min); a fit with a smaller
// weighted error replaces scale, min, best_error and L. The search reads min, so a step that moves it
// changes the steps after it.
struct Qkx2Search {
    int n, nmax;
    const float* x;
    const float* weights;
    float rmin, rdelta;
    int nstep;
    bool use_mad;  // rank by weighted absolute error instead of squared
    float sum_w, sum_x, max;
    float min, scale, best_error;  // the fit so far, updated
    uint8_t* L;                    // [n] the fit's levels, updated
    uint8_t* Laux;                 // [n] scratch
};
// The reference: llama.cpp's loop, step by step.
void qkx2_search(Qkx2Search& s);
// The same result bit for bit, sixteen steps at a time in AVX-512 lanes (each lane runs the scalar
// loop's operations in its order, with no FMA contraction). A lane that improves the fit and moves min
// ends the round; the next round starts at the step after it.
void qkx2_search_avx512(Qkx2Search& s);
bool qkx2_search_avx512_usable();

// x[0..n) (n a multiple of 256) into n / 256 blocks of each type at dst. qw: an importance matrix row of
// n values (llama.cpp's quantize_* with quant_weights), or nullptr for the reference quantizer
// (quantize_row_*_ref).
void quant_q2_k(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_q3_k(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_q4_k(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_q5_k(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_q6_k(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_q8_k(const float* x, void* dst, int64_t n);

// One row x[0..n) (n a multiple of 32) under its importance matrix row qw[0..n): llama.cpp's quantize_*
// with quant_weights for the 32-element types.
void quant_q4_0_weighted(const float* x, void* dst, int64_t n, const float* qw);
void quant_q4_1_weighted(const float* x, void* dst, int64_t n, const float* qw);
void quant_q5_0_weighted(const float* x, void* dst, int64_t n, const float* qw);
void quant_q5_1_weighted(const float* x, void* dst, int64_t n, const float* qw);

// IQ4_NL (n a multiple of 32) and IQ4_XS (of 256), quant_iq4.cpp: llama.cpp's quantize_iq4_nl /
// quantize_iq4_xs, with quant_weights = qw (nullptr: none, as llama-quantize without an importance
// matrix calls them).
void quant_iq4_nl(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void quant_iq4_xs(const float* x, void* dst, int64_t n, const float* qw = nullptr);
void dequant_iq4_nl(const void* src, float* y, int64_t n);
void dequant_iq4_xs(const void* src, float* y, int64_t n);

}  // namespace cera::quant_detail
