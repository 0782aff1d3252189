// The grouped LoRA product (lora.h), in two launches per batch of segments: the down products t = s A x,
// a block per (segment, rank index, group of rows), its threads splitting the row's k products four at a
// time so that every load of a row is in flight at once (a warp walking k alone waits out one memory
// latency per 32 elements: tens of microseconds for one decode row); then the up products y += Bᵀ t, a
// thread per output column over a few rows (their t staged in shared memory), each row summing every
// segment that covers it (so overlapping segments need no atomics and the sum does not depend on the
// launch's timing). Bᵀ is read by rows (the column index is the fast one), once for kUpRows rows of x.
#include <cuda_fp16.h>

#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/lora.h"

namespace cera::cuda {
namespace {

constexpr int kDownThreads = 256;
constexpr int kDownRowGroups = 64;  // blocks along the rows, each taking every 64th row
constexpr int kUpThreads = 128;
constexpr int kUpRanks = 32;  // ranks of t staged in shared memory at a time
constexpr int kUpRows = 8;

struct LoraBatch {
    LoraSegDev s[kLoraSegsPerLaunch];
    int n = 0;
};

__device__ __forceinline__ float at(const void* p, bool f16, int64_t i) {
    return f16 ? __half2float(static_cast<const __half*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Four elements of A from i (a multiple of 4).
__device__ __forceinline__ float4 at4(const void* p, bool f16, int64_t i) {
    if (!f16) return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p) + i);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// The expert of row `row` of a MoE launch (clamped like the expert products' ids).
__device__ __forceinline__ int64_t expert_of(const LoraExperts& ex, int64_t row) {
    return min(max(int64_t(ex.ids[row]), int64_t(0)), int64_t(ex.n_expert - 1));
}

// grid (segments, largest rank, row groups). vec: k is a multiple of 4 (rows and A's rows 16-byte aligned).
// kExperts: row i is a (token, expert) slot, reading x row i / x_div and its expert's A.
template <bool kExperts>
__global__ void __launch_bounds__(kDownThreads) lora_down_kernel(const float* __restrict__ x, float* t, int64_t k,
                                                                   bool vec, const LoraBatch b, const LoraExperts ex) {
    __shared__ float red[32];
    pdl_trigger();
    pdl_wait();
    const LoraSegDev& sg = b.s[blockIdx.x];
    const int j = blockIdx.y;
    if (j >= sg.r) return;
    for (int64_t i = blockIdx.z; i < sg.n; i += gridDim.z) {
        const int64_t row = sg.start + i;
        const float* xr = x + (kExperts ? row / ex.x_div : row) * k;
        const int64_t a0 = (kExperts ? expert_of(ex, row) * sg.r + j : j) * k;
        float acc = 0.0f;
        if (vec) {
#pragma unroll 4
            for (int64_t c = int64_t(threadIdx.x) * 4; c < k; c += kDownThreads * 4) {
                const float4 xv = *reinterpret_cast<const float4*>(xr + c);
                const float4 av = at4(sg.a, sg.a_f16, a0 + c);
                acc = fmaf(av.x, xv.x, fmaf(av.y, xv.y, fmaf(av.z, xv.z, fmaf(av.w, xv.w, acc))));
            }
        } else {
#pragma unroll 4
            for (int64_t c = threadIdx.x; c < k; c += kDownThreads) acc = fmaf(at(sg.a, sg.a_f16, a0 + c), xr[c], acc);
        }
        acc = block_sum(acc, red);
        if (threadIdx.x == 0) t[sg.t_off + i * sg.r + j] = sg.scale * acc;
    }
}

// grid (column blocks, row groups of kUpRows). kExperts: each row reads its expert's Bᵀ.
template <bool kExperts>
__global__ void __launch_bounds__(kUpThreads) lora_up_kernel(const float* __restrict__ t, float* y, int64_t n_out,
                                                              int64_t n_rows, const LoraBatch b, const LoraExperts ex) {
    // The block's rows of t, kUpRanks ranks at a time (zero outside the segment), so that the loop over the
    // ranks has no branch and its loads of Bᵀ are all in flight together.
    __shared__ float st[kUpRows][kUpRanks];
    pdl_trigger();
    pdl_wait();
    const int64_t c = int64_t(blockIdx.x) * kUpThreads + threadIdx.x;
    const int64_t r0 = int64_t(blockIdx.y) * kUpRows;
    const bool col = c < n_out;
    float acc[kUpRows];
    bool hit[kUpRows];
#pragma unroll
    for (int i = 0; i < kUpRows; ++i) acc[i] = 0.0f, hit[i] = false;
    for (int q = 0; q < b.n; ++q) {
        const LoraSegDev& sg = b.s[q];
        const int64_t lo = max(r0, sg.start), hi = min(min(r0 + kUpRows, n_rows), sg.start + sg.n);
        if (lo >= hi) continue;  // the same for the whole block
        for (int j0 = 0; j0 < sg.r; j0 += kUpRanks) {
            const int nj = min(kUpRanks, sg.r - j0);
            __syncthreads();  // st of the previous chunk is read
            for (int e = threadIdx.x; e < kUpRows * kUpRanks; e += kUpThreads) {
                const int i = e / kUpRanks, j = e % kUpRanks;
                const int64_t row = r0 + i;
                st[i][j] = row >= lo && row < hi && j < nj ? t[sg.t_off + (row - sg.start) * sg.r + j0 + j] : 0.0f;
            }
            __syncthreads();
            if (!col) continue;
            if constexpr (kExperts) {
                int64_t off[kUpRows];  // each row's Bᵀ (rows outside the segment have t = 0)
#pragma unroll
                for (int i = 0; i < kUpRows; ++i)
                    off[i] = (r0 + i < hi ? expert_of(ex, r0 + i) * sg.r + j0 : j0) * n_out + c;
#pragma unroll 4
                for (int j = 0; j < nj; ++j)
#pragma unroll
                    for (int i = 0; i < kUpRows; ++i)
                        acc[i] = fmaf(st[i][j], at(sg.bt, sg.bt_f16, off[i] + int64_t(j) * n_out), acc[i]);
            } else {
#pragma unroll 8
                for (int j = 0; j < nj; ++j) {
                    const float w = at(sg.bt, sg.bt_f16, int64_t(j0 + j) * n_out + c);
#pragma unroll
                    for (int i = 0; i < kUpRows; ++i) acc[i] = fmaf(st[i][j], w, acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kUpRows; ++i) hit[i] = hit[i] || (r0 + i >= lo && r0 + i < hi);
    }
    if (!col) return;
#pragma unroll
    for (int i = 0; i < kUpRows; ++i)
        if (hit[i]) y[(r0 + i) * n_out + c] += acc[i];
}

constexpr int kDeltaThreads = 256;  // and output rows a block, one a thread
constexpr int kDeltaRanks = 16;     // ranks a pass over x

__device__ __forceinline__ uint4 ld16(const __half* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Eight halves of A against eight values of x.
__device__ __forceinline__ float dot8(const uint4& a, const float4& x0, const float4& x1, float acc) {
    const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&a.x));
    const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&a.y));
    const float2 f2 = __half22float2(*reinterpret_cast<const __half2*>(&a.z));
    const float2 f3 = __half22float2(*reinterpret_cast<const __half2*>(&a.w));
    acc = fmaf(f0.x, x0.x, fmaf(f0.y, x0.y, fmaf(f1.x, x0.z, fmaf(f1.y, x0.w, acc))));
    return fmaf(f2.x, x1.x, fmaf(f2.y, x1.y, fmaf(f3.x, x1.z, fmaf(f3.y, x1.w, acc))));
}

// This thread's chunks of 8 columns of x (c, c + kDeltaThreads, ...) against A's rows j0 .. j0 + 15.
// (acc may hold more than 16 sums; the first 16 are these.)
template <int N>
__device__ __forceinline__ void lora_pass(const __half* A, int r, int j0, int64_t k, int64_t c, const float4* xs,
                                          float (&acc)[N]) {
    for (; c < k / 8; c += kDeltaThreads) {
        const float4 x0 = xs[2 * c], x1 = xs[2 * c + 1];
        uint4 w[kDeltaRanks];
#pragma unroll
        for (int j = 0; j < kDeltaRanks; ++j) w[j] = j0 + j < r ? ld16(A + (j0 + j) * k + c * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < kDeltaRanks; ++j) acc[j] = dot8(w[j], x0, x1, acc[j]);
    }
}

// The block's sums of acc[0 .. N): sums[j] (every thread reads them after the call).
template <int N>
__device__ __forceinline__ void lora_sum(float (&acc)[N], float (*part)[kDeltaRanks + 1], float* sums) {
    const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = warp_sum(acc[j]);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < N; ++j) part[warp][j] = acc[j];
    __syncthreads();
    if (tid < N) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kDeltaThreads / 32; ++w) sum += part[w][tid];
        sums[tid] = sum;
    }
    __syncthreads();
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
__device__ __forceinline__ float sq4(float4 a, float s) { return fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, s)))); }

