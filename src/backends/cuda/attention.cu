// Causal GQA softmax attention of a batch of queries over the KV cache (F16 or F32).
// Idea: one block per (query head, key split, token). The split's key range is walked in chunks of
// 128 keys, one key per thread for q.k (16-byte loads of the key row), with an online softmax
// (running max and sum); the values are then accumulated by (key group, dimension) threads.
// Decode splits the keys over up to 32 blocks per head (split-K) and a second kernel merges the
// partial (max, sum, output) triples; with one split the block writes the output directly.
// Positions come from device memory, so one recorded graph serves every decode step. The output's
// 8-bit rows for the out-projection GEMV can be written too (whole warps write 32 consecutive dims).
// Roofline: bytes = K + V rows read once per query head (GQA groups re-read through L2);
// 2 KB per position per layer for lfm2-1.2b (8 kv heads x 64 x 2 x f16).
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backends/cuda/common.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 128;

int attn_splits(int64_t n_tokens, int64_t n_ctx) {
    const int64_t by_len = ceil_div(n_ctx, 512);
    const int64_t by_batch = std::max<int64_t>(1, 32 / std::max<int64_t>(1, n_tokens));
    return int(std::max<int64_t>(1, std::min(by_len, by_batch)));
}

__device__ __forceinline__ void load8(const __half* p, float* v) {
    const uint4 a = ld_cached16(p);
    const __half2* h = reinterpret_cast<const __half2*>(&a);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < kThreads / 32 ? red[lane] : -INFINITY;
    return warp_max(v);
}

struct AttnK {
    const float* q;
    const void* k;
    const void* v;
    const int32_t* pos;
    int64_t n_ctx, n_tokens;
    int n_head, n_head_kv, head_dim, n_splits, sliding_window;
    float scale;
    float* out;
    float* partial;
    uint8_t* out_xq;  // quantize_q8 rows of out (row = n_head * head_dim), or null
};

// out[qrow][d] = v, and its 8-bit group when out_xq is set (whole warps cover 32 consecutive d).
__device__ __forceinline__ void write_out(const AttnK& a, int64_t qrow, int d, float v) {
    a.out[qrow * a.head_dim + d] = v;
    if (a.out_xq) {
        const int64_t width = int64_t(a.n_head) * a.head_dim;
        const int64_t t = qrow / a.n_head, e = (qrow % a.n_head) * a.head_dim + d;
        warp_quantize_q8(v, a.out_xq + t * q8_row_bytes(width), width, e >> 5);
    }
}

