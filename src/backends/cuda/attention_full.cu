// Bidirectional attention of the vision encoder (encoder_ops.h): every patch of an image over every
// patch, per head, no mask and no cache. Flash style, f32 on the SIMT cores: a block owns kRows queries
// of one head (grid: heads x query tiles, one launch), walks the keys in tiles of kKeys rows of K and V
// staged in shared memory, and keeps an online softmax (running maximum and sum, the partial output
// rescaled when the maximum grows) so that the scores never go to memory.
// Thread (query qi, group g) of the 128 computes the scores of keys g, g + 4, ... of the tile; warp 0
// then updates each row's softmax; thread (qi, g) accumulates the output dims g, g + 4, ... of its query.
// Bound by the math, not bytes: 4 * head_dim FLOPs per (query, key, head), 4.8 GFLOP a SigLIP2 layer
// for a 1024-patch tile (16 heads of 72), against the H200's ~60 TFLOP/s of f32 FMA.
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/encoder_ops.h"

namespace cera::cuda {
namespace {

constexpr int kRows = 32, kKeys = 32, kThreads = 128;
constexpr int kGroups = kThreads / kRows;                // threads per query row
constexpr int kDimRegs = kAttnFullMaxHeadDim / kGroups;  // output dims a thread owns at most

// Shared floats: q and k tiles (rows of head_dim | 1: odd strides, so that lanes reading one column of
// 32 rows hit 32 banks), v tile, scores [kRows][kKeys + 1], and per row the rescale, sum and maximum.
size_t simt_smem_floats(int hd) {
    const int hs = hd | 1;
    return size_t(2 * kRows * hs + kKeys * hd + kRows * (kKeys + 1) + 3 * kRows);
}

__global__ void __launch_bounds__(kThreads)
    attn_full_simt_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          int64_t n, int n_head, int hd, float scale, float* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float sm[];
    const int hs = hd | 1;
    float* qs = sm;               // [kRows][hs], scaled
    float* ks = qs + kRows * hs;  // [kKeys][hs]
    float* vs = ks + kKeys * hs;  // [kKeys][hd]
    float* ps = vs + kKeys * hd;  // [kRows][kKeys + 1]
    float* corr = ps + kRows * (kKeys + 1);
    float* ls = corr + kRows;
    float* ms = ls + kRows;
    const int tid = threadIdx.x, qi = tid % kRows, grp = tid / kRows;
    const int64_t width = int64_t(n_head) * hd, col0 = int64_t(blockIdx.x) * hd, t0 = int64_t(blockIdx.y) * kRows;
    for (int e = tid; e < kRows * hd; e += kThreads) {
        const int r = e / hd, c = e - r * hd;
        qs[r * hs + c] = t0 + r < n ? q[(t0 + r) * width + col0 + c] * scale : 0.0f;
    }
    if (tid < kRows) ms[tid] = -INFINITY, ls[tid] = 0.0f;
    float o[kDimRegs];
#pragma unroll
    for (int i = 0; i < kDimRegs; ++i) o[i] = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
        __syncthreads();  // the previous tile's k, v and p are read
        for (int e = tid; e < kKeys * hd; e += kThreads) {
            const int r = e / hd, c = e - r * hd;
            const bool ok = j0 + r < n;
            ks[r * hs + c] = ok ? k[(j0 + r) * width + col0 + c] : 0.0f;
            vs[r * hd + c] = ok ? v[(j0 + r) * width + col0 + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kKeys / kGroups; ++i) {
            const int kj = grp + kGroups * i;
            float s = 0.0f;
            for (int c = 0; c < hd; ++c) s = fmaf(qs[qi * hs + c], ks[kj * hs + c], s);
            ps[qi * (kKeys + 1) + kj] = j0 + kj < n ? s : -INFINITY;
        }
        __syncthreads();
        if (tid < kRows) {  // every tile holds a key (j0 < n): the new maximum is finite
            float* pr = ps + tid * (kKeys + 1);
            float mx = ms[tid];
            for (int kj = 0; kj < kKeys; ++kj) mx = fmaxf(mx, pr[kj]);
            const float c = expf(ms[tid] - mx);  // 0 on the first tile (the maximum was -inf)
            float sum = 0.0f;
            for (int kj = 0; kj < kKeys; ++kj) {
                const float p = expf(pr[kj] - mx);
                pr[kj] = p;
                sum += p;
            }
            ls[tid] = fmaf(ls[tid], c, sum);
            ms[tid] = mx;
            corr[tid] = c;
        }
        __syncthreads();
        const float c = corr[qi];
        const float* pr = ps + qi * (kKeys + 1);
#pragma unroll
        for (int i = 0; i < kDimRegs; ++i) {
            const int d = grp + kGroups * i;
            if (d < hd) {
                float acc = o[i] * c;
                for (int kj = 0; kj < kKeys; ++kj) acc = fmaf(pr[kj], vs[kj * hd + d], acc);
                o[i] = acc;
            }
        }
    }
    const int64_t t = t0 + qi;
    if (t >= n) return;
    const float inv = 1.0f / ls[qi];
#pragma unroll
    for (int i = 0; i < kDimRegs; ++i) {
        const int d = grp + kGroups * i;
        if (d < hd) out[t * width + col0 + d] = o[i] * inv;
    }
}

}  // namespace

size_t attention_full_scratch_bytes(int64_t, int, int) { return 0; }

void attention_full(const float* q, const float* k, const float* v, int64_t n_tokens, int n_head, int head_dim,
                    float scale, float* out, void*, Stream stream) {
    if (n_tokens == 0 || n_head == 0 || head_dim == 0) return;
    CERA_CHECK(head_dim <= kAttnFullMaxHeadDim && ceil_div(n_tokens, kRows) <= 65535,
               "attention_full: head_dim %d (at most %d), %lld tokens", head_dim, kAttnFullMaxHeadDim,
               (long long)n_tokens);
    const size_t smem = simt_smem_floats(head_dim) * sizeof(float);
    allow_dynamic_smem<attn_full_simt_kernel>(smem);
    launch(attn_full_simt_kernel, dim3(unsigned(n_head), unsigned(ceil_div(n_tokens, kRows))), kThreads, smem,
           as_stream(stream), q, k, v, n_tokens, n_head, head_dim, scale, out);
}

}  // namespace cera::cuda
