// Row arg-max for greedy decoding on the device: the decode step ends in the chosen token id, and
// only those 4 bytes cross PCIe instead of the n_vocab logits (~200 KB for a 50k vocabulary).
// Idea: one block of 1024 threads per row. Each thread keeps a running (value, index) best over a
// strided share of the row read with 16-byte loads (a scalar head up to the first 16-byte boundary and
// a scalar tail), then warp shuffles and one shared-memory round combine the 32 warps. The order
// (larger value, then lower index) is a total order on non-NaN values, so the result is the lowest
// index of the maximum whatever the split; NaN never compares larger or equal, and a row with no
// non-NaN value gives 0 — exactly the host sampler's greedy pick (Backend::argmax, argmax_rows_host).
// Roofline: bytes = rows * n * 4 read once (the logits, usually still in L2 after the LM head); one
// row is one SM's worth of loads (~170 GB/s), so at batch 1 it is launch-latency bound: measured on
// the H200, back-to-back launches take 3.3 us for n <= 4k, 3.6 us for 50257, 4.3 us for 65536 and
// 6.8 us for 151936. It replaces a 200 KB-600 KB device-to-host copy plus a host pass over it.
// One row of at least 16k entries (a decode step's logits) is split over up to 128 blocks that merge
// in the last one to finish (argmax_split_kernel), so many SMs read it.
// argmax_feed: the same kernels also write the pick and the next position into the next step's inputs,
// so a greedy decode queues that step before the host has seen the pick (EvalRequest::ahead).
#include <climits>
#include <cstdlib>

#include "backends/cuda/pick_device.cuh"

namespace cera::cuda {
namespace {

constexpr int kThreads = 1024;

// feed_ids / feed_pos (one row only, or null): see write_pick.
__global__ void __launch_bounds__(kThreads) argmax_rows_kernel(const float* __restrict__ x, int64_t n, int32_t* out,
                                                               int32_t* feed_ids, int32_t* feed_pos, int64_t pos_last,
                                                               PickMail mail) {
    pdl_trigger();
    const unsigned seq_before = mail_seq(mail);
    pdl_wait();  // the logits come from the kernel before
    __shared__ float s_best[32];
    __shared__ int s_idx[32];
    const float* row = x + int64_t(blockIdx.x) * n;
    float best = -INFINITY;
    int bi = INT_MAX;  // no index yet: -inf itself is taken by the first -inf seen

    // Scalar head up to the first 16-byte boundary, 16-byte body, scalar tail.
    const int64_t to_boundary = int64_t((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) / 4;
    const int64_t head = to_boundary < n ? to_boundary : n;
    const int64_t n_vec = (n - head) / 4;
    const int64_t tail = head + 4 * n_vec;
    if (threadIdx.x < head) take(row[threadIdx.x], int(threadIdx.x), best, bi);
    const float4* body = reinterpret_cast<const float4*>(row + head);
    // kBatch loads in flight per thread before any comparison: one L2 round trip per batch, not per load.
    constexpr int kBatch = 8;
    for (int64_t j0 = threadIdx.x; j0 < n_vec; j0 += int64_t(kBatch) * kThreads) {
        float4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t j = j0 + int64_t(b) * kThreads;
            v[b] = j < n_vec ? body[j] : make_float4(NAN, NAN, NAN, NAN);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int i = int(head + 4 * (j0 + int64_t(b) * kThreads));
            take(v[b].x, i, best, bi);
            take(v[b].y, i + 1, best, bi);
            take(v[b].z, i + 2, best, bi);
            take(v[b].w, i + 3, best, bi);
        }
    }
    if (tail + threadIdx.x < n) take(row[tail + threadIdx.x], int(tail + threadIdx.x), best, bi);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_argmax(best, bi);
    if (lane == 0) s_best[warp] = best, s_idx[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        best = s_best[lane];  // kThreads / 32 == 32 warps: every lane has one
        bi = s_idx[lane];
        warp_argmax(best, bi);
        if (lane == 0) write_pick(bi, out + blockIdx.x, feed_ids, feed_pos, pos_last, mail, seq_before);
    }
}

// One long row (a decode step's logits) split over blocks of kSplitThreads threads, kSplitItems values a
// thread (coalesced scalar loads, all in flight before any comparison): each block writes its best
// (value, index) to the scratch, and the last block to finish (an atomic counter, reset by that block)
// takes the best of those and writes the pick (and feeds it). The same total order as above, so the
// result does not depend on the split. Many SMs read the row instead of one.
constexpr int kSplitThreads = 256, kSplitItems = 8;
__global__ void __launch_bounds__(kSplitThreads) argmax_split_kernel(const float* __restrict__ x, int64_t n,
                                                                     int32_t* out, int32_t* feed_ids,
                                                                     int32_t* feed_pos, int64_t pos_last,
                                                                     SplitPick sp, PickMail mail) {
    pdl_trigger();
    const unsigned seq_before = mail_seq(mail);
    pdl_wait();
    const int64_t lo = int64_t(blockIdx.x) * kSplitThreads * kSplitItems;
    float v[kSplitItems];
#pragma unroll
    for (int k = 0; k < kSplitItems; ++k) {
        const int64_t i = lo + threadIdx.x + int64_t(k) * kSplitThreads;
        v[k] = i < n ? x[i] : NAN;
    }
    float best = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int k = 0; k < kSplitItems; ++k) take(v[k], int(lo + threadIdx.x + k * kSplitThreads), best, bi);
    split_pick<kSplitThreads / 32>(best, bi, sp, out, feed_ids, feed_pos, pos_last, mail, seq_before);
}

// The split kernel for one row of at least kSplitMinN values, when the scratch is there.
constexpr int64_t kSplitMinN = 16384;
bool split_launch(const float* x, int64_t n, int32_t* out, int32_t* ids, int32_t* pos, int64_t pos_last,
                  void* scratch, cudaStream_t s, PickMail mail) {
    const int64_t blocks = ceil_div(n, int64_t(kSplitThreads) * kSplitItems);
    if (!scratch || n < kSplitMinN || blocks > kArgmaxSplitBlocks) return false;
    launch(argmax_split_kernel, dim3(unsigned(blocks)), dim3(kSplitThreads), 0, s, x, n, out, ids, pos, pos_last,
           split_pick_scratch(scratch), mail);
    return true;
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, Stream stream, void* scratch) {
    if (rows == 0) return;
    CERA_CHECK(n > 0 && n < INT_MAX && rows < INT_MAX, "argmax_rows: %lld rows of %lld", (long long)rows,
               (long long)n);
    if (rows == 1 && split_launch(x, n, out, nullptr, nullptr, 0, scratch, as_stream(stream), PickMail{})) return;
    launch(argmax_rows_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, as_stream(stream), x, n, out,
           static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int64_t(0), PickMail{});
}

void argmax_feed(const float* x, int64_t n, int32_t* out, int32_t* ids, int32_t* pos, int64_t pos_last, Stream stream,
                 void* scratch, PickMail mail) {
    CERA_CHECK(n > 0 && n < INT_MAX && ids && pos && pos_last >= 0, "argmax_feed: a row of %lld", (long long)n);
    CERA_CHECK((mail.ring == nullptr) == (mail.seq == nullptr), "argmax_feed: a mailbox needs its ring and counter");
    if (split_launch(x, n, out, ids, pos, pos_last, scratch, as_stream(stream), mail)) return;
    launch(argmax_rows_kernel, dim3(1), dim3(kThreads), 0, as_stream(stream), x, n, out, ids, pos, pos_last, mail);
}

}  // namespace cera::cuda