// grid: product 0's row blocks, then product 1's from block b1, product 2's from b2; a row a thread.
// Each block makes its product's t = scale A x itself (no block waits for another), in passes of 16
// ranks: a thread takes its chunks of 8 columns of x against 16 rows of A, then the block sums the
// partials. A thread reads only its own chunks of x, so staging them (x * pro_w, in shared memory for
// the later passes) needs no barrier, and the norm's sum of squares travels with the first pass's
// sums: the RMSNorm is a scale on t. The first pass's first chunk of A, pro_w's and the row's Bᵀ are
// loaded before the PDL wait (weights), the rest of that pass's A prefetched into L2, so that for a
// rank-16 adapter what follows the wait is x, one block sum and the stores. Dynamic shared memory:
// x * pro_w (k floats).
__global__ void __launch_bounds__(kDeltaThreads, 2) lora_delta_kernel(const __grid_constant__ LoraDeltaArgs a, int b1,
                                                                       int b2) {
    extern __shared__ float4 xs[];
    __shared__ float part[kDeltaThreads / 32][kDeltaRanks + 1];
    __shared__ float sums[kDeltaRanks + 1];
    pdl_trigger();
    const int blk = int(blockIdx.x);
    const int p = blk < b1 ? 0 : blk < b2 ? 1 : 2;
    const LoraDeltaProduct& P = a.p[p];
    const int tid = int(threadIdx.x);
    const int64_t row = int64_t(blk - (p == 0 ? 0 : p == 1 ? b1 : b2)) * kDeltaThreads + tid;
    const int64_t k = a.k, n_chunks = k / 8, n_out = P.n_out;
    const bool live = row < n_out, chunk = tid < n_chunks;
    const float4* w4 = reinterpret_cast<const float4*>(a.pro_w);

    const LoraSegDev& s0 = P.segs[0];
    const __half* A0 = static_cast<const __half*>(s0.a);
    uint4 wa[kDeltaRanks];
    float wb[kDeltaRanks];
#pragma unroll
    for (int j = 0; j < kDeltaRanks; ++j) {
        wa[j] = j < s0.r && chunk ? ld16(A0 + j * k + tid * 8) : make_uint4(0, 0, 0, 0);
        wb[j] = j < s0.r && live ? __half2float(static_cast<const __half*>(s0.bt)[j * n_out + row]) : 0.0f;
    }
    const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    const float4 n0 = w4 && chunk ? w4[2 * tid] : one, n1 = w4 && chunk ? w4[2 * tid + 1] : one;
    for (int64_t c = tid + kDeltaThreads; c < n_chunks; c += kDeltaThreads)
        for (int j = 0; j < s0.r && j < kDeltaRanks; ++j)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(A0 + j * k + c * 8));
    pdl_wait();

    const float4* src = reinterpret_cast<const float4*>(a.pro_x ? a.pro_x : a.x);
    float acc[kDeltaRanks + 1];
