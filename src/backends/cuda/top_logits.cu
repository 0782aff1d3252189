// The best m logits of a row for sampling on the device (Backend::top_logits): a sampler whose chain
// starts with a top-k needs only the best k + window entries and the window's own logits, so a few
// hundred bytes cross PCIe instead of the n_vocab logits, and the host sampler's pass over the whole
// row goes away.
// Idea: one block of 1024 threads. Each logit maps to a 32-bit key whose unsigned order is the value
// order (0 for NaN and -inf: never candidates; -0 and +0 share a key); an entry ranks by (key, lower
// index), the host's order. Fast path: 1024 evenly spaced samples, sorted, give a threshold key tau
// expected to leave a few times m entries at or above it; one pass counts them per thread (no
// atomics), a block prefix sum gives each thread its output slots, a second pass writes them, and a
// bitonic sort of at most kCand candidates orders them: every entry tied with the m-th is among them,
// so the first m are exact. A threshold that leaves fewer than m is lowered (up to every candidate);
// one that leaves more than kCand (a flat row, masses of ties) falls back to a radix select, 8 bits a
// pass over the row with shared-memory histograms, then an in-order pass for the ties at the m-th key.
// Roofline: 3 passes over the row on the fast path (16-byte loads, 4 in flight a thread), L2-resident
// after the LM head; one SM streams ~170 GB/s, ~1.5 us a pass for 65536 entries, plus the sorts. The radix select alone measured no
// faster than copying the logits to the host: logits crowd into a few exponent bins, so its
// shared-memory atomics serialize (bench/NOTES.md).
#include <climits>
#include <cstdint>

#include "backends/cuda/common.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;
constexpr int kSamples = kThreads;  // one sample a thread
constexpr int kCand = 4096;         // fast path: candidates sorted at most
static_assert(kTopLogitsMax <= kCand, "the radix path keeps up to kTopLogitsMax entries in the candidate array");

__device__ __forceinline__ uint32_t logit_key(float v) {
    if (!(v > -INFINITY)) return 0u;  // NaN and -inf
    if (v == 0.0f) v = 0.0f;          // -0 == +0
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Larger is better: the key, then the lower index.
__device__ __forceinline__ unsigned long long rank_of(uint32_t key, int64_t i) {
    return (static_cast<unsigned long long>(key) << 32) | (0xFFFFFFFFu - uint32_t(i));
}

// Descending bitonic sort of a[0, p2) (p2 a power of two), by the whole block.
template <class T>
__device__ __forceinline__ void sort_desc(T* a, int p2) {
    for (int size = 2; size <= p2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < p2; i += kThreads) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool desc = (i & size) == 0;
                    const T x = a[i], y = a[j];
                    if (desc ? x < y : x > y) a[i] = y, a[j] = x;
                }
            }
            __syncthreads();
        }
    }
}

// Block-wide sum; every thread gets it.
__device__ __forceinline__ unsigned block_sum_u(unsigned v, unsigned* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // red may still be read
    if (lane == 0) red[warp] = v;
    __syncthreads();
    unsigned t = 0;
    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
    return t;
}

// f(key, index) for this thread's share of the row: 16-byte loads, kUnroll of them in flight (the
// row is L2-resident but one SM needs many loads in flight to stream it), then a scalar tail.
template <class F>
__device__ __forceinline__ void for_each_key(const float* x, int64_t n, F&& f) {
    const int64_t n4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? n / 4 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t c0 = 0; c0 < n4; c0 += kUnroll * kThreads) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * kThreads + threadIdx.x;
            v[u] = c < n4 ? __ldg(x4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * kThreads + threadIdx.x;
            if (c < n4) {
                f(logit_key(v[u].x), 4 * c);
                f(logit_key(v[u].y), 4 * c + 1);
                f(logit_key(v[u].z), 4 * c + 2);
                f(logit_key(v[u].w), 4 * c + 3);
            }
        }
    }
    for (int64_t i = 4 * n4 + threadIdx.x; i < n; i += kThreads) f(logit_key(__ldg(x + i)), i);
}

// Entries at or above tau in this thread's share.
__device__ __forceinline__ unsigned count_at_least(const float* x, int64_t n, uint32_t tau) {
    unsigned c = 0;
    for_each_key(x, n, [&](uint32_t key, int64_t) { c += key >= tau ? 1u : 0u; });
    return c;
}

