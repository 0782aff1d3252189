// The decode attention kernels' shared argument block (attention.cu, attention_decode.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace cera::cuda {

// The attention scratch starts with the decode kernels' counters (one int per (token, kv head), at
// the same place whatever the call's shape, so no call's partials overwrite another's counters);
// every kernel's partials follow them.
constexpr int64_t kDecodeCounterFloats = 1024;

struct DecodeAttnArgs {
    const float* q;
    const void* k;
    const void* v;
    const int32_t* pos;
    int64_t n_ctx, n_tokens;
    int n_head, n_head_kv, head_dim, n_splits, sliding_window;
    float scale;
    float* out;
    float* partial;
    int kc;           // decode kernels: keys per chunk
    uint8_t* out_xq;  // quantize_q8 rows of out (row = n_head * head_dim), or null
};

// The warp-parallel decode kernel (attention_decode.cu) on a, whose kc and n_splits come from the
// decode plan of attention.cu; false (nothing launched) when it does not serve these shapes
// (head_dim other than 64 / 128, GQA groups above 8) or CERA_CUDA_ATTN_WARP=0.
bool attention_decode_warp(const DecodeAttnArgs& a, bool f16, cudaStream_t s);

}  // namespace cera::cuda
