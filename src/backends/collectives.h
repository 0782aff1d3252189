// The collectives of the ranks of a tensor-parallel model (docs/tensor-parallel.md): the partial sums
// of a split product added up, the LM head's rows of the vocabulary gathered, a pipeline stage's
// residual stream handed on. Each rank calls them from its own thread, in the same order as every
// other rank, with its own backend's tensors; they take their place among the backend's ops (on the
// CPU they run at once, on CUDA on the rank's stream when its step runs).
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "backends/backend.h"
#include "core/check.h"

namespace cera {

class Communicator {
 public:
    virtual ~Communicator() = default;
    virtual int world() const = 0;
    // x (f32) becomes the sum of every rank's x, in rank order, on every rank.
    virtual void all_reduce(int rank, Backend& be, const Tensor& x) = 0;
    // full [rows, W] (f32) on every rank gets each rank's local [rows, w_r] at its columns [col0_r, col0_r +
    // w_r) (the ranks' ranges tile [0, W)).
    virtual void all_gather_cols(int rank, Backend& be, const Tensor& local, const Tensor& full, int64_t col0) = 0;
    // Pipeline stages: rank + 1's recv() of x (f32, the same shape) gets what rank's send() of x holds.
    virtual void send(int rank, Backend& be, const Tensor& x) = 0;
    virtual void recv(int rank, Backend& be, const Tensor& x) = 0;
};

// Communicator::all_gather_cols's arguments: f32 tensors of the same rows, local's columns inside full's
// from col0 (throws naming the rank's columns).
inline void check_gather_cols(int rank, const Tensor& local, const Tensor& full, int64_t col0) {
    CERA_CHECK(local.type == GgmlType::kF32 && full.type == GgmlType::kF32 && local.rows() == full.rows() &&
                   col0 >= 0 && col0 + local.ne[0] <= full.ne[0],
               "all_gather_cols: rank %d's columns %lld + %lld of %lld", rank, (long long)col0, (long long)local.ne[0],
               (long long)full.ne[0]);
}

// The collectives of ranks whose tensors are host memory (CPU backends), one thread a rank.
std::unique_ptr<Communicator> make_host_communicator(int world);

// The collectives of these backends, rank r's at ranks[r]: host memory for CPU ranks; for CUDA ranks
// NCCL when each has a device of its own, device copies when they share one (a split simulated on one
// GPU, whose backends must run without graphs: the ranks meet on the host inside their steps).
std::unique_ptr<Communicator> make_communicator(std::span<Backend* const> ranks);

}  // namespace cera
