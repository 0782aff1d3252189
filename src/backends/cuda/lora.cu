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

// grid (segments, largest rank, row groups). vec: k is a multiple of 4 (rows and A's rows 16-byte aligned).
__global__ void __launch_bounds__(kDownThreads) lora_down_kernel(const float* __restrict__ x, float* t, int64_t k,
                                                                   bool vec, const LoraBatch b) {
    __shared__ float red[32];
    pdl_trigger();
    pdl_wait();
    const LoraSegDev& sg = b.s[blockIdx.x];
    const int j = blockIdx.y;
    if (j >= sg.r) return;
    const int64_t a0 = int64_t(j) * k;
    for (int64_t i = blockIdx.z; i < sg.n; i += gridDim.z) {
        const float* xr = x + (sg.start + i) * k;
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

// grid (column blocks, row groups of kUpRows).
__global__ void __launch_bounds__(kUpThreads) lora_up_kernel(const float* __restrict__ t, float* y, int64_t n_out,
                                                              int64_t n_rows, const LoraBatch b) {
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
#pragma unroll 8
            for (int j = 0; j < nj; ++j) {
                const float w = at(sg.bt, sg.bt_f16, int64_t(j0 + j) * n_out + c);
#pragma unroll
                for (int i = 0; i < kUpRows; ++i) acc[i] = fmaf(st[i][j], w, acc[i]);
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

}  // namespace

void lora_segments(const float* x, float* y, float* t, int64_t k, int64_t n_out, int64_t n_rows,
                   const LoraSegDev* segs, int n_segs, Stream stream) {
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
        launch(lora_down_kernel, dim3(unsigned(b.n), unsigned(r_max), row_groups), kDownThreads, 0, s, x, t, k, vec, b);
        launch(lora_up_kernel, dim3(unsigned((n_out + kUpThreads - 1) / kUpThreads), unsigned((n_rows + kUpRows - 1) / kUpRows)),
               kUpThreads, 0, s, static_cast<const float*>(t), y, n_out, n_rows, b);
    }
}

}  // namespace cera::cuda
