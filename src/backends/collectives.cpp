#include "backends/collectives.h"

#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/check.h"

namespace cera {
namespace {

// all_reduce over host buffers: each rank publishes its x; rank r adds up the r-th piece of every rank's
// x (ranks in order, so every element is the same sum on every rank) and writes it into all of them.
class HostCommunicator final : public Communicator {
 public:
    explicit HostCommunicator(int world)
        : world_(world), sync_(world), slots_(size_t(world)), boxes_(size_t(std::max(world - 1, 1))) {}
    int world() const override { return world_; }

    void all_reduce(int rank, Backend& be, const Tensor& x) override {
        (void)be;
        CERA_CHECK(x.type == GgmlType::kF32 && rank >= 0 && rank < world_, "all_reduce: rank %d of %d", rank, world_);
        const int64_t n = x.n_elements();
        slots_[size_t(rank)] = {x.as<float>(), n};
        sync_.arrive_and_wait();
        for (int r = 0; r < world_; ++r)
            CERA_CHECK(slots_[size_t(r)].n == n, "all_reduce: rank %d has %lld elements, rank %d %lld", r,
                       (long long)slots_[size_t(r)].n, rank, (long long)n);
        const int64_t b = n * rank / world_, e = n * (rank + 1) / world_;
        for (int64_t i = b; i < e; ++i) {
            float s = slots_[0].p[i];
            for (int r = 1; r < world_; ++r) s += slots_[size_t(r)].p[i];
            for (int r = 0; r < world_; ++r) slots_[size_t(r)].p[i] = s;
        }
        sync_.arrive_and_wait();
    }

    void all_gather_cols(int rank, Backend& be, const Tensor& local, const Tensor& full, int64_t col0) override {
        (void)be;
        check_gather_cols(rank, local, full, col0);
        pieces_[size_t(rank)] = {local.as<const float>(), local.ne[0], col0};
        sync_.arrive_and_wait();
        const int64_t rows = full.rows(), width = full.ne[0];
        for (const Piece& p : pieces_)
            for (int64_t r = 0; r < rows; ++r)
                std::copy(p.data + r * p.width, p.data + (r + 1) * p.width, full.as<float>() + r * width + p.col0);
        sync_.arrive_and_wait();  // every rank has read every piece
    }

    // One mailbox a stage boundary: rank's send() waits until the box is empty, fills it, recv() of rank
    // + 1 waits until it is full and empties it.
    void send(int rank, Backend& be, const Tensor& x) override {
        (void)be;
        CERA_CHECK(x.type == GgmlType::kF32 && rank >= 0 && rank + 1 < world_, "send: rank %d of %d", rank, world_);
        Box& b = boxes_[size_t(rank)];
        std::unique_lock<std::mutex> lk(b.mu);
        b.cv.wait(lk, [&] { return !b.full; });
        b.data.assign(x.as<const float>(), x.as<const float>() + x.n_elements());
        b.full = true;
        b.cv.notify_all();
    }
    void recv(int rank, Backend& be, const Tensor& x) override {
        (void)be;
        CERA_CHECK(x.type == GgmlType::kF32 && rank >= 1 && rank < world_, "recv: rank %d of %d", rank, world_);
        Box& b = boxes_[size_t(rank - 1)];
        std::unique_lock<std::mutex> lk(b.mu);
        b.cv.wait(lk, [&] { return b.full; });
        CERA_CHECK(int64_t(b.data.size()) == x.n_elements(), "recv: %zu elements sent, %lld expected", b.data.size(),
                   (long long)x.n_elements());
        std::copy(b.data.begin(), b.data.end(), x.as<float>());
        b.full = false;
        b.cv.notify_all();
    }

 private:
    struct Box {
        std::mutex mu;
        std::condition_variable cv;
        std::vector<float> data;
        bool full = false;
    };
    struct Slot {
        float* p = nullptr;
        int64_t n = 0;
    };
    struct Piece {
        const float* data = nullptr;
        int64_t width = 0, col0 = 0;
    };
    int world_;
    std::barrier<> sync_;
    std::vector<Slot> slots_;
    std::vector<Box> boxes_;  // [world - 1]: box r carries rank r's output to rank r + 1
    std::vector<Piece> pieces_ = std::vector<Piece>(size_t(world_));
};

}  // namespace

std::unique_ptr<Communicator> make_host_communicator(int world) {
    CERA_CHECK(world >= 1, "make_host_communicator: world %d", world);
    return std::make_unique<HostCommunicator>(world);
}

// Defined by the CUDA backend (src/backends/cuda/collectives.cpp) when it is linked in, as
// make_cuda_backend is.
__attribute__((weak)) std::unique_ptr<Communicator> make_cuda_communicator(std::span<Backend* const> ranks);

std::unique_ptr<Communicator> make_communicator(std::span<Backend* const> ranks) {
    CERA_CHECK(!ranks.empty(), "make_communicator: no ranks");
    const DeviceKind kind = ranks[0]->kind();
    for (Backend* be : ranks)
        CERA_CHECK(be->kind() == kind, "make_communicator: ranks on %s and %s", device_kind_name(kind),
                   device_kind_name(be->kind()));
    if (kind == DeviceKind::kCpu) return make_host_communicator(int(ranks.size()));
    CERA_CHECK(&make_cuda_communicator != nullptr, "make_communicator: this build has no CUDA backend");
    return make_cuda_communicator(ranks);
}

}  // namespace cera
