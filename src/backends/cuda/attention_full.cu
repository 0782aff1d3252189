// Bidirectional attention of the vision encoder (encoder_ops.h): every patch of an image over every
// patch, per head, no mask and no cache. Flash attention on tensor cores (mma.sync m16n8k16, f16
// operands, f32 accumulators), two launches:
//  1. split_kv: K and V of every head to f16 hi + lo pairs (x ~= hi + lo, 22 significant bits), laid
//     out [n_head][n_pad][HDP]: head_dim padded with zeros to HDP, a multiple of 16 (the MMA's k),
//     and the keys to n_pad, a multiple of the key tile, so that the main kernel copies whole 16-byte
//     chunks with cp.async whatever head_dim and n_tokens are (72 for SigLIP2, 1 .. thousands).
//  2. the attention: a block owns kRows = 64 queries of one head (grid: heads x query tiles, one
//     launch), 4 warps of 16 rows; Q (pre-scaled by scale * log2 e) stays in registers as hi + lo
//     A fragments; tiles of KT keys of K and V (hi and lo) go through two cp.async buffers (rows
//     padded by 16 bytes, so that ldmatrix reads 8 rows on distinct banks). Per tile: S = Q K^T,
//     the keys past n_tokens masked, online softmax in registers (running maximum and sum; exp2), P
//     to f16 hi + lo A fragments, O += P V. The normalised rows go out through shared memory, so that
//     whole warps write consecutive floats.
// Each product of two f32 values goes to the tensor cores as hi*hi + lo*hi + hi*lo (the lo*lo term is
// 2^-22 relative): the scores and the weighted sums match f32 arithmetic to ~1e-6 relative where one
// f16 product would leave ~1e-3. The operands must be within f16's range: |q scale log2 e|, |k|, |v|
// below 65504.
// Bound by the math, not bytes: 4 * head_dim FLOPs per (query, key, head), 4.8 GFLOP a SigLIP2 layer
// for a 1024-patch tile (16 heads of 72, padded to 80), three MMAs per product: against the H200's
// ~990 TFLOP/s of dense f16, at most ~330 TFLOP/s of f32-grade products.
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/encoder_ops.h"
#include "backends/cuda/mma_f16.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 128, kRows = 64;  // 4 warps x 16 query rows

// Keys a tile: 64, or 32 for heads above 96 (the shared memory of two buffers of K and V, hi and lo).
constexpr int tile_keys(int hdp) { return hdp > 96 ? 32 : 64; }
// head_dim padded to the MMA's k.
int padded_dim(int hd) { return (hd + 15) / 16 * 16; }
int64_t padded_keys(int64_t n, int hdp) { return ceil_div(n, tile_keys(hdp)) * tile_keys(hdp); }


// The four planes of the scratch, each [n_head][n_pad][hdp] halves: K hi, K lo, V hi, V lo.
// A thread per (head, key, 8 dims): 16-byte stores of every plane, the padding written as zeros.
__global__ void split_kv_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t n, int64_t n_pad,
                                int n_head, int hd, int hdp, __half* __restrict__ planes) {
    pdl_trigger();
    pdl_wait();
    const int chunks = hdp / 8;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t total = int64_t(n_head) * n_pad * chunks;
    if (i >= total) return;
    const int d0 = int(i % chunks) * 8;
    const int64_t row = i / chunks;  // head * n_pad + key
    const int h = int(row / n_pad);
    const int64_t j = row % n_pad;
    const int64_t plane = int64_t(n_head) * n_pad * hdp;
    const int64_t src = j * int64_t(n_head) * hd + int64_t(h) * hd;
    const int64_t dst = row * hdp + d0;
#pragma unroll
    for (int m = 0; m < 2; ++m) {  // K, then V
        const float* x = m ? v : k;
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = d0 + 2 * e;
            const float a = j < n && d < hd ? x[src + d] : 0.0f;
            const float b = j < n && d + 1 < hd ? x[src + d + 1] : 0.0f;
            to_half2(a, b, hi[e], lo[e]);
        }
        *reinterpret_cast<uint4*>(planes + (2 * m) * plane + dst) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(planes + (2 * m + 1) * plane + dst) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
}

template <int HDP>
constexpr size_t mma_smem_bytes() {
    constexpr int KT = tile_keys(HDP);
    return size_t(2) * 4 * KT * (HDP + 8) * sizeof(__half);  // two buffers of K hi, K lo, V hi, V lo
}

