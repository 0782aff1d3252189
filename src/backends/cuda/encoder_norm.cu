// The vision encoder's elementwise ops (encoder_ops.h): layer norm and GELU.
// layer_norm: one block per row; rows up to kLnRegs * 1024 elements keep x in registers (one read
// of x), longer rows read it three times. Two passes over the values, the mean first and then the
// sum of squared deviations, so that a row with a large mean keeps its variance (a one-pass
// E[x^2] - mean^2 would cancel). The block sums order every read of x before the first write, so
// out may alias x.
// gelu: one thread per element, the function evaluated in double (below: why).
// Both are bound by bytes: 8 per element (read and write), ~0.6 G elements per ms at the H200's
// 4.8 TB/s; a SigLIP2 layer's norms and GELU move ~40 MB for a 1024-patch tile (~10 us).
#include "backends/cuda/common.cuh"
#include "backends/cuda/encoder_ops.h"

namespace cera::cuda {
namespace {

constexpr int kLnRegs = 8;

__global__ void layer_norm_kernel(const float* x, const float* __restrict__ w, const float* __restrict__ b, float eps,
                                  int64_t n, float* out) {
    pdl_trigger();
    __shared__ float red[32];
    const int bd = blockDim.x, tid = threadIdx.x;
    const bool regs = n <= int64_t(kLnRegs) * bd;
    pdl_wait();
    const float* xr = x + int64_t(blockIdx.x) * n;
    float* yr = out + int64_t(blockIdx.x) * n;
    const float inv_n = 1.0f / float(n);
    if (regs) {
        float xv[kLnRegs];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kLnRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            xv[j] = i < n ? xr[i] : 0.0f;
            s += xv[j];
        }
        const float mean = block_sum(s, red) * inv_n;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < kLnRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            const float d = i < n ? xv[j] - mean : 0.0f;
            ss = fmaf(d, d, ss);
        }
        const float r = rsqrtf(block_sum(ss, red) * inv_n + eps);
#pragma unroll
        for (int j = 0; j < kLnRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            if (i < n) yr[i] = fmaf((xv[j] - mean) * r, w ? w[i] : 1.0f, b ? b[i] : 0.0f);
        }
        return;
    }
    float s = 0.0f;
    for (int64_t i = tid; i < n; i += bd) s += xr[i];
    const float mean = block_sum(s, red) * inv_n;
    float ss = 0.0f;
    for (int64_t i = tid; i < n; i += bd) {
        const float d = xr[i] - mean;
        ss = fmaf(d, d, ss);
    }
    const float r = rsqrtf(block_sum(ss, red) * inv_n + eps);
    for (int64_t i = tid; i < n; i += bd) yr[i] = fmaf((xr[i] - mean) * r, w ? w[i] : 1.0f, b ? b[i] : 0.0f);
}

// In double: the tanh form is x * sigmoid(2 y), y = sqrt(2/pi) (x + 0.044715 x^3), and for negative x
// a float y's few ulps of rounding are multiplied by |2 y| in the result (tens of ulps at x = -3),
// while the op is bound by bytes, so double arithmetic costs no time. The erf form is written with
// erfc, which keeps its relative accuracy where 1 + erf(x / sqrt 2) would cancel.
__global__ void gelu_kernel(const float* x, int64_t n, bool erf_kind, float* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double v = x[i];
    double r;
    if (erf_kind) {
        r = 0.5 * v * erfc(-v * 0.70710678118654752440);
    } else {
        const double y = 0.79788456080286535588 * (v + 0.044715 * v * v * v);  // sqrt(2 / pi) (...)
        r = v / (1.0 + exp(-2.0 * y));                                         // 0.5 v (1 + tanh y)
    }
    out[i] = float(r);
}

}  // namespace

void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t n, float* out,
                Stream stream) {
    if (rows == 0 || n == 0) return;
    CERA_CHECK(rows <= INT32_MAX, "layer_norm: %lld rows", (long long)rows);
    // Enough threads for the row to fit the registers where it can: 128 to 1024, whole warps.
    const int64_t want = (ceil_div(n, kLnRegs) + 31) / 32 * 32;
    const int threads = int(want < 128 ? 128 : want > 1024 ? 1024 : want);
    launch(layer_norm_kernel, unsigned(rows), threads, 0, as_stream(stream), x, w, b, eps, n, out);
}

void gelu(const float* x, int64_t n, bool erf_kind, float* out, Stream stream) {
    if (n == 0) return;
    CERA_CHECK(ceil_div(n, 256) <= INT32_MAX, "gelu: %lld elements", (long long)n);
    launch(gelu_kernel, unsigned(ceil_div(n, 256)), 256, 0, as_stream(stream), x, n, erf_kind, out);
}

}  // namespace cera::cuda
