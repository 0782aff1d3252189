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

// y[row] += scale_i Bᵢ (Aᵢ x[row]) for every row of each segment; segments may overlap (their deltas add
// up). t: scratch of sum(n_i r_i) floats. x: f32 [n_rows, k]; y: f32 [n_rows, n_out].
void lora_segments(const float* x, float* y, float* t, int64_t k, int64_t n_out, int64_t n_rows,
                   const LoraSegDev* segs, int n_segs, Stream stream);

}  // namespace cera::cuda