// Shared memory: q[head_dim], p[128], red[32], acc[128 * 2].
template <class C>
__global__ void __launch_bounds__(kThreads) attn_kernel(const AttnK a) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float sm[];
    const int hd = a.head_dim;
    float* q_s = sm;
    float* p_s = q_s + hd;
    float* red = p_s + kThreads;
    float* acc_s = red + 32;
    const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
    const int64_t t = blockIdx.z;
    const int hk = h / (a.n_head / a.n_head_kv);
    const int64_t kv_width = int64_t(a.n_head_kv) * hd;
    const int64_t p = a.pos[t];
    const int64_t end = min(p + 1, a.n_ctx);
    const int64_t begin = a.sliding_window > 0 ? max(int64_t(0), p + 1 - a.sliding_window) : 0;
    const int64_t len = max(end - begin, int64_t(0));
    const int64_t chunk = (ceil_div(len, a.n_splits) + kThreads - 1) / kThreads * kThreads;
    const int64_t lo = begin + s * chunk, hi = min(end, lo + chunk);
    const int64_t qrow = t * a.n_head + h;
    float* part = a.partial + (qrow * a.n_splits + s) * (hd + 2);
    if (lo >= hi) {
        if (a.n_splits > 1 && tid == 0) part[hd] = -INFINITY, part[hd + 1] = 0.0f;
        if (a.n_splits == 1)
            for (int d = tid; d < hd; d += kThreads) write_out(a, qrow, d, 0.0f);
        return;
    }
    for (int d = tid; d < hd; d += kThreads) q_s[d] = a.q[qrow * hd + d] * a.scale;
    // Value accumulation layout: G key groups x hd dims (hd <= 128), or 1 group with 2 dims per thread.
    const int G = hd <= kThreads ? kThreads / hd : 1;
    const int g = hd <= kThreads ? tid / hd : 0;
    const int d0 = hd <= kThreads ? tid % hd : tid;
    const bool active = g < G && d0 < hd;
    float acc[2] = {0.0f, 0.0f};
    float m = -INFINITY, l = 0.0f;
    const C* kc = static_cast<const C*>(a.k) + int64_t(hk) * hd;
    const C* vc = static_cast<const C*>(a.v) + int64_t(hk) * hd;
    __syncthreads();
    for (int64_t c = lo; c < hi; c += kThreads) {
        const int64_t j = c + tid;
        float score = -INFINITY;
        if (j < hi) {
            const C* kr = kc + j * kv_width;
            float sacc = 0.0f;
            for (int d = 0; d < hd; d += 8) {
                float kv[8];
                load8(kr + d, kv);
#pragma unroll
                for (int e = 0; e < 8; ++e) sacc = fmaf(q_s[d + e], kv[e], sacc);
            }
            score = sacc;
        }
        const float m_new = fmaxf(m, block_max(score, red));
        const float pj = j < hi ? __expf(score - m_new) : 0.0f;
        p_s[tid] = pj;
        const float csum = block_sum(pj, red);  // its barriers also publish p_s
        const float corr = __expf(m - m_new);
        l = l * corr + csum;
        acc[0] *= corr, acc[1] *= corr;
        m = m_new;
        const int n_keys = int(min(int64_t(kThreads), hi - c));
        if (active) {
            for (int jj = g; jj < n_keys; jj += G) {
                const C* vr = vc + (c + jj) * kv_width;
                const float pv = p_s[jj];
                acc[0] = fmaf(pv, to_float(vr[d0]), acc[0]);
                if (d0 + kThreads < hd) acc[1] = fmaf(pv, to_float(vr[d0 + kThreads]), acc[1]);
            }
        }
        __syncthreads();  // p_s is rewritten by the next chunk
    }
    // Sum the key groups.
    if (active) acc_s[g * hd + d0] = acc[0];
    __syncthreads();
    if (g == 0 && active) {
        float o0 = 0.0f;
        for (int gg = 0; gg < G; ++gg) o0 += acc_s[gg * hd + d0];
        if (a.n_splits == 1) {
            const float inv = 1.0f / l;
            write_out(a, qrow, d0, o0 * inv);  // out_xq only with head_dim <= 128: no second half
            if (d0 + kThreads < hd) a.out[qrow * hd + d0 + kThreads] = acc[1] * inv;
        } else {
            part[d0] = o0;
            if (d0 + kThreads < hd) part[d0 + kThreads] = acc[1];
            if (tid == 0) part[hd] = m, part[hd + 1] = l;
        }
    }
}

// Batches (prefill): a block owns QT consecutive queries of one head and walks the union of their key
// ranges in tiles of KT keys staged (as f32) in shared memory, so each K/V row is read once per
// query tile instead of once per query. Thread (query qi = tid / 8, lane kl = tid % 8) scores keys
// kl, kl + 8, ... of a tile and accumulates the output's float4 chunks kl, kl + 8, ...; the 8 lanes
// of a query sit in one warp (online softmax by shuffles). Shared rows are padded by 4 floats so the
// 8 lanes' float4 reads of 8 different K rows hit 32 different banks. HD = head_dim (64 or 128).
constexpr int kQT = 16, kKT = 32;

