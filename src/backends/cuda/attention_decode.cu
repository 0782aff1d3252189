// Decode attention with warp-parallel chunks (one to eight queries of a sequence over the KV cache).
// Idea: at short and middle contexts the one-token attention is a chain of latencies, not of bytes
// (lfm2-1.2b: 8 kv heads x 4 query heads x 64 dims, ~128 keys: 32 KB of K/V per layer). The kernel it
// complements (attention.cu, attn_dec_kernel) walked a chunk in three block-wide phases (a key per
// thread for the scores, a warp per head for the softmax, a (head, dim pair) per thread over all keys
// for P V), each behind a block barrier and each a long serial loop. Here every warp runs its own
// flash-attention over a share of the chunk's keys: a pass takes 32 / GP keys (GP = the GQA group
// rounded up to a power of two), each lane one (key, head) score; the per-head max and sum are
// shuffles among the lanes of one head; the warp's output rows (G x head_dim, in registers) are
// rescaled and accumulated from the V rows of the pass. The warps' (m, l, o) merge once in shared
// memory at the end. 8 warps a block, which leaves room on the SM for the blocks of the products
// around it, and at most 128 registers a thread, so that two blocks share an SM: the plan's splits
// count on two blocks an SM, and at one a long cache's blocks run in two waves. Same grid, splits,
// prologue (K/V rows below the step's positions copied with cp.async before the PDL wait) and
// partial layout as attn_dec_kernel, whose plan it takes; its chunks too, except where a split walks
// several of them: there a quarter of the size, in two shared-memory stages (attention_decode_warp).
// With one chunk a kv head's warps share one SM, and its shared-memory pipe bounds the key loop:
// q rows are padded so a pass's lanes read G heads from distinct banks, and a key's weights reach
// the lanes by one broadcast load instead of G shuffles.
// Roofline: the K/V bytes (2 KB per position per layer for lfm2-1.2b) are L2/HBM-trivial in decode;
// the goal is the shortest chain from the wait's release to the output's 8-bit rows.
#include <cstdint>
#include <cstdlib>

#include "backends/cuda/attention_shared.cuh"