#pragma unroll
    for (int j = 0; j <= kDeltaRanks; ++j) acc[j] = 0.0f;
    if (chunk) {
        const float4 x0 = src[2 * tid], x1 = src[2 * tid + 1];
        acc[kDeltaRanks] = sq4(x1, sq4(x0, 0.0f));
        const float4 y0 = mul4(x0, n0), y1 = mul4(x1, n1);
        xs[2 * tid] = y0, xs[2 * tid + 1] = y1;
#pragma unroll
        for (int j = 0; j < kDeltaRanks; ++j) acc[j] = dot8(wa[j], y0, y1, acc[j]);
    }
    for (int64_t c = tid + kDeltaThreads; c < n_chunks; c += kDeltaThreads) {
        const float4 x0 = src[2 * c], x1 = src[2 * c + 1];
        acc[kDeltaRanks] = sq4(x1, sq4(x0, acc[kDeltaRanks]));
        xs[2 * c] = w4 ? mul4(x0, w4[2 * c]) : x0, xs[2 * c + 1] = w4 ? mul4(x1, w4[2 * c + 1]) : x1;
    }
    lora_pass(A0, s0.r, 0, k, tid + kDeltaThreads, xs, acc);
    lora_sum(acc, part, sums);
    const float norm = a.pro_x ? rsqrtf(sums[kDeltaRanks] / float(k) + a.pro_eps) : 1.0f;

    float out = 0.0f;
