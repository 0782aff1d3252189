// The grouped LoRA product of one projection on the device (CudaBackend::lora_segments).
#pragma once
#include <cstdint>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

// One segment: rows [start, start + n) of x and y through A (f32 or f16 [r, k]) and Bᵀ (f32 or f16
// [r, n_out]) with the scale; its r values of A x a row go to t + t_off + (row - start) * r.
struct LoraSegDev {
    int64_t start = 0, n = 0, t_off = 0;
    const void* a = nullptr;
    const void* bt = nullptr;
    float scale = 0.0f;
    int r = 0;
    bool a_f16 = false, bt_f16 = false;
};

// Segments a launch pair takes (they travel as kernel parameters); more are taken in turns.
constexpr int kLoraSegsPerLaunch = 32;
// Segments of at least this many rows (a long prompt's) with F16 A and Bᵀ run as two cuBLAS products
// instead (CudaBackend::launch(LoraNode&)): t = s X Aᵀ in F16, then Y += T Bᵀ, both on F16 operands (x
// rounded to F16 as the base product's cuBLAS path does) with f32 accumulation. Two launches a segment:
// shorter segments (a batch's prompt chunks under several adapters) stay with the segment kernels.
constexpr int64_t kLoraGemmRows = 256;

// The rows of a MoE expert product (CudaBackend::moe_ffn_lora): row i is a (token, expert) slot whose
// expert is ids[i] (clamped to [0, n_expert)), reading x row i / x_div; a segment's a and bt hold every
// expert's A [r, k] and Bᵀ [r, n_out] one after another.
struct LoraExperts {
    const int32_t* ids = nullptr;
    int n_expert = 0;
    int x_div = 1;
};

// y[row] += scale_i Bᵢ (Aᵢ x[row]) for every row of each segment; segments may overlap (their deltas add
// up). t: scratch of sum(n_i r_i) floats. x: f32 [n_rows, k] (n_rows / x_div rows with experts); y: f32
// [n_rows, n_out].
void lora_segments(const float* x, float* y, float* t, int64_t k, int64_t n_out, int64_t n_rows,
                   const LoraSegDev* segs, int n_segs, Stream stream, const LoraExperts* experts = nullptr);

// The one-row form that runs before the base products instead of after them (step_fusion.cpp's
// hoist_lora): for up to kMaxSegs products sharing x (one row of k), delta_p = bias_p + the sum over the
// product's segments of scale B (A x), which the base product then adds as its bias, so that the base
// launches keep their fusions. x is rms_norm(pro_x, pro_w, pro_eps) when pro_x is set (the norm the base
// launch makes in its prologue), else read as it is.
constexpr int kLoraDeltaSegs = 8;          // adapters of one product
constexpr int64_t kLoraDeltaMaxK = 32768;  // x is staged in shared memory
struct LoraDeltaProduct {
    LoraSegDev segs[kLoraDeltaSegs];
    int n_segs = 0;
    int64_t n_out = 0;
    const float* bias = nullptr;  // [n_out] or null
    float* delta = nullptr;       // [n_out]
};
struct LoraDeltaArgs {
    const float* x = nullptr;
    int64_t k = 0;
    const float* pro_x = nullptr;
    const float* pro_w = nullptr;
    float pro_eps = 0.0f;
    LoraDeltaProduct p[kMaxSegs];
    int n = 0;
};
void lora_delta(const LoraDeltaArgs& a, Stream stream);

}  // namespace cera::cuda
