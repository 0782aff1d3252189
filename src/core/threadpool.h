// A persistent pool of worker threads for the hot path: parallel_for splits
// [0, n) into one contiguous range per thread and blocks until all are done.
// No allocation per call; the calling thread works as thread 0.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace cera {

class ThreadPool {
   public:
    // n_threads >= 1 (the caller counts as one of them).
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(ctx, thread_index, n_threads) once on each thread and waits.
    void run(void (*fn)(void* ctx, int thread, int n_threads), void* ctx);

    // Calls body(begin, end, thread) with [begin, end) a share of [0, n), split evenly
    // in multiples of `grain` (the last share takes the rest).
    template <class F>
    void parallel_for(int64_t n, F&& body, int64_t grain = 1) {
        using Body = std::remove_reference_t<F>;
        struct Ctx {
            Body* body;
            int64_t n, grain;
        } ctx{&body, n, grain < 1 ? 1 : grain};
        run(
            [](void* p, int t, int nt) {
                auto* c = static_cast<Ctx*>(p);
                const int64_t chunks = (c->n + c->grain - 1) / c->grain;
                const int64_t b = chunks * t / nt * c->grain;
                int64_t e = chunks * (t + 1) / nt * c->grain;
                if (e > c->n) e = c->n;
                if (b < e) (*c->body)(b, e, t);
            },
            &ctx);
    }

   private:
    void worker(int index);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    void (*fn_)(void*, int, int) = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    bool stop_ = false;
    std::atomic<int> pending_{0};
};

}  // namespace cera
