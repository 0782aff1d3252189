// Per-head RMSNorm + RoPE and the KV-cache row store, one warp per head vector: shared by the
// batched kernels (norm_rope.cu).
#pragma once
#include "backends/cuda/common.cuh"
#include "core/rotation.h"

namespace cera::cuda {

// The rotation of this lane's pairs i = lane, lane + 32, ... (< n_rot / 2, at most kRopeLanePairs of
// them: n_rot <= 256) at position pos, angles in double as the CPU reference computes them. It reads
// only the position and the constant frequency factors, so kernels compute it before the PDL wait.
constexpr int kRopeLanePairs = 4;
struct RopeCS {
    float c[kRopeLanePairs], s[kRopeLanePairs];
};
__device__ __forceinline__ bool rope_precomputable(const RopeArgs& rope) {
    return rope.mode == 0 || rope.n_rot / 2 <= 32 * kRopeLanePairs;
}
// The rotation of pair i at position p (already times freq_scale), in double as the CPU computes it.
__device__ __forceinline__ void rope_pair_cs(int i, double p, int n_rot, const RopeArgs& rope, float& c, float& s) {
    double theta = p * pow(double(rope.freq_base), -2.0 * i / n_rot);
    if (rope.freq_factors) theta /= rope.freq_factors[i];
    c = float(cos(theta)), s = float(sin(theta));
}

__device__ __forceinline__ RopeCS rope_angles(int32_t pos, const RopeArgs& rope) {
    RopeCS cs;
    const int lane = threadIdx.x & 31;
    const int n_rot = rope.mode == 0 ? 0 : rope.n_rot, half = n_rot / 2;
    if (rope.table && pos >= 0 && pos < rope.table_rows) {  // a load instead of the double math
        const float2* row = reinterpret_cast<const float2*>(rope.table) + int64_t(pos) * half;
#pragma unroll
        for (int j = 0; j < kRopeLanePairs; ++j) {
            const int i = lane + 32 * j;
            const float2 v = i < half ? row[i] : make_float2(1.0f, 0.0f);
            cs.c[j] = v.x, cs.s[j] = v.y;
        }
        return cs;
    }
    const double p = double(pos) * rope.freq_scale;
#pragma unroll
    for (int j = 0; j < kRopeLanePairs; ++j) {
        const int i = lane + 32 * j;
        cs.c[j] = 1.0f, cs.s[j] = 0.0f;
        if (i < half) rope_pair_cs(i, p, n_rot, rope, cs.c[j], cs.s[j]);
    }
    return cs;
}

// One head vector v[head_dim] in place, by one warp: optional RMSNorm, then RoPE with the lane's
// rotations cs (rope_angles, when rope_precomputable) or angles computed here at position pos.
__device__ __forceinline__ void head_norm_rope(float* v, int head_dim, const float* __restrict__ norm_w, float eps,
                                               int32_t pos, const RopeArgs& rope, const RopeCS* cs = nullptr) {
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
        for (int i = lane, j = 0; i < half; i += 32, ++j) {
            const int i0 = rope.mode == 1 ? 2 * i : i, i1 = rope.mode == 1 ? 2 * i + 1 : i + half;
            float c, s;
            if (cs && j < kRopeLanePairs) {
                c = j == 0 ? cs->c[0] : j == 1 ? cs->c[1] : j == 2 ? cs->c[2] : cs->c[3];
                s = j == 0 ? cs->s[0] : j == 1 ? cs->s[1] : j == 2 ? cs->s[2] : cs->s[3];
            } else {
                rope_pair_cs(i, p, n_rot, rope, c, s);
            }
            const float a = scaled(i0), b = scaled(i1);
            v[i0] = a * c - b * s;
            v[i1] = a * s + b * c;
        }
    }
    if (norm_w)
        for (int i = n_rot + lane; i < head_dim; i += 32) v[i] = v[i] * r * norm_w[i];
}

// A head of n = 2^k values at v (shared or global memory) through the rotated caches' rotation
// (core/rotation.h) or its inverse, by the lanes of one warp: the sign flips, log2(n) butterfly stages
// (each pair's sum and difference, a stage at a time as rotate_head goes), the scale: the CPU's float
// operations in its order, so the same floats.
__device__ __forceinline__ void rotate_head_warp(float* v, int n, bool inverse) {
    const int lane = threadIdx.x & 31;
    const float s = 1.0f / sqrtf(float(n));
    __syncwarp();  // the lanes' writes of v before the call
    if (!inverse)
        for (int i = lane; i < n; i += 32) v[i] *= rotation_sign(i);
    for (int len = 1; len < n; len <<= 1) {
        __syncwarp();
        for (int p = lane; p < n / 2; p += 32) {
            const int j = (p / len) * 2 * len + p % len;
            const float a = v[j], b = v[j + len];
            v[j] = a + b, v[j + len] = a - b;
        }
    }
    __syncwarp();
    for (int i = lane; i < n; i += 32) v[i] *= inverse ? s * rotation_sign(i) : s;
    __syncwarp();
}

}  // namespace cera::cuda
