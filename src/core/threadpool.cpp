#include "core/threadpool.h"

#include <immintrin.h>

#include <chrono>

#include "core/check.h"

namespace cera {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(void (*fn)(void*, int, int), void* ctx) {
    if (n_threads_ == 1) {
        fn(ctx, 0, 1);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = fn;
        ctx_ = ctx;
        pending_.store(n_threads_ - 1, std::memory_order_relaxed);
        ++generation_;
    }
    cv_.notify_all();
    fn(ctx, 0, n_threads_);
    // Spin briefly, then yield: workers finish at about the same time as thread 0.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins > 2000) std::this_thread::yield();
    }
}

// A worker that finished its share watches for the next call this long before it sleeps on the
// condition variable. Decode runs a few hundred short parallel calls a token with a little serial
// work between them; a futex wake-up per call costs about as much as the call itself. Longer spins
// cost the machine's other jobs their cores (and the pool its wake-up priority) when it is loaded.
constexpr auto kSpin = std::chrono::microseconds(20);

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        void (*fn)(void*, int, int);
        void* ctx;
        const auto until = std::chrono::steady_clock::now() + kSpin;
        for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
            _mm_pause();
            if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
        }
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return generation_ != seen; });
            seen = generation_;
            if (stop_) return;
            fn = fn_;
            ctx = ctx_;
        }
        fn(ctx, index, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace cera
