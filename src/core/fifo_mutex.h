// A mutex that hands itself over in the order the lockers came (a ticket lock), and tells its holder
// whether anyone is waiting. Backend::exec_mutex is one: a long holder (an image encode) gives the
// backend to a waiting batch step between its layers, and takes it back after that step, where a
// plain mutex would let whichever thread asks again first win every time.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace cera {

class FifoMutex {
 public:
    void lock() {
        std::unique_lock<std::mutex> lk(mu_);
        const uint64_t ticket = next_++;
        cv_.wait(lk, [&] { return serving_ == ticket; });
    }
    void unlock() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            ++serving_;
            if (next_ == serving_) return;  // nobody waits
        }
        cv_.notify_all();
    }
    // For the holder: whether another thread waits for the lock.
    bool contended() const {
        std::lock_guard<std::mutex> lk(mu_);
        return next_ > serving_ + 1;
    }

 private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    uint64_t next_ = 0;     // the ticket the next locker takes
    uint64_t serving_ = 0;  // the ticket that holds the lock (or takes it next)
};

}  // namespace cera
