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

}  // namespace
}  // namespace cera::cuda