template <int HDP>
__global__ void __launch_bounds__(kThreads)
    attn_full_mma_kernel(const float* __restrict__ q, const __half* __restrict__ planes, int64_t n, int64_t n_pad,
                         int n_head, int hd, float qscale, float* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    constexpr int KT = tile_keys(HDP);
    constexpr int SP = HDP + 8;   // shared row stride in halves
    constexpr int KS = HDP / 16;  // k-steps of Q K^T
    constexpr int ND = HDP / 8;   // n-tiles of the output
    constexpr int NT = KT / 8;    // n-tiles of S (keys)
    constexpr int PK = KT / 16;   // k-steps of P V
    constexpr int OP = HDP + 4;   // the output rows' stride in shared memory (floats)
    static_assert(size_t(kRows) * OP * sizeof(float) <= mma_smem_bytes<HDP>(), "the output rows fit the tiles");
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half* tiles = reinterpret_cast<__half*>(fa_smem);  // [2 buffers][4 planes][KT][SP]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.x;
    const int64_t row0 = int64_t(blockIdx.y) * kRows;
    const int64_t width = int64_t(n_head) * hd, plane = int64_t(n_head) * n_pad * HDP;
    const __half* src = planes + int64_t(h) * n_pad * HDP;

    // This lane's rows (g and g + 8 of the warp's 16) as A fragments: a0 = (g, 2t4..), a1 = (g + 8, 2t4..),
    // a2 / a3 the same at k + 8. Rows past n_tokens and dims past head_dim are zeros.
    uint32_t qh[KS][4], ql[KS][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t t = row0 + warp * 16 + g + 8 * r;
        const float* qr = t < n ? q + t * width + int64_t(h) * hd : nullptr;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int d = 16 * ks + 8 * c + 2 * t4;
                const float x0 = qr && d < hd ? qr[d] * qscale : 0.0f;
                const float x1 = qr && d + 1 < hd ? qr[d + 1] * qscale : 0.0f;
                to_half2(x0, x1, qh[ks][r + 2 * c], ql[ks][r + 2 * c]);
            }
    }

    const int n_tiles = int(n_pad / KT);
    auto load_tile = [&](int i) {
        constexpr int CH = HDP / 8;  // 16-byte chunks per row
        __half* dst = tiles + (i & 1) * 4 * KT * SP;
        const __half* s0 = src + int64_t(i) * KT * HDP;
#pragma unroll 4
        for (int e = tid; e < 4 * KT * CH; e += kThreads) {
            const int p = e / (KT * CH), rem = e - p * (KT * CH), kk = rem / CH, d = (rem - kk * CH) * 8;
            cp_async16v(dst + (p * KT + kk) * SP + d, s0 + p * plane + kk * HDP + d);
        }
        cp_async_commit();
    };

    float o[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    load_tile(0);
    for (int i = 0; i < n_tiles; ++i) {
        if (i + 1 < n_tiles) {
            load_tile(i + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half* kh = tiles + (i & 1) * 4 * KT * SP;
        const __half* kl = kh + KT * SP;
        const __half* vh = kl + KT * SP;
        const __half* vl = vh + KT * SP;
        // S = Q K^T: n-tile j = keys 8j..8j+7; ldmatrix x4 gives the B fragments of j and j + 1.
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const int at = (8 * j + (lane >> 4) * 8 + (lane & 7)) * SP + 16 * ks + ((lane >> 3) & 1) * 8;
                uint32_t b[4], c[4];
                ldsm_x4(b, kh + at);
                ldsm_x4(c, kl + at);
                mma_16816(s[j], qh[ks], b[0], b[1]);
                mma_16816(s[j + 1], qh[ks], b[2], b[3]);
                mma_16816(s[j], ql[ks], b[0], b[1]);
                mma_16816(s[j + 1], ql[ks], b[2], b[3]);
                mma_16816(s[j], qh[ks], c[0], c[1]);
                mma_16816(s[j + 1], qh[ks], c[2], c[3]);
            }
        // Keys past n_tokens (the last tile's padding): c0, c1 are keys 8j + 2t4 + {0, 1} of row g, c2, c3 of g + 8.
        const int64_t key0 = int64_t(i) * KT;
        if (key0 + KT > n) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (key0 + 8 * j + 2 * t4 + (e & 1) >= n) s[j][e] = -INFINITY;
        }
        // Online softmax per row: every tile holds a key (key0 < n), so the new maximum is finite.
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float corr = fast_exp2(m[r] - mx[r]);  // 0 on the first tile (m is -inf)
            m[r] = mx[r];
            l[r] *= corr;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) o[nd][2 * r] *= corr, o[nd][2 * r + 1] *= corr;
        }
        // P as A fragments of the key steps: k-step kk = n-tiles 2kk (a0, a1) and 2kk + 1 (a2, a3).
        uint32_t ph[PK][4], pl[PK][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[e] = fast_exp2(s[j][e] - m[e >> 1]);
                l[e >> 1] += p[e];
            }
            const int kk = j >> 1, hi2 = (j & 1) * 2;
            to_half2(p[0], p[1], ph[kk][hi2], pl[kk][hi2]);
            to_half2(p[2], p[3], ph[kk][hi2 + 1], pl[kk][hi2 + 1]);
        }
        // O += P V: k-step kk = keys 16kk..16kk+15; ldmatrix.trans x4 gives n-tiles nd and nd + 1.