template <class C, int HD>
__global__ void __launch_bounds__(kThreads) attn_tile_kernel(const AttnK a) {
    pdl_trigger();
    pdl_wait();
    constexpr int HP = HD + 4;
    __shared__ __align__(16) float q_s[kQT][HP];
    __shared__ __align__(16) float k_s[kKT][HP];
    __shared__ __align__(16) float v_s[kKT][HD];
    __shared__ float p_s[kQT][kKT + 1];
    const int tid = threadIdx.x, qi = tid >> 3, kl = tid & 7;
    const int h = blockIdx.x;
    const int64_t t0 = int64_t(blockIdx.y) * kQT, n_tokens = a.n_tokens;
    const int hk = h / (a.n_head / a.n_head_kv);
    const int64_t kv_width = int64_t(a.n_head_kv) * HD;
    // Key range of every query of the tile, and their union.
    int64_t lo_b = INT64_MAX, hi_b = 0, my_lo = 0, my_hi = 0;
    for (int j = 0; j < kQT; ++j) {
        const int64_t t = t0 + j;
        if (t >= n_tokens) break;
        const int64_t p = a.pos[t];
        const int64_t end = min(p + 1, a.n_ctx);
        const int64_t begin = a.sliding_window > 0 ? max(int64_t(0), p + 1 - a.sliding_window) : 0;
        if (j == qi) my_lo = begin, my_hi = end;
        if (begin < end) lo_b = min(lo_b, begin), hi_b = max(hi_b, end);
    }
    const bool q_live = t0 + qi < n_tokens;
    for (int i = tid; i < kQT * HD; i += kThreads) {
        const int r = i / HD, d = i % HD;
        q_s[r][d] = t0 + r < n_tokens ? a.q[((t0 + r) * a.n_head + h) * HD + d] * a.scale : 0.0f;
    }
    constexpr int NC = HD / 32;  // float4 chunks of the output per thread
    float4 acc[NC];
#pragma unroll
    for (int i = 0; i < NC; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m = -INFINITY, l = 0.0f;
    const C* kc = static_cast<const C*>(a.k) + int64_t(hk) * HD;
    const C* vc = static_cast<const C*>(a.v) + int64_t(hk) * HD;
    for (int64_t c = lo_b; c < hi_b; c += kKT) {
        __syncthreads();  // q_s written / the previous tile consumed
        for (int i = tid; i < kKT * HD / 8; i += kThreads) {
            const int kk = i / (HD / 8), d = (i % (HD / 8)) * 8;
            float kv[8], vv[8];
            if (c + kk < hi_b) {
                load8(kc + (c + kk) * kv_width + d, kv);
                load8(vc + (c + kk) * kv_width + d, vv);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) kv[e] = 0.0f, vv[e] = 0.0f;
            }
            *reinterpret_cast<float4*>(&k_s[kk][d]) = make_float4(kv[0], kv[1], kv[2], kv[3]);
            *reinterpret_cast<float4*>(&k_s[kk][d + 4]) = make_float4(kv[4], kv[5], kv[6], kv[7]);
            *reinterpret_cast<float4*>(&v_s[kk][d]) = make_float4(vv[0], vv[1], vv[2], vv[3]);
            *reinterpret_cast<float4*>(&v_s[kk][d + 4]) = make_float4(vv[4], vv[5], vv[6], vv[7]);
        }
        __syncthreads();
        constexpr int NK = kKT / 8;
        float sc[NK];
#pragma unroll
        for (int j = 0; j < NK; ++j) sc[j] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HD; d += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(&q_s[qi][d]);
#pragma unroll
            for (int j = 0; j < NK; ++j) {
                const float4 kv = *reinterpret_cast<const float4*>(&k_s[kl + 8 * j][d]);
                sc[j] = fmaf(qv.x, kv.x, sc[j]);
                sc[j] = fmaf(qv.y, kv.y, sc[j]);
                sc[j] = fmaf(qv.z, kv.z, sc[j]);
                sc[j] = fmaf(qv.w, kv.w, sc[j]);
            }
        }
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < NK; ++j) {
            const int64_t key = c + kl + 8 * j;
            if (!(q_live && key >= my_lo && key < my_hi)) sc[j] = -INFINITY;
            mt = fmaxf(mt, sc[j]);
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
        const float m_new = fmaxf(m, mt);
        const float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
        float ps = 0.0f;
#pragma unroll
        for (int j = 0; j < NK; ++j) {
            const float pj = sc[j] == -INFINITY ? 0.0f : __expf(sc[j] - m_new);
            p_s[qi][kl + 8 * j] = pj;
            ps += pj;
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * corr + ps;
        m = m_new;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < NC; ++i) acc[i].x *= corr, acc[i].y *= corr, acc[i].z *= corr, acc[i].w *= corr;
#pragma unroll 4
        for (int kk = 0; kk < kKT; ++kk) {
            const float pv = p_s[qi][kk];
#pragma unroll
            for (int i = 0; i < NC; ++i) {
                const float4 v = *reinterpret_cast<const float4*>(&v_s[kk][4 * (kl + 8 * i)]);
                acc[i].x = fmaf(pv, v.x, acc[i].x);
                acc[i].y = fmaf(pv, v.y, acc[i].y);
                acc[i].z = fmaf(pv, v.z, acc[i].z);
                acc[i].w = fmaf(pv, v.w, acc[i].w);
            }
        }
    }
    // Normalised rows through shared memory, then whole warps write 32 consecutive dims (8-bit rows).
    __syncthreads();
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < NC; ++i)  // kQT <= kKT rows
        *reinterpret_cast<float4*>(&k_s[qi][4 * (kl + 8 * i)]) =
            make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    for (int ch = warp; ch < kQT * (HD / 32); ch += kThreads / 32) {
        const int r = ch / (HD / 32), d = (ch % (HD / 32)) * 32 + lane;
        if (t0 + r < n_tokens) write_out(a, (t0 + r) * a.n_head + h, d, k_s[r][d]);
    }
}

