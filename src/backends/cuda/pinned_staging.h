// Small host transfers of the CUDA backend (cuda_backend.cpp) through pinned host memory: the step's
// token ids and positions, the picked token, logits rows. A write is copied into a ring and queued as
// a true asynchronous copy (the ring wraps after a stream synchronization, so no queued copy still
// reads the bytes it reuses); a read lands in its own pinned area; each asynchronous read has a slot
// and an event recorded after its copy, so waiting for it waits for nothing queued later. Larger
// transfers, and any while a step is being captured, are the caller's (the pageable path, which
// stages the bytes before returning).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "backends/backend.h"

namespace cera::cuda {

class PinnedStaging {
   public:
    PinnedStaging();  // without pinned memory every call declines
    PinnedStaging(const PinnedStaging&) = delete;
    PinnedStaging& operator=(const PinnedStaging&) = delete;
    ~PinnedStaging();

    bool available() const { return base_ != nullptr; }
    // Queues host -> dst (n bytes) on s and returns true, or false when the caller must copy it.
    bool write(void* dst, const void* host, size_t n, cudaStream_t s, bool capturing);
    // Copies src -> host (n bytes) after the work queued on s and returns true, or false as write().
    bool read(void* host, const void* src, size_t n, cudaStream_t s, bool capturing);
    // An asynchronous read of n <= Backend::kAsyncReadMax bytes (available() only): its ticket, valid
    // until Backend::kAsyncReads later calls; read_wait() waits for that copy and copies it out.
    int read_async(const void* src, size_t n, cudaStream_t s);
    void read_wait(int ticket, void* host);

   private:
    static constexpr size_t kRing = 2u << 20, kReadMax = 1u << 20;
    uint8_t* base_ = nullptr;  // kRing bytes of write ring, kReadMax for reads, then the async slots
    size_t ring_off_ = 0;
    std::array<cudaEvent_t, Backend::kAsyncReads> ev_{};
    std::array<size_t, Backend::kAsyncReads> n_{};
    int next_ = 0;
};

}  // namespace cera::cuda
