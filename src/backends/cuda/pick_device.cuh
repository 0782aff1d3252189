// The greedy pick's device pieces shared by the arg-max kernels (argmax.cu) and the streamed LM head
// that makes the pick itself (gemv.cu): the order on (value, index) pairs, the warp reduction, and the
// writes of the pick into the output, the next step's inputs and the mailbox.
#pragma once
#include <climits>

#include "backends/cuda/common.cuh"

namespace cera::cuda {
namespace {

// (v, i) replaces (best, bi) when it is larger, or equal with a lower index. A total order on non-NaN
// values, so the result is the lowest index of the maximum whatever the split; NaN never compares
// larger or equal (a row of NaN keeps bi = INT_MAX: the pick is then 0).
__device__ __forceinline__ void take(float v, int i, float& best, int& bi) {
    if (v > best || (v == best && i < bi)) best = v, bi = i;
}

__device__ __forceinline__ void warp_argmax(float& best, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take(ob, oi, best, bi);
    }
}

// The row's pick from the best (value, index) (every value NaN: 0), and with feed_ids the next step's
// inputs: feed_ids[0] = the pick, feed_pos[0] = feed_pos[pos_last] + 1.
// With mail.ring, the pick also goes to the mailbox (kernels.h); seq_before is *mail.seq, read before
// the PDL wait (the previous step's feed wrote it; nothing in this step does before this kernel).
__device__ __forceinline__ void write_pick(int bi, int32_t* out, int32_t* feed_ids, int32_t* feed_pos,
                                           int64_t pos_last, const PickMail& mail, unsigned seq_before) {
    const int32_t pick = bi == INT_MAX ? 0 : bi;
    *out = pick;
    if (feed_ids) {
        feed_ids[0] = pick;
        feed_pos[0] = feed_pos[pos_last] + 1;
    }
    if (mail.ring) {
        const unsigned seq = seq_before + 1;
        *mail.seq = seq;
        *reinterpret_cast<volatile unsigned long long*>(mail.ring + seq % kPickMailSlots) =
            (static_cast<unsigned long long>(static_cast<uint32_t>(pick)) << 32) | seq;
    }
}
__device__ __forceinline__ unsigned mail_seq(const PickMail& mail) {
    return mail.ring && threadIdx.x == 0 ? *mail.seq : 0u;
}

// A pick split over blocks (argmax_split_kernel, the streamed LM head): in the arg-max scratch
// (kArgmaxScratchBytes) each block's best value and index, then the counter of finished blocks.
struct SplitPick {
    float* part_v;
    int* part_i;
    unsigned* counter;  // zero, left zero
};
inline SplitPick split_pick_scratch(void* scratch) {
    SplitPick p;
    p.part_v = static_cast<float*>(scratch);
    p.part_i = reinterpret_cast<int*>(p.part_v + kArgmaxSplitBlocks);
    p.counter = reinterpret_cast<unsigned*>(p.part_i + kArgmaxSplitBlocks);
    return p;
}
// Every thread of a block of kWarps warps passes its best (value, index): the block's best goes to the
// scratch, and the last block to finish takes the best of all blocks and writes the pick (write_pick).
template <int kWarps>
__device__ __forceinline__ void split_pick(float best, int bi, const SplitPick& sp, int32_t* out, int32_t* feed_ids,
                                           int32_t* feed_pos, int64_t pos_last, const PickMail& mail,
                                           unsigned seq_before) {
    __shared__ float s_best[kWarps];
    __shared__ int s_idx[kWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_argmax(best, bi);
    if (lane == 0) s_best[warp] = best, s_idx[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w) take(s_best[w], s_idx[w], best, bi);
        sp.part_v[blockIdx.x] = best;
        sp.part_i[blockIdx.x] = bi;
    }
    if (block_ticket(sp.counter) != gridDim.x - 1 || warp != 0) return;
    best = -INFINITY, bi = INT_MAX;
    for (int b = lane; b < int(gridDim.x); b += 32) take(__ldcg(sp.part_v + b), __ldcg(sp.part_i + b), best, bi);
    warp_argmax(best, bi);
    if (lane == 0) {
        write_pick(bi, out, feed_ids, feed_pos, pos_last, mail, seq_before);
        *sp.counter = 0;
    }
}

}  // namespace
}  // namespace cera::cuda