namespace cera::cuda {
namespace {

constexpr int kDecodeWarps = 8;  // warps a block

// q rows in shared memory are HD + 4 floats apart, so the lanes of a pass, which read the same 16 bytes
// of G different heads, hit distinct banks (HD floats apart they all hit the same four).
template <int HD>
constexpr int kQStride = HD + 4;
// The GP floats at p (16-byte aligned for GP >= 4), every lane reading the same address (a broadcast).
template <int GP>
__device__ __forceinline__ void load_weights(const float* p, float (&w)[GP]) {
    if constexpr (GP >= 4) {
#pragma unroll
        for (int i = 0; i < GP; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(p + i);
            w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < GP; ++i) w[i] = p[i];
    }
}

// Q8_0 caches: the scores of a key row (staged, the head's first byte) against a head of q in 8-bit
// blocks, as 4-byte integer dot products (the way llama.cpp's vector kernels take quantized keys): per
// block of 32, 8 dp4a and one scale product d_k d_q instead of 32 decoded multiply-adds. The codes of
// an even block start 2 bytes into a word (its 34-byte block starts on one, rows being 4-byte aligned):
// each word of them is put together from two loads with a byte permute. q's rounding to 8 bits (half
// a step of its block's scale) is the error this adds.
template <int HD>
constexpr int kQ8Stride = HD + 4;  // bytes: rows of distinct heads on distinct banks
template <int HD>
__device__ __forceinline__ float q8_score(const unsigned char* kr, const int8_t* qh, const float* dq) {
    const int* qw = reinterpret_cast<const int*>(qh);
    float s = 0.0f;
#pragma unroll
    for (int b = 0; b < HD / 32; ++b) {
        const unsigned char* blk = kr + b * 34;
        const float dk = __half2float(*reinterpret_cast<const __half*>(blk));
        int acc = 0;
        if (b & 1) {
            const int* kw = reinterpret_cast<const int*>(blk + 2);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc = __dp4a(kw[i], qw[8 * b + i], acc);
        } else {
            const uint32_t* kw = reinterpret_cast<const uint32_t*>(blk);
            uint32_t w0 = kw[0];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const uint32_t w1 = kw[i + 1];
                acc = __dp4a(int(__byte_perm(w0, w1, 0x5432)), qw[8 * b + i], acc);
                w0 = w1;
            }
        }
        s = fmaf(float(acc), dk * dq[b], s);
    }
    return s;
}

// The dry pass's query rows (attn_decw_kernel): zeros, G * HD <= 1024 floats.
__device__ float g_dry_q[1024];

// Shared memory: K rows (stride HD * es + 16: 16-byte reads of different rows hit distinct banks),
// V rows, q [G][HD + 4] (scaled), the warps' pass weights [W][32], then the warps' m [W][G], l [W][G],
// o [W][G][HD] for the merge after the key loop.
template <class K, int HD, int GP, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 2) attn_decw_kernel(const DecodeAttnArgs a) {
    constexpr int kWarpThreads = kWarps * 32;
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char dsm[];
    constexpr int krow = kv_staged_krow(K::kCodec, HD), vrow = kv_staged_bytes(K::kCodec, HD);
    const KvRows<K> rows(HD);
    constexpr int P = 32 / GP;   // keys per warp pass
    constexpr int NP = HD / 64;  // dim pairs per lane: lane owns pairs lane, lane + 32, ...
    const int hk = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.z;
    const int G = a.n_head / a.n_head_kv, kc = a.kc, S = a.n_splits, NS = a.stages;
    const int gl = lane % GP, kl = lane / GP;  // this lane's head and key within a pass
    const size_t stage_bytes = size_t(kc) * (krow + vrow);
    float* q_s = reinterpret_cast<float*>(dsm + NS * stage_bytes);
    float* p_s = q_s + G * kQStride<HD>;  // each warp's 32 (key, head) weights of its pass
    const int hc = hk / a.kv_div;  // the cache head
    const int64_t row_bytes = kv_row_bytes(K::kCodec, int64_t(a.n_head_kv / a.kv_div) * HD);
    const unsigned char* kg = static_cast<const unsigned char*>(a.k) + kv_row_bytes(K::kCodec, int64_t(hc) * HD);
    const unsigned char* vg = static_cast<const unsigned char*>(a.v) + kv_row_bytes(K::kCodec, int64_t(hc) * HD);

    int64_t begin, end;
    attn_key_range(a.pos[t], a.n_ctx, a.sliding_window, begin, end);
    const int64_t len = max(end - begin, int64_t(0));
    const int64_t n_chunks = ceil_div(len, kc);
    const int n_act = int(min(int64_t(S), n_chunks));
    if (s > 0 && s >= n_act) return;
    const int64_t safe = rows_written_before(a, t);  // rows below it: written by earlier steps
    // The copies walk the (row, piece) pairs of a chunk kWarpThreads apart as a row step and a piece
    // step with a carry, so that the loop issuing them holds no division.
    const int tr = tid / rows.pieces, tc = tid - tr * rows.pieces;
    const int rstep = kWarpThreads / rows.pieces, cstep = kWarpThreads - rstep * rows.pieces;
    auto copy_rows = [&](int st, int64_t lo, int n, int64_t from, int64_t to) {
        unsigned char* k_s = dsm + st * stage_bytes;
        unsigned char* v_s = k_s + size_t(kc) * krow;
        const int r0 = int(max(from, lo) - lo), r1 = int(min(to, lo + n) - lo);
        for (int r = r0 + tr, pc = tc; r < r1;) {
            const int64_t off = kv_row(a, t, lo + r) * row_bytes;
            rows.copy_k(k_s + r * krow, kg + off, pc);
            rows.copy_v(v_s + r * vrow, vg + off, pc);
            r += rstep, pc += cstep;
            if (pc >= rows.pieces) pc -= rows.pieces, ++r;
        }
        cp_async_commit();
    };
    int64_t c = s, lo = begin + c * kc;
    int n = int(min(int64_t(kc), end - lo));
    if (len > 0) copy_rows(0, lo, n, lo, safe);
    // The key loop and the merge run once before the wait, on the older rows and a zero q (g_dry_q),
    // nothing stored, so that the release finds their code in this SM's instruction cache: the 16-odd
    // blocks of a layer's attention land on SMs that ran other kernels since, and are resident
    // microseconds before the release.
    const bool dry = n_chunks == 1;  // short contexts only: a longer key loop is worth no second run
    const int64_t qrow0 = t * a.n_head + int64_t(hk) * G;
    float* m_s = p_s + kWarps * 32;
    float* l_s = m_s + kWarps * G;
    float* o_s = l_s + kWarps * G;
    // Q8_0 caches: q in 8-bit blocks of 32 too (rows kQ8Stride bytes apart), with their scales.
    int8_t* q8_s = reinterpret_cast<int8_t*>(o_s + kWarps * G * HD);
    float* dq_s = reinterpret_cast<float*>(q8_s + G * kQ8Stride<HD>);
    const bool single = n_act == 1;
    const int64_t per = int64_t(G) * (HD + 2);
    const int64_t group = t * a.n_head_kv + hk;
    float* base = single ? nullptr : a.partial + kDecodeCounterFloats + group * S * per;
    float* part = single ? nullptr : base + s * per;
    float m = -INFINITY, l = 0.0f;
    float2 o[GP][NP];
    const bool head_ok = gl < G;
#pragma unroll 1
    for (int pass = dry ? 0 : 1; pass < 2; ++pass) {
        if (pass == 1) {
            pdl_wait();
            if (len == 0) {
                for (int e = tid; e < G * HD; e += kWarpThreads) write_out(a, qrow0 + e / HD, e % HD, 0.0f);
                return;
            }
            c = s, lo = begin + c * kc;
            n = int(min(int64_t(kc), end - lo));
            copy_rows(0, lo, n, safe, lo + n);
            // The pipeline's other stages: chunks s + i S (a group each, empty past the last chunk).
            for (int i = 1; i < NS; ++i) {
                const int64_t li = begin + (s + int64_t(i) * S) * kc;
                const int ni = int(max(int64_t(0), min(int64_t(kc), end - li)));
                copy_rows(i, li, ni, li, li + ni);
            }
        }
        {
            const float* qsrc = pass == 0 ? g_dry_q : a.q + qrow0 * HD;
            for (int i = tid; i < G * HD; i += kWarpThreads) q_s[i / HD * kQStride<HD> + i % HD] = qsrc[i] * a.scale;
            if constexpr (std::is_same_v<K, KvQ8>)
                for (int b = warp; b < G * HD / 32; b += kWarps) {  // block b: head b / (HD / 32)
                    const float x = qsrc[32 * b + lane] * a.scale;
                    const float d = warp_max(fabsf(x)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                    q8_s[(b / (HD / 32)) * kQ8Stride<HD> + (b % (HD / 32)) * 32 + lane] = int8_t(__float2int_rn(x * id));
                    if (lane == 0) dq_s[b] = d;
                }
        }

        // This warp's flash state: m and l of head gl (the same in every lane of that head), o[g][pair].
        m = -INFINITY, l = 0.0f;
#pragma unroll
        for (int g = 0; g < GP; ++g)
#pragma unroll
            for (int i = 0; i < NP; ++i) o[g][i] = make_float2(0.0f, 0.0f);
        for (int it = 0;; ++it) {
            // The chunk of this round landed; the NS - 1 later rounds' copies may still be in flight.
            if (pass == 0) cp_async_wait<0>();
            else cp_async_wait_n(NS - 1);
            __syncthreads();
            trace_mark(0);
            const unsigned char* k_s = dsm + (it % NS) * stage_bytes;
            const unsigned char* v_s = k_s + size_t(kc) * krow;
            for (int p0 = warp * P; p0 < n; p0 += kWarps * P) {
                const int j = p0 + kl;
                const bool live = head_ok && j < n;
                float sc = -INFINITY;
                if (live && std::is_same_v<K, KvQ8>) {
                    sc = q8_score<HD>(k_s + j * krow, q8_s + gl * kQ8Stride<HD>, dq_s + gl * (HD / 32));
                } else if (live) {
                    const unsigned char* kr = k_s + j * krow;
                    const float* qg = q_s + gl * kQStride<HD>;
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                    for (int d = 0; d < HD; d += 8) {
                        float kv[8];
                        kv_load8<K>(kr, d, kv);
                        const float4 x0 = *reinterpret_cast<const float4*>(qg + d);
                        const float4 x1 = *reinterpret_cast<const float4*>(qg + d + 4);
                        s0 = fmaf(x0.x, kv[0], s0), s1 = fmaf(x0.y, kv[1], s1);
                        s0 = fmaf(x0.z, kv[2], s0), s1 = fmaf(x0.w, kv[3], s1);
                        s0 = fmaf(x1.x, kv[4], s0), s1 = fmaf(x1.y, kv[5], s1);
                        s0 = fmaf(x1.z, kv[6], s0), s1 = fmaf(x1.w, kv[7], s1);
                    }
                    sc = s0 + s1;
                }
                float mx = sc;
#pragma unroll
                for (int off = GP; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                const float m_new = fmaxf(m, mx);  // finite for live heads: key p0 is below n
                const float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
                const float pe = live ? __expf(sc - m_new) : 0.0f;
                float sum = pe;
#pragma unroll
                for (int off = GP; off < 32; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
                if (head_ok) l = l * corr + sum, m = m_new;
#pragma unroll
                for (int g = 0; g < GP; ++g) {
                    const float cg = __shfl_sync(0xffffffffu, corr, g);
#pragma unroll
                    for (int i = 0; i < NP; ++i) o[g][i].x *= cg, o[g][i].y *= cg;
                }
                const int nk = min(P, n - p0);
                // The pass's weights go through shared memory: one broadcast load gives a key's GP weights
                // (instead of GP shuffles a key on the shuffle unit that every warp of the SM shares).
                float* pw = p_s + warp * 32;
                __syncwarp();  // the warp's last pass has read pw
                pw[lane] = pe;  // lane = kl * GP + gl
                __syncwarp();
#pragma unroll
                for (int kk = 0; kk < P; ++kk) {
                    if (kk >= nk) break;
                    const unsigned char* vr = v_s + (p0 + kk) * vrow;
                    float2 v[NP];
#pragma unroll
                    for (int i = 0; i < NP; ++i) v[i] = kv_load2<K>(vr, 2 * (lane + 32 * i));
                    float pk[GP];
                    load_weights<GP>(pw + kk * GP, pk);
#pragma unroll
                    for (int g = 0; g < GP; ++g) {
#pragma unroll
                        for (int i = 0; i < NP; ++i) {
                            o[g][i].x = fmaf(pk[g], v[i].x, o[g][i].x);
                            o[g][i].y = fmaf(pk[g], v[i].y, o[g][i].y);
                        }
                    }
                }
            }
            c += S;
            if (pass == 0 || c >= n_chunks) break;
            __syncthreads();  // every warp is done with this chunk's rows: the stage takes chunk c + (NS - 1) S
            {
                const int64_t li = begin + (c + int64_t(NS - 1) * S) * kc;
                const int ni = int(max(int64_t(0), min(int64_t(kc), end - li)));
                copy_rows(it % NS, li, ni, li, li + ni);
            }
            lo = begin + c * kc;
            n = int(min(int64_t(kc), end - lo));
        }
        // Merge the warps: m [W][G], l [W][G], o [W][G][HD] (in their own shared memory: the dry pass
        // runs the merge too, and the older K/V rows must outlive it). The dry pass stores nothing.
        trace_mark(1);
        __syncthreads();
        if (lane < G) m_s[warp * G + lane] = m, l_s[warp * G + lane] = l;  // lane g holds head g (kl = 0)
#pragma unroll
        for (int g = 0; g < GP; ++g) {
            if (g >= G) break;
#pragma unroll
            for (int i = 0; i < NP; ++i)
                *reinterpret_cast<float2*>(&o_s[(warp * G + g) * HD + 2 * (lane + 32 * i)]) = o[g][i];
        }
        __syncthreads();
        for (int e = tid; e < G * HD; e += kWarpThreads) {
            const int g = e / HD, d = e - g * HD;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w * G + g]);
            float L = 0.0f, O = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float mw = m_s[w * G + g];
                if (mw == -INFINITY) continue;
                const float f = __expf(mw - M);
                L = fmaf(l_s[w * G + g], f, L);
                O = fmaf(o_s[(w * G + g) * HD + d], f, O);
            }
            if (single) {
                write_out(a, qrow0 + g, d, L > 0.0f ? O / L : 0.0f, pass == 1);
            } else if (pass == 1) {
                part[g * HD + d] = O;
                if (d == 0) part[G * HD + g] = M, part[G * HD + G + g] = L;
            }
        }
        if (pass == 0) __syncthreads();  // the dry merge's reads of m_s, l_s, o_s are done
    }
    if (single) return;
    merge_last_split(a, base, per, G, HD, n_act, group, qrow0, dsm);
}

