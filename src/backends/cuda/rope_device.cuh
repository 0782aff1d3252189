// Per-head RMSNorm + RoPE and the KV-cache row store, one warp per head vector: shared by the
// batched kernels (norm_rope.cu) and the decode program (decode_step.cu).
#pragma once
#include "backends/cuda/common.cuh"

namespace cera::cuda {

// One head vector v[head_dim] in place, by one warp: optional RMSNorm, then RoPE at position p.
__device__ __forceinline__ void head_norm_rope(float* v, int head_dim, const float* __restrict__ norm_w, float eps,
                                               int32_t pos, const RopeArgs& rope) {
    const int lane = threadIdx.x & 31;
    float r = 1.0f;
    if (norm_w) {
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += 32) ss = fmaf(v[i], v[i], ss);
        r = rsqrtf(warp_sum(ss) / float(head_dim) + eps);
    }
    auto scaled = [&](int i) { return norm_w ? v[i] * r * norm_w[i] : v[i]; };
    const int n_rot = rope.mode == 0 ? 0 : rope.n_rot, half = n_rot / 2;
    // Read everything this lane touches before writing (pairs span lanes only within the lane's own set).
    if (n_rot > 0) {
        const double p = double(pos) * rope.freq_scale;
        for (int i = lane; i < half; i += 32) {
            const int i0 = rope.mode == 1 ? 2 * i : i, i1 = rope.mode == 1 ? 2 * i + 1 : i + half;
            double theta = p * pow(double(rope.freq_base), -2.0 * i / n_rot);
            if (rope.freq_factors) theta /= rope.freq_factors[i];
            const float c = float(cos(theta)), s = float(sin(theta));
            const float a = scaled(i0), b = scaled(i1);
            v[i0] = a * c - b * s;
            v[i1] = a * s + b * c;
        }
    }
    if (norm_w)
        for (int i = n_rot + lane; i < head_dim; i += 32) v[i] = v[i] * r * norm_w[i];
}

template <class C>
__device__ __forceinline__ void store_head(const float* src, C* dst, int head_dim) {
    for (int i = threadIdx.x & 31; i < head_dim; i += 32) {
        if constexpr (sizeof(C) == 2) dst[i] = __float2half_rn(src[i]);
        else dst[i] = src[i];
    }
}

}  // namespace cera::cuda
