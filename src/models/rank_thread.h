// A thread that runs one job at a time for a rank of a split model (models/shard.h): the ranks' parts of
// a step run side by side and meet in their collectives.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>

namespace cera {

class RankThread {
 public:
    RankThread() : thread_([this] { loop(); }) {}
    ~RankThread() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void post(std::function<void()> job) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            job_ = std::move(job), done_ = false, error_ = nullptr;
        }
        cv_.notify_all();
    }
    // Waits for the posted job; what it threw.
    std::exception_ptr wait() {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return done_; });
        return error_;
    }

 private:
    void loop() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [this] { return stop_ || (!done_ && job_); });
            if (stop_) return;
            std::function<void()> job = std::move(job_);
            job_ = nullptr;
            lk.unlock();
            std::exception_ptr e;
            try {
                job();
            } catch (...) {
                e = std::current_exception();
            }
            lk.lock();
            error_ = e, done_ = true;
            cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> job_;
    bool done_ = true, stop_ = false;
    std::exception_ptr error_;
    std::thread thread_;
};

// f(r) for every rank r = 0 .. threads.size() at once, rank 0 on the calling thread and rank r on
// threads[r - 1]; rethrows the first rank's error once every rank is done.
inline void run_on_ranks(std::span<const std::unique_ptr<RankThread>> threads, const std::function<void(int)>& f) {
    for (size_t r = 1; r <= threads.size(); ++r) threads[r - 1]->post([&f, r] { f(int(r)); });
    std::exception_ptr first;
    try {
        f(0);
    } catch (...) {
        first = std::current_exception();
    }
    for (const auto& t : threads)
        if (std::exception_ptr e = t->wait(); e && !first) first = e;
    if (first) std::rethrow_exception(first);
}

}  // namespace cera