template <class K, int HD, int W>
bool launch_w(const DecodeAttnArgs& a, dim3 grid, size_t smem, int gp, cudaStream_t s) {
    switch (gp) {
#define CERA_GP(N)                                                                         \
    case N:                                                                                \
        allow_dynamic_smem<attn_decw_kernel<K, HD, N, W>>(smem);                           \
        launch(attn_decw_kernel<K, HD, N, W>, grid, W * 32, smem, s, a);                   \
        return true;
        CERA_GP(1) CERA_GP(2) CERA_GP(4) CERA_GP(8)
#undef CERA_GP
        default: return false;
    }
}
template <class K, int HD>
bool launch_hd(const DecodeAttnArgs& a, dim3 grid, size_t smem, int gp, cudaStream_t s) {
    return launch_w<K, HD, kDecodeWarps>(a, grid, smem, gp, s);
}

}  // namespace

bool attention_decode_warp(const DecodeAttnArgs& args, KvCodec codec, cudaStream_t s) {
    // A cache that one chunk holds: a GQA group's query heads over up to two blocks (each copies the
    // group's K/V rows, L2 hits), so the short key loop spreads over more SMs. Longer caches read their
    // rows once a group: there the reads and the splits dominate, not the loop's latency.
    const int hsplit = args.n_ctx <= args.kc ? 2 : 1;
    DecodeAttnArgs a = args;
    {
        const int g = a.n_head / a.n_head_kv;
        int d = 1;
        while (d * 2 <= hsplit && g % (d * 2) == 0 &&
               a.n_tokens * a.n_head_kv * d * 2 <= kDecodeCounterFloats)
            d *= 2;
        a.kv_div = d, a.n_head_kv *= d;
    }
    const int hd = a.head_dim, G = a.n_head / a.n_head_kv;
    int gp = 1;
    while (gp < G) gp *= 2;
    if ((hd != 64 && hd != 128) || gp > 8 || gp * hd > 1024 || a.kc < 1) return false;
    // Where a split walks several chunks (a long cache), it takes chunks of a quarter of the plan's
    // size through two shared-memory stages: the next chunk's rows are in flight while the warps work
    // on this one's, and a block's shared memory is half of one plan-sized chunk, which leaves more of
    // the SM to the products' blocks that overlap the attention (bench/NOTES.md, decode at depth).
    a.stages = 1;
    if (a.n_splits > 1 && a.kc >= 128 && ceil_div(attn_max_keys(a.n_ctx, a.sliding_window), a.kc) > a.n_splits)
        a.kc /= 4, a.stages = 2;
    constexpr int warps = kDecodeWarps;
    // The K/V rows' room holds the merge's weights once the key loop is done.
    const size_t kv_row_pair = size_t(kv_staged_krow(codec, hd) + kv_staged_bytes(codec, hd));
    const size_t kv = std::max(size_t(a.stages) * size_t(a.kc) * kv_row_pair, merge_smem_bytes(a.n_splits, G));
    const size_t merge = sizeof(float) * size_t(warps) * size_t(G) * size_t(hd + 2);
    const size_t q_and_weights = sizeof(float) * (size_t(G) * size_t(hd + 4) + 32 * size_t(warps));
    const size_t q8 = codec == KvCodec::kQ8_0 ? size_t(G) * size_t(hd + 4) + sizeof(float) * size_t(G) * (hd / 32) : 0;
    const size_t smem = kv + q_and_weights + merge + q8 + 16;
    if (smem > size_t(device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>())) return false;
    const dim3 grid(unsigned(a.n_head_kv), unsigned(a.n_splits), unsigned(a.n_tokens));
    bool ok = false;
    with_kv_codec(codec, [&](auto c) {
        using K = decltype(c);
        ok = hd == 64 ? launch_hd<K, 64>(a, grid, smem, gp, s) : launch_hd<K, 128>(a, grid, smem, gp, s);
    });
    return ok;
}

}  // namespace cera::cuda
