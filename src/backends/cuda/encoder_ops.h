// The vision encoder's ops on the device (CudaBackend::layer_norm, gelu, attention_full): the
// SigLIP2 tower's and the LFM2-VL projector's layer norms, GELUs and bidirectional attention. Their
// specification is the host references of backend.h (layer_norm_rows_host, gelu_host,
// attention_full_host); tests/kernels/op_harness_encoder_test.cpp checks these kernels against it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

// out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, one block per row; x, out: f32 [rows, n] (out may
// alias x); w, b: f32 [n] or null (1 and 0).
void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t rows, int64_t n, float* out,
                Stream stream);

// out = gelu(x) over n elements (out may alias x): erf_kind the exact GELU, else the tanh form.
void gelu(const float* x, int64_t n, bool erf_kind, float* out, Stream stream);

// The largest head_dim attention_full takes (the backend sends larger heads through the host).
constexpr int kAttnFullMaxHeadDim = 128;
// Scratch bytes attention_full needs for these shapes (0: none).
size_t attention_full_scratch_bytes(int64_t n_tokens, int n_head, int head_dim);
// Every query over every key of its head, softmax(scale q k^T) v, no mask:
//   q, k, v, out: f32 [n_tokens, n_head * head_dim] (out must not alias the others); head_dim <=
//   kAttnFullMaxHeadDim; scratch: attention_full_scratch_bytes() bytes (any content).
void attention_full(const float* q, const float* k, const float* v, int64_t n_tokens, int n_head, int head_dim,
                    float scale, float* out, void* scratch, Stream stream);

}  // namespace cera::cuda
