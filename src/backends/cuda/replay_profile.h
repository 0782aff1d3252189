// CudaOptions::profile: the GPU time of each graph replay (events around it) and the host time between
// consecutive replays (gaps over 5 ms, between runs, are left out); printed when the backend goes.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

#include "backends/cuda/cuda_check.h"

namespace cera::cuda {

class ReplayProfile {
   public:
    ReplayProfile() {
        CUDA_CHECK(cudaEventCreate(&ev_[0]));
        CUDA_CHECK(cudaEventCreate(&ev_[1]));
    }
    ReplayProfile(const ReplayProfile&) = delete;
    ReplayProfile& operator=(const ReplayProfile&) = delete;
    ~ReplayProfile() {
        cudaEventDestroy(ev_[0]);
        cudaEventDestroy(ev_[1]);
    }
    // Before a replay: settles the previous one and marks this one's start.
    void begin(cudaStream_t s) {
        const auto now = std::chrono::steady_clock::now();
        if (pending_) {
            CUDA_CHECK(cudaEventSynchronize(ev_[1]));
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
            gpu_us_ += 1000.0 * ms, ++n_;
            const double gap = std::chrono::duration<double, std::micro>(now - last_).count();
            if (gap < 5000.0) gap_us_ += gap, ++gap_n_;
            pending_ = false;
        }
        last_ = now;
        CUDA_CHECK(cudaEventRecord(ev_[0], s));
    }
    void end(cudaStream_t s) {
        CUDA_CHECK(cudaEventRecord(ev_[1], s));
        pending_ = true;
    }
    void print(cudaStream_t s) {
        begin(s);
        if (n_ > 0)
            std::fprintf(stderr, "cuda profile: %lld graph replays, GPU %.1f us each; replay-to-replay %.1f us (%lld)\n",
                         n_, gpu_us_ / double(n_), gap_n_ ? gap_us_ / double(gap_n_) : 0.0, gap_n_);
    }

   private:
    cudaEvent_t ev_[2] = {nullptr, nullptr};
    bool pending_ = false;
    long long n_ = 0, gap_n_ = 0;
    double gpu_us_ = 0.0, gap_us_ = 0.0;
    std::chrono::steady_clock::time_point last_{};
};

}  // namespace cera::cuda
