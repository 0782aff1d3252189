// The best m logits of a row for sampling on the device (Backend::top_logits): a sampler whose chain
// starts with a top-k needs only the best k + window entries and the window's own logits, so a few
// hundred bytes cross PCIe instead of the n_vocab logits, and the host sampler's pass over the whole
// row goes away.
// Idea: one block of 1024 threads. Each logit maps to a 32-bit key whose unsigned order is the value
// order (0 for NaN and -inf: never candidates; -0 and +0 share a key). A radix select, 8 bits a pass
// over the row (shared-memory histograms), finds the key T of the m-th best and how many entries
// holding T are needed; one more pass collects every entry above T, and an in-order pass (warp
// ballots, block prefix) takes the lowest indices holding T, so ties go to the lower index as the
// host's order has it. A bitonic sort in shared memory orders the m by (key descending, index
// ascending).
// Roofline: ~6 passes over the row, L2-resident after the LM head (one SM streams ~170 GB/s: ~1.5 us
// a pass for 65536 entries). Measured end to end it is slower than that (bench/NOTES.md): logits
// crowd into a few exponent bins, so the first passes' shared-memory atomics serialize (merging a
// warp's equal bins with __match_any_sync measured slower still). A sampled threshold that leaves a
// few thousand candidates to sort would avoid the histograms.
#include <climits>

#include "backends/cuda/common.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSortMax = 1024;  // m <= kSortMax (kTopLogitsMax)
constexpr int kUnroll = 4;

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

__global__ void __launch_bounds__(kThreads) top_logits_kernel(const float* __restrict__ x, int64_t n, int m,
                                                             const int32_t* __restrict__ gather, int n_g,
                                                             int32_t* __restrict__ out) {
    pdl_trigger();
    pdl_wait();  // the logits come from the kernel before
    __shared__ unsigned hist[256];
    __shared__ unsigned long long best[kSortMax];
    __shared__ unsigned s_bin, s_need, s_count, s_all, s_taken;
    __shared__ unsigned warp_n[kThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // Radix select: the key T of the m-th best and `need`, how many entries holding T are kept.
    uint32_t prefix = 0, mask = 0;
    unsigned need = unsigned(m);
    bool all = false;  // fewer than m candidates: every one is kept
    for (int shift = 24; shift >= 0 && m > 0; shift -= 8) {
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
            const unsigned total = __shfl_sync(0xffffffffu, incl, 31);
            if (lane == 0) s_all = total < need;
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
    for (int64_t i0 = 0; i0 < n && m > 0; i0 += kUnroll * kThreads) {
        uint32_t key[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = i0 + u * kThreads + tid;
            key[u] = i < n ? logit_key(__ldg(x + i)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (all ? key[u] != 0u : key[u] > prefix) best[atomicAdd(&s_count, 1u)] = rank_of(key[u], i0 + u * kThreads + tid);
    }
    __syncthreads();
    unsigned count = s_count;
    // The lowest `need` indices holding T, in index order.
    if (!all && m > 0) {
        const unsigned base = count;
        for (int64_t i0 = 0; i0 < n; i0 += kThreads) {
            const int64_t i = i0 + tid;
            const bool hit = i < n && logit_key(__ldg(x + i)) == prefix;
            const unsigned ballot = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) warp_n[warp] = __popc(ballot);
            __syncthreads();
            unsigned before = s_taken;
            for (int w = 0; w < warp; ++w) before += warp_n[w];
            const unsigned rank = before + __popc(ballot & ((1u << lane) - 1u));
            if (hit && rank < need) best[base + rank] = rank_of(prefix, i);
            __syncthreads();
            if (tid == 0) {
                unsigned t = s_taken;
                for (int w = 0; w < kThreads / 32; ++w) t += warp_n[w];
                s_taken = t;
            }
            __syncthreads();
            if (s_taken >= need) break;
        }
        count = base + need;
    }

    // Bitonic sort of the kept, descending (empty slots rank lowest).
    int p2 = 1;
    while (p2 < int(count)) p2 <<= 1;
    for (int i = int(count) + tid; i < p2; i += kThreads) best[i] = 0ull;
    __syncthreads();
    for (int size = 2; size <= p2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < p2; i += kThreads) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool desc = (i & size) == 0;
                    const unsigned long long a = best[i], b = best[j];
                    if (desc ? a < b : a > b) best[i] = b, best[j] = a;
                }
            }
            __syncthreads();
        }
    }

    if (tid == 0) out[0] = int32_t(count);
    for (int j = tid; j < int(count); j += kThreads) {
        const int32_t id = int32_t(0xFFFFFFFFu - uint32_t(best[j] & 0xFFFFFFFFull));
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
