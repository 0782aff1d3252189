// Causal GQA softmax attention of a batch of queries over the KV cache, in any of its codecs (F32,
// F16, BF16, Q8_0, Q4_0: kv_codec.cuh), read where the kernels load K and V: no dequantized copy.
// Idea: one block per (query head, key split, token). The split's key range is walked in chunks of
// 128 keys, one key per thread for q.k (8 values a load of the key row), with an online softmax
// (running max and sum); the values are then accumulated by (key group, dimension) threads.
// Decode splits the keys over up to 32 blocks per head (split-K) and a second kernel merges the
// partial (max, sum, output) triples; with one split the block writes the output directly.
// Positions come from device memory, so one recorded graph serves every decode step. The output's
// 8-bit rows for the out-projection GEMV can be written too (whole warps write 32 consecutive dims).
// Batches of >= 16 queries (prefill) with head_dim 64 / 128: a flash-attention kernel on tensor cores
// (mma.sync m16n8k16; K/V tiles shared by the heads of a GQA group; see attention_mma.cu), or on an
// F32 cache a tiled f32 kernel. Prefill is bound by the math (Q K^T and P V, plus exp),
// not bytes: 4 * head_dim FLOPs per (query head, visible key); the H200's dense f16 is ~990 TFLOP/s.
// Roofline: bytes = K + V rows read once per query head (GQA groups re-read through L2);
// 2 KB per position per layer for lfm2-1.2b (8 kv heads x 64 x 2 x f16).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "backends/cuda/attention_shared.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 128;

int attn_splits(int64_t n_tokens, int64_t n_ctx) {
    const int64_t by_len = ceil_div(n_ctx, 512);
    const int64_t by_batch = std::max<int64_t>(1, 32 / std::max<int64_t>(1, n_tokens));
    return int(std::max<int64_t>(1, std::min(by_len, by_batch)));
}

__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < kThreads / 32 ? red[lane] : -INFINITY;
    return warp_max(v);
}

using AttnK = DecodeAttnArgs;


