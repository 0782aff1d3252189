#include "backends/cuda/pick_mail.h"

#include <atomic>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define CERA_CPU_RELAX() _mm_pause()
#else
#define CERA_CPU_RELAX() ((void)0)
#endif

namespace cera::cuda {

PickMailbox::~PickMailbox() {
    if (host_) cudaFreeHost(host_);
    if (dev_seq_) cudaFree(dev_seq_);
}

bool PickMailbox::init() {
    void* h = nullptr;
    if (cudaHostAlloc(&h, sizeof(unsigned long long) * kPickMailSlots, cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess || cudaMalloc(&dev_seq_, sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(dev_seq_, 0, sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeHost(h);
        if (dev_seq_) cudaFree(dev_seq_);
        dev_seq_ = nullptr;
        return false;
    }
    host_ = static_cast<unsigned long long*>(h);
    for (int i = 0; i < kPickMailSlots; ++i) host_[i] = 0;  // seq 0 is never a feed's
    dev_ring_ = static_cast<unsigned long long*>(d);
    seq_ = 0;
    last_.fill({nullptr, 0});
    return true;
}

void PickMailbox::queued(const void* out) {
    ++seq_;
    size_t at = 0;  // out's entry, else the oldest one
    for (size_t i = 0; i < last_.size(); ++i) {
        if (last_[i].first == out) {
            at = i;
            break;
        }
        if (seq_ - last_[i].second > seq_ - last_[at].second) at = i;
    }
    last_[at] = {out, seq_};
}

int PickMailbox::ticket(const void* out) {
    uint32_t seq = 0;
    for (const auto& [p, s] : last_)
        if (p == out && s != 0) seq = s;
    // Two more feeds (the step queued ahead, and one spare) may land before the wait.
    if (seq == 0 || seq_ - seq >= uint32_t(kPickMailSlots - 2)) return -1;
    const int t = next_;
    next_ = (next_ + 1) % int(tickets_.size());
    tickets_[size_t(t)] = seq;
    return kBase + t;
}

int32_t PickMailbox::wait(int ticket, cudaStream_t stream) {
    const uint32_t want = tickets_[size_t(ticket - kBase)];
    auto look = [&](int slot, int32_t& pick) {
        const unsigned long long v = std::atomic_ref<unsigned long long>(host_[slot]).load(std::memory_order_acquire);
        if (uint32_t(v) != want) return false;
        pick = int32_t(uint32_t(v >> 32));
        return true;
    };
    const int slot = int(want % kPickMailSlots);
    int32_t pick = 0;
    for (uint32_t spin = 1;; ++spin) {
        if (look(slot, pick)) return pick;
        if (spin % 4096 == 0) {
            const cudaError_t e = cudaStreamQuery(stream);
            if (e == cudaSuccess) break;  // drained: the kernel's store is visible by now
            if (e != cudaErrorNotReady) CUDA_CHECK(e);
        }
        CERA_CPU_RELAX();
    }
    for (int i = 0; i < kPickMailSlots; ++i)
        if (look(i, pick)) return pick;
    resync();
    CERA_CHECK(false, "cuda: the greedy pick %u never reached its mailbox (feed count out of step)", want);
    return 0;
}

void PickMailbox::resync() {
    unsigned s = 0;
    if (cudaMemcpy(&s, dev_seq_, sizeof s, cudaMemcpyDeviceToHost) == cudaSuccess) seq_ = s;
    last_.fill({nullptr, 0});
}

}  // namespace cera::cuda
