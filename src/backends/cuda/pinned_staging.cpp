// Pinned host staging of small transfers (pinned_staging.h).
#include "backends/cuda/pinned_staging.h"

#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace cera::cuda {

namespace {
constexpr size_t kAsyncArea = size_t(Backend::kAsyncReads) * Backend::kAsyncReadMax;
}  // namespace

PinnedStaging::PinnedStaging() {
    if (cudaHostAlloc(reinterpret_cast<void**>(&base_), kRing + kReadMax + kAsyncArea, cudaHostAllocDefault) !=
            cudaSuccess) {
        cudaGetLastError();  // no pinned memory: every transfer takes the pageable path
        base_ = nullptr;
        return;
    }
    for (cudaEvent_t& e : ev_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

PinnedStaging::~PinnedStaging() {
    if (!base_) return;
    cudaFreeHost(base_);
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
}

bool PinnedStaging::write(void* dst, const void* host, size_t n, cudaStream_t s, bool capturing) {
    if (!base_ || capturing || n > kReadMax) return false;
    if (ring_off_ + n > kRing) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        ring_off_ = 0;
    }
    std::memcpy(base_ + ring_off_, host, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, base_ + ring_off_, n, cudaMemcpyHostToDevice, s));
    ring_off_ += (n + 63) / 64 * 64;
    return true;
}

bool PinnedStaging::read(void* host, const void* src, size_t n, cudaStream_t s, bool capturing) {
    if (!base_ || capturing || n > kReadMax) return false;
    uint8_t* area = base_ + kRing;
    CUDA_CHECK(cudaMemcpyAsync(area, src, n, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::memcpy(host, area, n);
    return true;
}

int PinnedStaging::read_async(const void* src, size_t n, cudaStream_t s) {
    const int t = next_;
    next_ = (next_ + 1) % Backend::kAsyncReads;
    uint8_t* slot = base_ + kRing + kReadMax + size_t(t) * Backend::kAsyncReadMax;
    if (n) CUDA_CHECK(cudaMemcpyAsync(slot, src, n, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaEventRecord(ev_[size_t(t)], s));
    n_[size_t(t)] = n;
    return t;
}

void PinnedStaging::read_wait(int ticket, void* host) {
    CERA_CHECK(ticket >= 0 && ticket < Backend::kAsyncReads, "read_wait: ticket %d", ticket);
    CUDA_CHECK(cudaEventSynchronize(ev_[size_t(ticket)]));
    std::memcpy(host, base_ + kRing + kReadMax + size_t(ticket) * Backend::kAsyncReadMax, n_[size_t(ticket)]);
}

}  // namespace cera::cuda
