// Prefill attention on tensor cores: flash attention with head_dim 64 or 128 (attention.cu picks it
// for batches of at least 16 queries) over a cache of any codec but F32. An F16 cache's tiles are
// copied as they are; the other codecs' (BF16, Q8_0, Q4_0) are decoded into f16 tiles as they are
// loaded, so the MMAs read the same f16 operands. That rounds a decoded Q8_0 / Q4_0 value (a scale
// times a small integer) to f16, 2^-12 relative at most: a sixteenth of Q8_0's own step.
// Prefill is bound by the math (Q K^T and P V, plus exp), not bytes: 4 * head_dim FLOPs per (query
// head, visible key), against the H200's ~990 TFLOP/s of dense f16; the split f16 operands (below)
// double the MMAs for f32-grade sums.
#include <cstdint>

#include "backends/cuda/attention_shared.cuh"
#include "backends/cuda/mma_f16.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 128;
using AttnK = DecodeAttnArgs;

// Prefill on tensor cores (head_dim 64 or 128): flash attention with mma.sync m16n8k16
// (f16 inputs, f32 accumulate). A block owns 64 rows of (query, head of the GQA group) pairs: the
// rows t * G + g of kv head hk are query t, head hk * G + g, so with G = 4 a block is 16 queries x
// the group's 4 heads and each staged K/V tile serves all of them. 4 warps x 16 rows; K/V tiles of
// 64 keys walk the union of the rows' key ranges through two cp.async buffers (rows padded by 16
// bytes so ldmatrix reads 8 rows on distinct banks). S = Q K^T (Q pre-scaled by scale * log2 e,
// fragments held in registers), the mask per (row position, key), online softmax in registers (row
// max over a quad by shuffles; the row sum is kept per lane and reduced once at the end), P packed
// to f16 A fragments, O += P V (V by ldmatrix.trans). A warp skips tiles outside its rows' ranges.
// Q and P are each sent as f16 hi + f16 lo (two MMAs per product, ~22-bit operands), so the result
// matches the f32 kernels to ~1e-6 (one MMA per product would leave ~1e-3 relative error).
// The normalised rows go through shared memory so whole warps write 32 consecutive dims (8-bit rows).
constexpr int kFaKeys = 64;

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(__half* dst, const __half* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

// 8 floats as 8 halves (16 bytes).
__device__ __forceinline__ uint4 halves8(const float* v) {
    uint4 r;
    uint32_t* w = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    return r;
}

template <int HD>
constexpr size_t mma_smem_bytes() {
    return size_t(2) * 2 * kFaKeys * (HD + 8) * sizeof(__half);  // K and V, two buffers each
}

template <class K, int HD>
__global__ void __launch_bounds__(kThreads) attn_mma_kernel(const AttnK a) {
    pdl_trigger();
    pdl_wait();
    constexpr int SP = HD + 8;  // shared row stride in halves
    constexpr int KS = HD / 16;  // k-steps of Q K^T
    constexpr int ND = HD / 8;   // n-tiles of the output
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __shared__ int red[4][4];
    __half* k_s = reinterpret_cast<__half*>(fa_smem);  // [2][kFaKeys][SP]
    __half* v_s = k_s + 2 * kFaKeys * SP;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int hk = blockIdx.x, G = a.n_head / a.n_head_kv;
    const int64_t n_rows = a.n_tokens * G;
    const int64_t row0 = (int64_t(gridDim.y) - 1 - blockIdx.y) * kFaRows;  // the longest rows first
    const int64_t row_bytes = kv_row_bytes(K::kCodec, int64_t(a.n_head_kv) * HD);
    const unsigned char* kc = static_cast<const unsigned char*>(a.k) + kv_row_bytes(K::kCodec, int64_t(hk) * HD);
    const unsigned char* vc = static_cast<const unsigned char*>(a.v) + kv_row_bytes(K::kCodec, int64_t(hk) * HD);

    // This lane's rows (g and g + 8 of the warp's 16): key ranges [lo, hi) (empty: lo = INT_MAX, hi = 0)
    // and Q fragments (A operand: a0 = (g, 2t4..), a1 = (g + 8, 2t4..), a2/a3 the same at k + 8).
    int lo[2], hi[2];
    uint32_t qh[KS][4], ql[KS][4];
    const float qscale = a.scale * 1.4426950408889634f;  // scores in log2 units: exp2 below
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t R = row0 + warp * 16 + g + 8 * r;
        lo[r] = INT_MAX, hi[r] = 0;
        const float* qr = nullptr;
        if (R < n_rows) {
            const int64_t t = R / G;
            int64_t begin, end;
            attn_key_range(a.pos[t], a.n_ctx, a.sliding_window, begin, end);
            if (begin < end) lo[r] = int(begin), hi[r] = int(end);
            qr = a.q + (t * a.n_head + int64_t(hk) * G + R % G) * HD;
        }
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float2 v = make_float2(0.0f, 0.0f);
                if (qr) v = *reinterpret_cast<const float2*>(qr + 16 * ks + 8 * c + 2 * t4);
                to_half2(v.x * qscale, v.y * qscale, qh[ks][r + 2 * c], ql[ks][r + 2 * c]);
            }
    }
    // Warp ranges (union, and intersection for the unmasked fast path), then the block's union.
    int wlo = min(lo[0], lo[1]), whi = max(hi[0], hi[1]);
    int wlo_all = max(lo[0], lo[1]), whi_all = min(hi[0], hi[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
        wlo_all = max(wlo_all, __shfl_xor_sync(0xffffffffu, wlo_all, o));
        whi_all = min(whi_all, __shfl_xor_sync(0xffffffffu, whi_all, o));
    }
    if (lane == 0) red[0][warp] = wlo, red[1][warp] = whi;
    __syncthreads();
    int lo_b = INT_MAX, hi_b = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) lo_b = min(lo_b, red[0][w]), hi_b = max(hi_b, red[1][w]);
    const int n_tiles = lo_b < hi_b ? (hi_b - lo_b + kFaKeys - 1) / kFaKeys : 0;

    auto load_tile = [&](int i) {
        const int c = lo_b + i * kFaKeys, buf = i & 1;
        constexpr int CH = HD / 8;  // 16-byte chunks per row
#pragma unroll
        for (int e = tid; e < kFaKeys * CH; e += kThreads) {
            const int kk = e / CH, d = (e % CH) * 8, key = c + kk;
            const bool ok = key < hi_b;
            const int64_t off = ok ? kv_row(a, 0, key) * row_bytes : 0;  // one sequence a launch
            __half* kd = k_s + (buf * kFaKeys + kk) * SP + d;
            __half* vd = v_s + (buf * kFaKeys + kk) * SP + d;
            if constexpr (std::is_same_v<K, KvF16>) {
                cp_async16(kd, reinterpret_cast<const __half*>(kc + off) + d, ok);
                cp_async16(vd, reinterpret_cast<const __half*>(vc + off) + d, ok);
            } else {  // the previous reader of this buffer passed the loop's last barrier
                float kv[8] = {}, vv[8] = {};
                if (ok) kv_load8<K>(kc + off, d, kv), kv_load8<K>(vc + off, d, vv);
                *reinterpret_cast<uint4*>(kd) = halves8(kv);
                *reinterpret_cast<uint4*>(vd) = halves8(vv);
            }
        }
        cp_async_commit();
    };

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    if (n_tiles > 0) load_tile(0);
    for (int i = 0; i < n_tiles; ++i) {
        if (i + 1 < n_tiles) {
            load_tile(i + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int c = lo_b + i * kFaKeys;
        if (c < whi && c + kFaKeys > wlo) {  // warp-uniform
            const __half* kb = k_s + (i & 1) * kFaKeys * SP;
            const __half* vb = v_s + (i & 1) * kFaKeys * SP;
            // S = Q K^T: n-tile j = keys 8j..8j+7; ldmatrix x4 gives the B fragments of j and j + 1.
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    uint32_t b[4];
                    ldsm_x4(b, kb + (8 * j + (lane >> 4) * 8 + (lane & 7)) * SP + 16 * ks + ((lane >> 3) & 1) * 8);
                    mma_16816(s[j], qh[ks], b[0], b[1]);
                    mma_16816(s[j + 1], qh[ks], b[2], b[3]);
                    mma_16816(s[j], ql[ks], b[0], b[1]);
                    mma_16816(s[j + 1], ql[ks], b[2], b[3]);
                }
            // Mask (c0, c1: row g, keys 8j + 2t4 + {0, 1}; c2, c3: row g + 8), unless every row sees the tile.
            if (!(c >= wlo_all && c + kFaKeys <= whi_all)) {
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = c + 8 * j + 2 * t4 + (e & 1), r = e >> 1;
                        if (!(key >= lo[r] && key < hi[r])) s[j][e] = -INFINITY;
                    }
            }
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            float base[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
                const float corr = fast_exp2(m[r] - base[r]);  // 0 while the row had nothing
                m[r] = mx[r];
                l[r] *= corr;
#pragma unroll
                for (int n = 0; n < ND; ++n) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
            }
            // P as A fragments of the 4 key steps: k-step kk = n-tiles 2kk (a0, a1) and 2kk + 1 (a2, a3).
            uint32_t ph[4][4], pl[4][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[e] = fast_exp2(s[j][e] - base[e >> 1]);
                    l[e >> 1] += p[e];
                }
                const int kk = j >> 1, hi2 = (j & 1) * 2;
                to_half2(p[0], p[1], ph[kk][hi2], pl[kk][hi2]);
                to_half2(p[2], p[3], ph[kk][hi2 + 1], pl[kk][hi2 + 1]);
            }
            // O += P V: k-step kk = keys 16kk..16kk+15; ldmatrix.trans x4 gives n-tiles n and n + 1.
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int n = 0; n < ND; n += 2) {
                    uint32_t b[4];
                    ldsm_x4_trans(b, vb + (16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * SP + 8 * n + (lane >> 4) * 8);
                    mma_16816(o[n], ph[kk], b[0], b[1]);
                    mma_16816(o[n + 1], ph[kk], b[2], b[3]);
                    mma_16816(o[n], pl[kk], b[0], b[1]);
                    mma_16816(o[n + 1], pl[kk], b[2], b[3]);
                }
        }
        __syncthreads();  // the buffer is refilled two tiles on
    }
    // Row sums over the quad, normalised rows to shared memory (f32, padded), then out (+ 8-bit rows).
    constexpr int OP = HD + 4;
    float* o_s = reinterpret_cast<float*>(fa_smem);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        const int row = warp * 16 + g + 8 * r;
