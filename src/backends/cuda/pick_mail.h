// The greedy pick's mailbox: argmax_feed's kernel also stores (pick << 32 | seq) into a ring in
// host-mapped pinned memory, seq counting the feeds (its counter lives in device memory), so the host
// learns the pick of a queued decode step without a copy on the stream between two steps' graphs
// (that copy measured ~8 us a token; bench/NOTES.md). The host mirrors the count of feeds it queued
// and spins on the ring slot of the one it wants.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <utility>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

class PickMailbox {
   public:
    PickMailbox() = default;
    PickMailbox(const PickMailbox&) = delete;
    PickMailbox& operator=(const PickMailbox&) = delete;
    ~PickMailbox();
    // Allocates the ring and the counter; false (and nothing held) where mapped memory is unavailable.
    bool init();
    PickMail device() const { return {dev_ring_, dev_seq_}; }
    // A feed into `out` was queued (an eager argmax_feed, or a graph launch that holds one).
    void queued(const void* out);
    // A ticket for the pick of the last feed queued into `out`, or -1 when there is none or it is too
    // old for the ring (the caller then copies `out` back instead).
    int ticket(const void* out);
    bool owns(int ticket) const { return ticket >= kBase && ticket < kBase + int(tickets_.size()); }
    // The pick of `ticket`: spins on its slot; when the stream has drained, the ring is searched once
    // more and a count that went out of step is an error (never a wrong pick).
    int32_t wait(int ticket, cudaStream_t stream);

   private:
    static constexpr int kBase = 1 << 20;
    void resync();
    unsigned long long* host_ = nullptr;  // the ring, host side
    unsigned long long* dev_ring_ = nullptr;
    unsigned* dev_seq_ = nullptr;
    uint32_t seq_ = 0;  // feeds queued
    std::array<std::pair<const void*, uint32_t>, 16> last_{};  // out tensor -> seq of its last feed
    std::array<uint32_t, 8> tickets_{};
    int next_ = 0;
};

}  // namespace cera::cuda
