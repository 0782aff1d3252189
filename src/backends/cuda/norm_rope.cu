// Row norms, per-head q/k norm + RoPE, and the KV-cache append.
// Idea: all three are bandwidth-trivial (a few KB per token) and latency-bound in decode, so each is
// one launch over the whole batch: rms_norm one block per row; norm_rope one warp per (token, head),
// RMSNorm of the head then rotation of its pairs (NORM: (2i, 2i+1); NEOX: (i, i + n_rot/2)), angles
// in double as the CPU reference computes them; kv_store one thread per element.
// Roofline: bytes = 2 x activations; microseconds are launch latency, not bandwidth.
#include "backends/cuda/common.cuh"

namespace cera::cuda {
namespace {

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps, int64_t n,
                                float* out) {
    pdl_trigger();
    pdl_wait();
    __shared__ float red[32];
    const float* xr = x + int64_t(blockIdx.x) * n;
    float* yr = out + int64_t(blockIdx.x) * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / float(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? xr[i] * r * w[i] : xr[i] * r;
}

__global__ void norm_rope_kernel(float* x, int64_t n_rows, int n_head, int head_dim, const float* __restrict__ norm_w,
                                 float eps, const int32_t* __restrict__ pos, RopeArgs rope) {
    pdl_trigger();
    pdl_wait();
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31;
    float* v = x + row * head_dim;
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
        const double p = double(pos[row / n_head]) * rope.freq_scale;
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

template <bool kF16>
__global__ void kv_store_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t n_tokens,
                                int64_t width, const int32_t* __restrict__ pos, void* k_cache, void* v_cache,
                                int64_t n_ctx) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * width) return;
    const int64_t t = i / width, c = i % width;
    const int64_t p = pos[t];
    if (p < 0 || p >= n_ctx) return;
    const int64_t dst = p * width + c;
    if (kF16) {
        static_cast<__half*>(k_cache)[dst] = __float2half_rn(k[i]);
        static_cast<__half*>(v_cache)[dst] = __float2half_rn(v[i]);
    } else {
        static_cast<float*>(k_cache)[dst] = k[i];
        static_cast<float*>(v_cache)[dst] = v[i];
    }
}

}  // namespace

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* out, Stream stream) {
    if (rows == 0) return;
    const int threads = n >= 2048 ? 512 : n >= 512 ? 256 : 128;
    launch(rms_norm_kernel, unsigned(rows), threads, 0, as_stream(stream), x, w, eps, n, out);
    CUDA_CHECK_LAUNCH();
}

void norm_rope(float* x, int64_t n_tokens, int n_head, int head_dim, const float* norm_w, float eps,
               const int32_t* pos, const RopeArgs& rope, Stream stream) {
    const int64_t rows = n_tokens * n_head;
    if (rows == 0 || (!norm_w && rope.mode == 0)) return;
    CERA_CHECK(rope.mode == 0 || (rope.n_rot % 2 == 0 && rope.n_rot <= head_dim));
    launch(norm_rope_kernel, unsigned(ceil_div(rows, 4)), 128, 0, as_stream(stream), x, rows, n_head, head_dim, norm_w,
                                                                                eps, pos, rope);
    CUDA_CHECK_LAUNCH();
}

void kv_store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos, void* k_cache,
              void* v_cache, bool f16, int64_t n_ctx, Stream stream) {
    const int64_t n = n_tokens * width;
    if (n == 0) return;
    const unsigned grid = unsigned(ceil_div(n, 256));
    if (f16) launch((kv_store_kernel<true>), grid, 256, 0, as_stream(stream), k, v, n_tokens, width, pos, k_cache, v_cache, n_ctx);
    else launch((kv_store_kernel<false>), grid, 256, 0, as_stream(stream), k, v, n_tokens, width, pos, k_cache, v_cache, n_ctx);
    CUDA_CHECK_LAUNCH();
}

}  // namespace cera::cuda