#pragma unroll
        for (int n = 0; n < ND; ++n)
            *reinterpret_cast<float2*>(&o_s[row * OP + 8 * n + 2 * t4]) =
                make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    __syncthreads();
    for (int ch = warp; ch < kFaRows * (HD / 32); ch += kThreads / 32) {
        const int r = ch / (HD / 32), d = (ch % (HD / 32)) * 32 + lane;
        const int64_t R = row0 + r;
        if (R < n_rows) write_out(a, (R / G) * a.n_head + int64_t(hk) * G + R % G, d, o_s[r * OP + d]);
    }
}

template <class K, int HD>
void launch_mma(dim3 grid, cudaStream_t s, const AttnK& k) {
    constexpr size_t smem = mma_smem_bytes<HD>();  // head_dim 128: above the default limit
    allow_dynamic_smem<attn_mma_kernel<K, HD>>(smem);
    launch(attn_mma_kernel<K, HD>, grid, kThreads, smem, s, k);
}

}  // namespace

void attention_prefill_mma(const DecodeAttnArgs& k, KvCodec codec, dim3 grid, cudaStream_t s) {
    CERA_CHECK(codec != KvCodec::kF32, "attention_prefill_mma: an F32 cache takes the f32 tiles");
    with_kv_codec(codec, [&](auto c) {
        using K = decltype(c);
        if constexpr (!std::is_same_v<K, KvF32>) {
            if (k.head_dim == 64) launch_mma<K, 64>(grid, s, k);
            else launch_mma<K, 128>(grid, s, k);
        }
    });
}

}  // namespace cera::cuda