__global__ void __launch_bounds__(kThreads) top_logits_kernel(const float* __restrict__ x, int64_t n, int m,
                                                             const int32_t* __restrict__ gather, int n_g,
                                                             int32_t* __restrict__ out) {
    pdl_trigger();
    pdl_wait();  // the logits come from the kernel before
    __shared__ unsigned long long cand[kCand];  // fast path: the candidates; radix path: the kept (<= kTopLogitsMax)
    __shared__ uint32_t samp[kSamples];
    __shared__ unsigned hist[256], red[32];
    __shared__ unsigned s_bin, s_need, s_count, s_all, s_taken;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned count = 0;  // entries kept, best first in cand after the sort
    int p2 = 1;          // sorted length (a power of two >= count)

    // Fast path: a sampled threshold.
    bool fast = m > 0;
    if (fast) {
        samp[tid] = logit_key(__ldg(x + int64_t(tid) * n / kSamples));
        __syncthreads();
        sort_desc(samp, kSamples);
        // About 2 m (+ 8) samples' worth of entries expected at or above samp[r].
        int r = int(min(int64_t(kSamples - 1), (2 * int64_t(m) * kSamples + n - 1) / n + 8));
        unsigned mine = 0, total = 0;
        for (;;) {
            const uint32_t tau = r < 0 || samp[r] == 0u ? 1u : samp[r];
            mine = count_at_least(x, n, tau);
            total = block_sum_u(mine, red);
            if (total >= unsigned(m) || tau == 1u) {
                if (total > unsigned(kCand)) {
                    fast = false;
                } else {
                    // This thread's output slots: the block's exclusive prefix of `mine`.
                    unsigned incl = mine;
#pragma unroll
                    for (int o = 1; o < 32; o <<= 1) {
                        const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                        if (lane >= o) incl += v;
                    }
                    __syncthreads();
                    if (lane == 31) red[warp] = incl;
                    __syncthreads();
                    unsigned off = incl - mine;
                    for (int w = 0; w < warp; ++w) off += red[w];
                    for_each_key(x, n, [&](uint32_t key, int64_t i) {
                        if (key >= tau) cand[off++] = rank_of(key, i);
                    });
                    count = total;
                }
                break;
            }
            r = r == kSamples - 1 ? -1 : min(kSamples - 1, 4 * r + 16);  // too few: lower the threshold
        }
    }

    if (!fast && m > 0) {
        // Radix select: the key T of the m-th best and `need`, how many entries holding T are kept.
        uint32_t prefix = 0, mask = 0;
        unsigned need = unsigned(m);
        bool all = false;  // fewer than m candidates: every one is kept
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
            __syncthreads();
            for (int64_t i0 = 0; i0 < n; i0 += kUnroll * kThreads) {
                uint32_t key[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {  // kUnroll loads in flight before the atomics
                    const int64_t i = i0 + u * kThreads + tid;
                    key[u] = i < n ? logit_key(__ldg(x + i)) : 0u;
                }
#pragma unroll
                for (int u = 0; u < kUnroll; ++u)
                    if (key[u] != 0u && (key[u] & mask) == prefix) atomicAdd(&hist[(key[u] >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (warp == 0) {  // the bin holding the need-th best, from the top: lane l sums bins 8l .. 8l + 7
                unsigned c[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) sum += (c[j] = hist[255 - (8 * lane + j)]);
                unsigned incl = sum;  // inclusive prefix over lanes (from the top bin down)
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += v;
                }
                const unsigned excl = incl - sum;
                const unsigned tot = __shfl_sync(0xffffffffu, incl, 31);
                if (lane == 0) s_all = tot < need;
                if (excl < need && need <= incl) {  // exactly one lane
                    unsigned cum = excl;
                    int j = 0;
                    while (cum + c[j] < need) cum += c[j++];
                    s_bin = 255u - unsigned(8 * lane + j);
                    s_need = need - cum;
                }
            }
            __syncthreads();
            if (s_all) {  // only the first pass can find fewer candidates than m
                all = true;
                break;
            }
            prefix |= s_bin << shift;
            mask |= 255u << shift;
            need = s_need;
        }
        // Every candidate above T (or every candidate at all), in any order.
        if (tid == 0) s_count = 0, s_taken = 0;
        __syncthreads();
        for (int64_t i0 = 0; i0 < n; i0 += kUnroll * kThreads) {
            uint32_t key[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t i = i0 + u * kThreads + tid;
                key[u] = i < n ? logit_key(__ldg(x + i)) : 0u;
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (all ? key[u] != 0u : key[u] > prefix) cand[atomicAdd(&s_count, 1u)] = rank_of(key[u], i0 + u * kThreads + tid);
        }
        __syncthreads();
        count = s_count;
        // The lowest `need` indices holding T, in index order.
        if (!all) {
            const unsigned base = count;
            for (int64_t i0 = 0; i0 < n; i0 += kThreads) {
                const int64_t i = i0 + tid;
                const bool hit = i < n && logit_key(__ldg(x + i)) == prefix;
                const unsigned ballot = __ballot_sync(0xffffffffu, hit);
                if (lane == 0) red[warp] = __popc(ballot);
                __syncthreads();
                unsigned before = s_taken;
                for (int w = 0; w < warp; ++w) before += red[w];
                const unsigned rank = before + __popc(ballot & ((1u << lane) - 1u));
                if (hit && rank < need) cand[base + rank] = rank_of(prefix, i);
                __syncthreads();
                if (tid == 0) {
                    unsigned t = s_taken;
                    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
                    s_taken = t;
                }
                __syncthreads();
                if (s_taken >= need) break;
            }
            count = base + need;
        }
    }

    // Sort the kept, best first (empty slots rank lowest).
    while (p2 < int(count)) p2 <<= 1;
    __syncthreads();
    for (int i = int(count) + tid; i < p2; i += kThreads) cand[i] = 0ull;
    __syncthreads();
    sort_desc(cand, p2);

    const int c = int(min(count, unsigned(m)));
    if (tid == 0) out[0] = int32_t(c);
    for (int j = tid; j < c; j += kThreads) {
        const int32_t id = int32_t(0xFFFFFFFFu - uint32_t(cand[j] & 0xFFFFFFFFull));
        out[1 + j] = id;
        out[1 + m + j] = __float_as_int(x[id]);
    }
    for (int g = tid; g < n_g; g += kThreads) {
        const int32_t id = gather[g];
        out[1 + 2 * m + g] = id >= 0 && id < n ? __float_as_int(x[id]) : 0x7FC00000;  // NaN
    }
}

}  // namespace

void top_logits(const float* x, int64_t n, int m, const int32_t* gather, int n_g, int32_t* out, Stream stream) {
    CERA_CHECK(m >= 0 && m <= kTopLogitsMax && n >= 1 && n < INT32_MAX && n_g >= 0,
               "top_logits: m = %d (at most %d), n = %lld", m, kTopLogitsMax, (long long)n);
    launch(top_logits_kernel, 1, kThreads, 0, as_stream(stream), x, n, m, gather, n_g, out);
}

}  // namespace cera::cuda