#pragma unroll
    for (int j = 0; j < kDeltaRanks; ++j) out = fmaf(s0.scale * norm * sums[j], wb[j], out);
    for (int q = 0; q < P.n_segs; ++q) {
        const LoraSegDev& sg = P.segs[q];
        const __half* Bt = static_cast<const __half*>(sg.bt);
        for (int j0 = q == 0 ? kDeltaRanks : 0; j0 < sg.r; j0 += kDeltaRanks) {
            float pacc[kDeltaRanks];
#pragma unroll
            for (int j = 0; j < kDeltaRanks; ++j) pacc[j] = 0.0f;
            lora_pass(static_cast<const __half*>(sg.a), sg.r, j0, k, tid, xs, pacc);
            lora_sum(pacc, part, sums);
#pragma unroll
            for (int j = 0; j < kDeltaRanks; ++j)
                if (j0 + j < sg.r && live) out = fmaf(sg.scale * norm * sums[j], __half2float(Bt[(j0 + j) * n_out + row]), out);
        }
    }
    if (live) P.delta[row] = (P.bias ? P.bias[row] : 0.0f) + out;
}

}  // namespace

void lora_segments(const float* x, float* y, float* t, int64_t k, int64_t n_out, int64_t n_rows,
                   const LoraSegDev* segs, int n_segs, Stream stream, const LoraExperts* experts) {
    const LoraExperts ex = experts ? *experts : LoraExperts{};
    CERA_CHECK(!experts || (ex.ids && ex.n_expert >= 1 && ex.x_div >= 1), "lora_segments: experts without ids");
    cudaStream_t s = as_stream(stream);
    for (int first = 0; first < n_segs; first += kLoraSegsPerLaunch) {
        LoraBatch b;
        int64_t most = 0;
        int r_max = 0;
        for (int i = first; i < n_segs && b.n < kLoraSegsPerLaunch; ++i) {
            if (segs[i].n == 0 || segs[i].r == 0) continue;
            b.s[b.n++] = segs[i];
            most = std::max(most, segs[i].n);
            r_max = std::max(r_max, segs[i].r);
        }
        if (b.n == 0) continue;
        const unsigned row_groups = unsigned(std::min<int64_t>(most, kDownRowGroups));
        bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
        for (int i = 0; i < b.n; ++i) vec = vec && reinterpret_cast<uintptr_t>(b.s[i].a) % 16 == 0;
        const dim3 down(unsigned(b.n), unsigned(r_max), row_groups);
        const dim3 up(unsigned((n_out + kUpThreads - 1) / kUpThreads), unsigned((n_rows + kUpRows - 1) / kUpRows));
        if (experts) {
            launch(lora_down_kernel<true>, down, kDownThreads, 0, s, x, t, k, vec, b, ex);
            launch(lora_up_kernel<true>, up, kUpThreads, 0, s, static_cast<const float*>(t), y, n_out, n_rows, b, ex);
        } else {
            launch(lora_down_kernel<false>, down, kDownThreads, 0, s, x, t, k, vec, b, ex);
            launch(lora_up_kernel<false>, up, kUpThreads, 0, s, static_cast<const float*>(t), y, n_out, n_rows, b, ex);
        }
    }
}

void lora_delta(const LoraDeltaArgs& a, Stream stream) {
    CERA_CHECK(a.n >= 1 && a.n <= kMaxSegs && a.k > 0 && a.k % 8 == 0 && a.k <= kLoraDeltaMaxK && (a.x || a.pro_x),
               "lora_delta: %d products of k %lld", a.n, (long long)a.k);
    int blocks[kMaxSegs + 1] = {};
    for (int p = 0; p < a.n; ++p) {
        const LoraDeltaProduct& P = a.p[p];
        CERA_CHECK(P.n_segs >= 1 && P.n_segs <= kLoraDeltaSegs, "lora_delta: %d segments", P.n_segs);
        for (int q = 0; q < P.n_segs; ++q) {
            const LoraSegDev& sg = P.segs[q];
            CERA_CHECK(sg.a_f16 && sg.bt_f16 && sg.r > 0 && reinterpret_cast<uintptr_t>(sg.a) % 16 == 0,
                       "lora_delta: A and Bᵀ as F16, A 16-byte aligned");
        }
        blocks[p + 1] = blocks[p] + int(ceil_div(P.n_out, kDeltaThreads));
    }
    for (int p = a.n; p < kMaxSegs; ++p) blocks[p + 1] = blocks[p];
    const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    CERA_CHECK(aligned(a.pro_x ? a.pro_x : a.x) && aligned(a.pro_w), "lora_delta: x and pro_w 16-byte aligned");
    const size_t smem = size_t(a.k) * sizeof(float);
    allow_dynamic_smem<lora_delta_kernel>(smem);
    launch(lora_delta_kernel, dim3(unsigned(blocks[a.n])), kDeltaThreads, smem, as_stream(stream), a, blocks[1],
           blocks[2]);
}

}  // namespace cera::cuda