#pragma unroll
        for (int kk = 0; kk < PK; ++kk)
#pragma unroll
            for (int nd = 0; nd < ND; nd += 2) {
                const int at = (16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * SP + 8 * nd + (lane >> 4) * 8;
                uint32_t b[4], c[4];
                ldsm_x4_trans(b, vh + at);
                ldsm_x4_trans(c, vl + at);
                mma_16816(o[nd], ph[kk], b[0], b[1]);
                mma_16816(o[nd + 1], ph[kk], b[2], b[3]);
                mma_16816(o[nd], pl[kk], b[0], b[1]);
                mma_16816(o[nd + 1], pl[kk], b[2], b[3]);
                mma_16816(o[nd], ph[kk], c[0], c[1]);
                mma_16816(o[nd + 1], ph[kk], c[2], c[3]);
            }
        __syncthreads();  // the buffer is refilled two tiles on
    }
    // Row sums over the quad, normalised rows to shared memory (f32, padded), then out.
    float* o_s = reinterpret_cast<float*>(fa_smem);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const float inv = 1.0f / l[r];  // l >= 1: the row's largest weight is exp2(0)
        const int row = warp * 16 + g + 8 * r;
#pragma unroll
        for (int nd = 0; nd < ND; ++nd)
            *reinterpret_cast<float2*>(&o_s[row * OP + 8 * nd + 2 * t4]) =
                make_float2(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
    }
    __syncthreads();
    for (int e = tid; e < kRows * hd; e += kThreads) {
        const int r = e / hd, d = e - r * hd;
        const int64_t t = row0 + r;
        if (t < n) out[t * width + int64_t(h) * hd + d] = o_s[r * OP + d];
    }
}

template <int HDP>
void launch_mma(const float* q, const __half* planes, int64_t n, int64_t n_pad, int n_head, int hd, float qscale,
                float* out, cudaStream_t s) {
    constexpr size_t smem = mma_smem_bytes<HDP>();  // above the 48 KB default from HDP 48 on
    allow_dynamic_smem<attn_full_mma_kernel<HDP>>(smem);
    launch(attn_full_mma_kernel<HDP>, dim3(unsigned(n_head), unsigned(ceil_div(n, kRows))), kThreads, smem, s, q,
           planes, n, n_pad, n_head, hd, qscale, out);
}

}  // namespace

size_t attention_full_scratch_bytes(int64_t n_tokens, int n_head, int head_dim) {
    const int hdp = padded_dim(head_dim);
    return size_t(4) * size_t(n_head) * size_t(padded_keys(n_tokens, hdp)) * size_t(hdp) * sizeof(__half);
}

void attention_full(const float* q, const float* k, const float* v, int64_t n_tokens, int n_head, int head_dim,
                    float scale, float* out, void* scratch, Stream stream) {
    if (n_tokens == 0 || n_head == 0 || head_dim == 0) return;
    CERA_CHECK(head_dim <= kAttnFullMaxHeadDim && ceil_div(n_tokens, kRows) <= 65535,
               "attention_full: head_dim %d (at most %d), %lld tokens", head_dim, kAttnFullMaxHeadDim,
               (long long)n_tokens);
    cudaStream_t s = as_stream(stream);
    const int hdp = padded_dim(head_dim);
    const int64_t n_pad = padded_keys(n_tokens, hdp);
    auto* planes = static_cast<__half*>(scratch);
    const int64_t chunks = int64_t(n_head) * n_pad * (hdp / 8);
    launch(split_kv_kernel, unsigned(ceil_div(chunks, 256)), 256, 0, s, k, v, n_tokens, n_pad, n_head, head_dim, hdp,
           planes);
    const float qscale = scale * 1.4426950408889634f;  // scores in log2 units: exp2 in the kernel
    const __half* p = planes;
    switch (hdp) {
        case 16:
            return launch_mma<16>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 32:
            return launch_mma<32>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 48:
            return launch_mma<48>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 64:
            return launch_mma<64>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 80:
            return launch_mma<80>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 96:
            return launch_mma<96>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        case 112:
            return launch_mma<112>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
        default:
            return launch_mma<128>(q, p, n_tokens, n_pad, n_head, head_dim, qscale, out, s);
    }
}

}  // namespace cera::cuda