// Shared memory: q[head_dim], p[128], red[32], acc[128 * 2]. Keys of codec K, values of codec V.
template <class K, class V>
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
    int64_t begin, end;
    attn_key_range(a.pos[t], a.n_ctx, a.sliding_window, begin, end);
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
    const int64_t k_bytes = kv_row_bytes(K::kCodec, kv_width), v_bytes = kv_row_bytes(V::kCodec, kv_width);
    const unsigned char* kc = static_cast<const unsigned char*>(a.k) + kv_row_bytes(K::kCodec, int64_t(hk) * hd);
    const unsigned char* vc = static_cast<const unsigned char*>(a.v) + kv_row_bytes(V::kCodec, int64_t(hk) * hd);
    __syncthreads();
    for (int64_t c = lo; c < hi; c += kThreads) {
        const int64_t j = c + tid;
        float score = -INFINITY;
        if (j < hi) {
            const unsigned char* kr = kc + kv_row(a, t, j) * k_bytes;
            float sacc = 0.0f;
            for (int d = 0; d < hd; d += 8) {
                float kv[8];
                kv_load8<K>(kr, d, kv);
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
                const unsigned char* vr = vc + kv_row(a, t, c + jj) * v_bytes;
                const float pv = p_s[jj];
                acc[0] = fmaf(pv, kv_load1<V>(vr, d0), acc[0]);
                if (d0 + kThreads < hd) acc[1] = fmaf(pv, kv_load1<V>(vr, d0 + kThreads), acc[1]);
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

// Batches (prefill) on an F32 cache (the other codecs take the tensor cores, attention_mma.cu): a block
// owns QT consecutive queries of one head and walks the union of their key ranges in tiles of KT keys
// staged in shared memory, so each K/V row is read once per
// query tile instead of once per query. Thread (query qi = tid / 8, lane kl = tid % 8) scores keys
// kl, kl + 8, ... of a tile and accumulates the output's float4 chunks kl, kl + 8, ...; the 8 lanes
// of a query sit in one warp (online softmax by shuffles). Shared rows are padded by 4 floats so the
// 8 lanes' float4 reads of 8 different K rows hit 32 different banks. HD = head_dim (64 or 128).
constexpr int kQT = 16, kKT = 32;

template <int HD>
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
        int64_t begin, end;
        attn_key_range(a.pos[t], a.n_ctx, a.sliding_window, begin, end);
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
    const float* kc = static_cast<const float*>(a.k) + int64_t(hk) * HD;
    const float* vc = static_cast<const float*>(a.v) + int64_t(hk) * HD;
    for (int64_t c = lo_b; c < hi_b; c += kKT) {
        __syncthreads();  // q_s written / the previous tile consumed
        for (int i = tid; i < kKT * HD / 8; i += kThreads) {
            const int kk = i / (HD / 8), d = (i % (HD / 8)) * 8;
            float kv[8], vv[8];
            if (c + kk < hi_b) {
                const int64_t row = kv_row(a, t0, c + kk);
                load8(kc + row * kv_width + d, kv);
                load8(vc + row * kv_width + d, vv);
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

// Decode (up to kDecMaxTokens queries of one sequence): one block per (kv head, split, token) serves
// the G query heads of its GQA group, so each K/V row is read once per group. Keys are taken in
// chunks of kc rows (kc from the shared memory budget, <= 256), split s walking chunks s, s + S, ...;
// a chunk's K and V rows are copied to shared memory with cp.async, and the rows below the step's
// smallest position (written by earlier steps, complete before this step's first kernel) are
// requested before the PDL wait, so for short contexts the whole key range is in flight while the
// kernels before this one run; only q and the rows of this step's tokens are read after it. Then:
// scores (one key per thread, its K row against the G queries), a per-head softmax by one warp
// (online across chunks), and P V with a thread per (head, dim pair). With one active split the block
// writes the output; otherwise each split writes (m, l, o) and the last split to finish (an atomic
// counter per (token, kv head), reset by that block) merges them: no second launch.
constexpr int kDecMaxTokens = 8;
constexpr int kDecMaxItems = 8;  // (head, dim pair) items per thread: G * head_dim <= 2 * 128 * 8
constexpr int kDecSmem = 96 * 1024;
constexpr int64_t kCounterFloats = kDecodeCounterFloats;

struct DecPlan {
    bool ok = false;
    int kc = 0, splits = 1;
    size_t smem = 0;
};

// Shared memory: K rows (stride hd + 16 bytes: 16-byte reads of 8 different rows hit distinct banks),
// V rows, q [G][hd] (pre-scaled), p [G][kc], m / l / corr [3][G]. Keys of codec K, values of codec V.
template <class K, class V>
__global__ void __launch_bounds__(kThreads) attn_dec_kernel(const AttnK a) {
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char dsm[];
    const int hk = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.z;
    const int hd = a.head_dim, G = a.n_head / a.n_head_kv, kc = a.kc, S = a.n_splits;
    const KvRows<K, V> rows(hd);
    const int krow = rows.krow, vrow = rows.vrow;
    unsigned char* k_s = dsm;
    unsigned char* v_s = k_s + size_t(kc) * krow;
    float* q_s = reinterpret_cast<float*>(v_s + size_t(kc) * vrow);
    float* p_s = q_s + G * hd;
    float* st_s = p_s + G * kc;  // m [G], l [G], corr [G]
    const int64_t k_bytes = kv_row_bytes(K::kCodec, int64_t(a.n_head_kv) * hd),
                  v_bytes = kv_row_bytes(V::kCodec, int64_t(a.n_head_kv) * hd);
    const unsigned char* kg = static_cast<const unsigned char*>(a.k) + kv_row_bytes(K::kCodec, int64_t(hk) * hd);
    const unsigned char* vg = static_cast<const unsigned char*>(a.v) + kv_row_bytes(V::kCodec, int64_t(hk) * hd);

    // Positions are step inputs written by the host: everything up to the copies comes before the wait.
    int64_t begin, end;
    attn_key_range(a.pos[t], a.n_ctx, a.sliding_window, begin, end);
    const int64_t len = max(end - begin, int64_t(0));
    const int64_t n_chunks = ceil_div(len, kc);
    const int n_act = int(min(int64_t(S), n_chunks));
    if (s > 0 && s >= n_act) return;  // block (hk, 0, t) always runs (and waits)
    const int64_t safe = rows_written_before(a, t);  // rows below it are not written by this step
    auto copy_rows = [&](int64_t lo, int n, int64_t from, int64_t to) {
        for (int i = tid; i < n * rows.pieces; i += kThreads) {
            const int r = i / rows.pieces, c = i - r * rows.pieces;
            const int64_t j = lo + r;
            if (j < from || j >= to) continue;
            const int64_t row = kv_row(a, t, j);
            rows.copy_k(k_s + r * krow, kg + row * k_bytes, c);
            rows.copy_v(v_s + r * vrow, vg + row * v_bytes, c);
        }
        cp_async_commit();
    };
    int64_t c = s, lo = begin + c * kc;
    int n = int(min(int64_t(kc), end - lo));
    if (len > 0) copy_rows(lo, n, lo, min(safe, lo + n));
    pdl_wait();
    const int64_t qrow0 = t * a.n_head + int64_t(hk) * G;
    if (len == 0) {
        for (int e = tid; e < G * hd; e += kThreads) write_out(a, qrow0 + e / hd, e % hd, 0.0f);
        return;
    }
    copy_rows(lo, n, max(safe, lo), lo + n);
    for (int i = tid; i < G * hd; i += kThreads) q_s[i] = a.q[qrow0 * hd + i] * a.scale;
    for (int g = tid; g < G; g += kThreads) st_s[g] = -INFINITY, st_s[G + g] = 0.0f;
    const int half = hd / 2, n_items = G * half;
    float2 o[kDecMaxItems];
#pragma unroll
    for (int r = 0; r < kDecMaxItems; ++r) o[r] = make_float2(0.0f, 0.0f);
    for (;;) {
        cp_async_wait<0>();
        __syncthreads();
        // Scores: key j of the chunk against the G queries, up to 8 heads per pass.
        for (int j = tid; j < n; j += kThreads) {
            const unsigned char* kr = k_s + j * krow;
            for (int g0 = 0; g0 < G; g0 += 8) {
                float acc[8];
#pragma unroll
                for (int gi = 0; gi < 8; ++gi) acc[gi] = 0.0f;
                for (int d = 0; d < hd; d += 8) {
                    float kv[8];
                    kv_load8<K>(kr, d, kv);
#pragma unroll
                    for (int gi = 0; gi < 8; ++gi) {
                        if (g0 + gi >= G) break;
                        const float4* qq = reinterpret_cast<const float4*>(q_s + (g0 + gi) * hd + d);
                        const float4 x0 = qq[0], x1 = qq[1];
                        float sacc = acc[gi];
                        sacc = fmaf(x0.x, kv[0], sacc);
                        sacc = fmaf(x0.y, kv[1], sacc);
                        sacc = fmaf(x0.z, kv[2], sacc);
                        sacc = fmaf(x0.w, kv[3], sacc);
                        sacc = fmaf(x1.x, kv[4], sacc);
                        sacc = fmaf(x1.y, kv[5], sacc);
                        sacc = fmaf(x1.z, kv[6], sacc);
                        sacc = fmaf(x1.w, kv[7], sacc);
                        acc[gi] = sacc;
                    }
                }
#pragma unroll
                for (int gi = 0; gi < 8; ++gi)
                    if (g0 + gi < G) p_s[(g0 + gi) * kc + j] = acc[gi];
            }
        }
        __syncthreads();
        // Softmax of each head over the chunk, merged into its running max and sum.
        for (int g = warp; g < G; g += kThreads / 32) {
            float* pg = p_s + g * kc;
            float mx = -INFINITY;
            for (int j = lane; j < n; j += 32) mx = fmaxf(mx, pg[j]);
            mx = warp_max(mx);
            const float m_old = st_s[g], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int j = lane; j < n; j += 32) {
                const float e = __expf(pg[j] - m_new);
                pg[j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                st_s[G + g] = st_s[G + g] * corr + sum;
                st_s[g] = m_new;
                st_s[2 * G + g] = corr;
            }
        }
        __syncthreads();
        // o[g][2 dp .. 2 dp + 1] = corr * o + sum_j p[g][j] V[j][2 dp ..]
#pragma unroll
        for (int r = 0; r < kDecMaxItems; ++r) {
            const int i = tid + r * kThreads;
            if (i >= n_items) break;
            const int g = i / half, dp = i - g * half;
            const float corr = st_s[2 * G + g];
            const float* pg = p_s + g * kc;
            float2 a0 = make_float2(o[r].x * corr, o[r].y * corr), a1 = make_float2(0.0f, 0.0f);
            int j = 0;
            for (; j + 1 < n; j += 2) {
                const float2 v0 = kv_load2<V>(v_s + j * vrow, 2 * dp);
                const float2 v1 = kv_load2<V>(v_s + (j + 1) * vrow, 2 * dp);
                const float p0 = pg[j], p1 = pg[j + 1];
                a0.x = fmaf(p0, v0.x, a0.x), a0.y = fmaf(p0, v0.y, a0.y);
                a1.x = fmaf(p1, v1.x, a1.x), a1.y = fmaf(p1, v1.y, a1.y);
            }
            if (j < n) {
                const float2 v0 = kv_load2<V>(v_s + j * vrow, 2 * dp);
                a0.x = fmaf(pg[j], v0.x, a0.x), a0.y = fmaf(pg[j], v0.y, a0.y);
            }
            o[r] = make_float2(a0.x + a1.x, a0.y + a1.y);
        }
        c += S;
        if (c >= n_chunks) break;
        __syncthreads();  // every thread is done with this chunk's rows and p
        lo = begin + c * kc;
        n = int(min(int64_t(kc), end - lo));
        copy_rows(lo, n, lo, lo + n);
    }
    if (n_act == 1) {
        __syncthreads();  // q_s is reused for the normalised rows
#pragma unroll
        for (int r = 0; r < kDecMaxItems; ++r) {
            const int i = tid + r * kThreads;
            if (i >= n_items) break;
            const int g = i / half, dp = i - g * half;
            const float l = st_s[G + g], inv = l > 0.0f ? 1.0f / l : 0.0f;
            q_s[g * hd + 2 * dp] = o[r].x * inv, q_s[g * hd + 2 * dp + 1] = o[r].y * inv;
        }
        __syncthreads();
        for (int e = tid; e < G * hd; e += kThreads) write_out(a, qrow0 + e / hd, e % hd, q_s[e]);
        return;
    }
    // Several splits: (o [G][hd], m [G], l [G]) per split; the last one to finish merges.
    const int64_t per = int64_t(G) * (hd + 2);
    const int64_t group = t * a.n_head_kv + hk;
    float* base = a.partial + kCounterFloats + group * S * per;
    float* part = base + s * per;
#pragma unroll
    for (int r = 0; r < kDecMaxItems; ++r) {
        const int i = tid + r * kThreads;
        if (i >= n_items) break;
        const int g = i / half, dp = i - g * half;
        part[g * hd + 2 * dp] = o[r].x, part[g * hd + 2 * dp + 1] = o[r].y;
    }
    for (int g = tid; g < G; g += kThreads) part[G * hd + g] = st_s[g], part[G * hd + G + g] = st_s[G + g];
    merge_last_split(a, base, per, G, hd, n_act, group, qrow0, dsm);
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

namespace {

// The decode kernel's chunk and split count for these arguments, or !ok (another kernel serves them).
DecPlan dec_plan(const AttentionArgs& a) {
    DecPlan p;
    if ((a.n_tokens > kDecMaxTokens && !a.each_seq) || !kv_staged(a.codec, a.head_dim) ||
        !kv_staged(a.v_codec, a.head_dim) || a.head_dim > 256 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
        return p;
    const int G = a.n_head / a.n_head_kv, hd = a.head_dim;
    if (int64_t(G) * hd > 2 * kThreads * kDecMaxItems) return p;
    const int64_t per_key = kv_staged_krow(a.codec, hd) + kv_staged_bytes(a.v_codec, hd) + 4 * G;
    const int64_t fixed = int64_t(4) * G * hd + 12 * G + 16;
    // Chunks of 256 keys, 512 for the block codecs: their rows are half of F16's bytes or less, so a
    // chunk holds as many bytes, and fewer splits merge.
    const int64_t kc = std::min<int64_t>(kv_blocked(a.codec) && kv_blocked(a.v_codec) ? 512 : 256,
                                         (kDecSmem - fixed) / per_key / 32 * 32);
    if (kc < 32) return p;
    const int64_t by_len = std::max<int64_t>(1, ceil_div(attn_max_keys(a.n_ctx, a.sliding_window), kc));
    const int64_t by_sms = std::max<int64_t>(1, ceil_div(2 * sm_count(), int64_t(a.n_head_kv) * a.n_tokens));
    p.ok = true;
    p.kc = int(kc);
    // Split counters (one per (token, kv head)) fit the scratch's head, else one split.
    p.splits = a.n_tokens * a.n_head_kv > kCounterFloats ? 1 : int(std::min(by_len, by_sms));
    // The K/V rows' room holds the merge's weights once the key loop is done.
    p.smem = std::max(size_t(kc * per_key), merge_smem_bytes(p.splits, G)) + size_t(fixed);
    return p;
}


template <class K, class V>
void launch_dec(const AttnK& k, const DecPlan& p, cudaStream_t s) {
    allow_dynamic_smem<attn_dec_kernel<K, V>>(p.smem);
    launch(attn_dec_kernel<K, V>, dim3(unsigned(k.n_head_kv), unsigned(p.splits), unsigned(k.n_tokens)), kThreads, p.smem,
           s, k);
}

}  // namespace

size_t attention_scratch_floats(const AttentionArgs& a) {
    const DecPlan p = dec_plan(a);
    if (p.ok)
        return p.splits == 1 ? 0
                             : size_t(kCounterFloats) + size_t(a.n_tokens) * a.n_head_kv * p.splits *
                                                            (a.n_head / a.n_head_kv) * (a.head_dim + 2);
    const int n_splits = attn_splits(a.n_tokens, a.n_ctx);
    return n_splits > 1 ? size_t(kCounterFloats) + size_t(a.n_tokens) * a.n_head * n_splits * (a.head_dim + 2) : 0;
}

void attention(const AttentionArgs& a, Stream stream) {
    if (a.n_tokens == 0) return;
    CERA_CHECK(a.head_dim % (kv_blocked(a.codec) || kv_blocked(a.v_codec) ? 32 : 8) == 0 && a.head_dim <= 2 * kThreads &&
                   a.n_head % a.n_head_kv == 0,
               "attention: head_dim %d (needs a multiple of 8, 32 for a block codec, <= 256), n_head %d, n_head_kv %d",
               a.head_dim, a.n_head, a.n_head_kv);
    AttnK k{};
    k.q = a.q, k.k = a.k_cache, k.v = a.v_cache, k.pos = a.pos, k.n_ctx = a.n_ctx, k.n_tokens = a.n_tokens;
    k.n_head = a.n_head, k.n_head_kv = a.n_head_kv, k.head_dim = a.head_dim;
    k.n_splits = attn_splits(a.n_tokens, a.n_ctx);
    k.sliding_window = a.sliding_window, k.scale = a.scale, k.out = a.out, k.partial = a.partial;
    k.seq = a.seq, k.table = a.block_table, k.table_stride = a.table_stride, k.block_shift = a.block_shift;
    k.each_seq = a.each_seq;
    CERA_CHECK(!a.out_xq || (a.head_dim % 32 == 0 && a.head_dim <= kThreads), "attention: 8-bit output rows need "
               "head_dim %% 32 == 0 and <= %d", kThreads);
    k.out_xq = static_cast<uint8_t*>(a.out_xq);
    cudaStream_t s = as_stream(stream);
    if (const DecPlan p = dec_plan(a); p.ok) {
        CERA_CHECK(p.splits == 1 || a.partial != nullptr, "attention: the decode kernel needs its scratch");
        k.n_splits = p.splits, k.kc = p.kc;
        if (a.codec == a.v_codec && attention_decode_warp(k, a.codec, s)) return;
        with_kv_codec(a.codec, [&](auto c) {
            with_kv_codec(a.v_codec, [&](auto v) { launch_dec<decltype(c), decltype(v)>(k, p, s); });
        });
        return;
    }
    CERA_CHECK(k.n_splits == 1 || a.partial != nullptr);
    if (a.partial) k.partial = a.partial + kCounterFloats;
    const dim3 grid(unsigned(a.n_head), unsigned(k.n_splits), unsigned(a.n_tokens));
    const size_t smem = sizeof(float) * (a.head_dim + kThreads + 32 + 2 * kThreads);
    // F32 caches: the f32 tiles; the others: tensor cores with Q and P split hi + lo (f32-grade sums).
    // Keys and values of two codecs: the per-query kernel.
    if (k.n_splits == 1 && a.n_tokens >= kQT && (a.head_dim == 64 || a.head_dim == 128) && a.n_ctx < INT_MAX &&
        a.codec == a.v_codec) {
        if (a.codec != KvCodec::kF32) {
            const int G = a.n_head / a.n_head_kv;
            const dim3 mg(unsigned(a.n_head_kv), unsigned(ceil_div(a.n_tokens * G, kFaRows)));
            attention_prefill_mma(k, a.codec, mg, s);
            return;
        }
        const dim3 tg(unsigned(a.n_head), unsigned(ceil_div(a.n_tokens, kQT)));
        if (a.head_dim == 64) launch((attn_tile_kernel<64>), tg, kThreads, 0, s, k);
        else launch((attn_tile_kernel<128>), tg, kThreads, 0, s, k);
        return;
    }
    with_kv_codec(a.codec, [&](auto c) {
        with_kv_codec(a.v_codec, [&](auto v) {
            launch((attn_kernel<decltype(c), decltype(v)>), grid, kThreads, smem, s, k);
        });
    });
    if (k.n_splits > 1) {
        launch(attn_combine_kernel, dim3(unsigned(a.n_head), unsigned(a.n_tokens)), 64, 0, s, k);
    }
}

}  // namespace cera::cuda