// Merges the splits of one (token, head): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void attn_combine_kernel(const AttnK a) {
    pdl_trigger();
    pdl_wait();
    const float* __restrict__ partial = a.partial;
    const int n_head = a.n_head, hd = a.head_dim, n_splits = a.n_splits;
    const int64_t qrow = int64_t(blockIdx.y) * n_head + blockIdx.x;
    const float* part = partial + qrow * n_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; ++s) M = fmaxf(M, part[s * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
        const float* ps = part + s * (hd + 2);
        if (ps[hd + 1] > 0.0f) L += ps[hd + 1] * __expf(ps[hd] - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; ++s) {
            const float* ps = part + s * (hd + 2);
            if (ps[hd + 1] > 0.0f) o += ps[d] * __expf(ps[hd] - M);
        }
        write_out(a, qrow, d, L > 0.0f ? o / L : 0.0f);
    }
}

}  // namespace

size_t attention_scratch_floats(int64_t n_tokens, int64_t n_ctx, int n_head, int head_dim) {
    const int n_splits = attn_splits(n_tokens, n_ctx);
    return n_splits > 1 ? size_t(n_tokens) * n_head * n_splits * (head_dim + 2) : 0;
}

void attention(const AttentionArgs& a, Stream stream) {
    if (a.n_tokens == 0) return;
    CERA_CHECK(a.head_dim % 8 == 0 && a.head_dim <= 2 * kThreads && a.n_head % a.n_head_kv == 0,
               "attention: head_dim %d (needs a multiple of 8, <= 256), n_head %d, n_head_kv %d", a.head_dim,
               a.n_head, a.n_head_kv);
    AttnK k{};
    k.q = a.q, k.k = a.k_cache, k.v = a.v_cache, k.pos = a.pos, k.n_ctx = a.n_ctx, k.n_tokens = a.n_tokens;
    k.n_head = a.n_head, k.n_head_kv = a.n_head_kv, k.head_dim = a.head_dim;
    k.n_splits = attn_splits(a.n_tokens, a.n_ctx);
    k.sliding_window = a.sliding_window, k.scale = a.scale, k.out = a.out, k.partial = a.partial;
    CERA_CHECK(!a.out_xq || (a.head_dim % 32 == 0 && a.head_dim <= kThreads), "attention: 8-bit output rows need "
               "head_dim %% 32 == 0 and <= %d", kThreads);
    k.out_xq = static_cast<uint8_t*>(a.out_xq);
    CERA_CHECK(k.n_splits == 1 || a.partial != nullptr);
    const dim3 grid(unsigned(a.n_head), unsigned(k.n_splits), unsigned(a.n_tokens));
    const size_t smem = sizeof(float) * (a.head_dim + kThreads + 32 + 2 * kThreads);
    cudaStream_t s = as_stream(stream);
    static const bool tiles = [] {
        const char* e = std::getenv("CERA_CUDA_ATTN_TILES");  // 0: the per-query kernel for batches too
        return !(e && e[0] == '0');
    }();
    if (tiles && k.n_splits == 1 && a.n_tokens >= kQT && (a.head_dim == 64 || a.head_dim == 128)) {
        const dim3 tg(unsigned(a.n_head), unsigned(ceil_div(a.n_tokens, kQT)));
        if (a.head_dim == 64) {
            if (a.f16) launch((attn_tile_kernel<__half, 64>), tg, kThreads, 0, s, k);
            else launch((attn_tile_kernel<float, 64>), tg, kThreads, 0, s, k);
        } else {
            if (a.f16) launch((attn_tile_kernel<__half, 128>), tg, kThreads, 0, s, k);
            else launch((attn_tile_kernel<float, 128>), tg, kThreads, 0, s, k);
        }
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (a.f16) launch((attn_kernel<__half>), grid, kThreads, smem, s, k);
    else launch((attn_kernel<float>), grid, kThreads, smem, s, k);
    CUDA_CHECK_LAUNCH();
    if (k.n_splits > 1) {
        launch(attn_combine_kernel, dim3(unsigned(a.n_head), unsigned(a.n_tokens)), 64, 0, s, k);
        CUDA_CHECK_LAUNCH();
    }
}

}  // namespace cera::cuda
