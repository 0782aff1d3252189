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

// The collectives of ranks whose tensors are host memory (CPU backends), one thread a rank.
std::unique_ptr<Communicator> make_host_communicator(int world);

// The collectives of these backends, rank r's at ranks[r]: host memory for CPU ranks; for CUDA ranks
// NCCL when each has a device of its own, device copies when they share one (a split simulated on one
// GPU, whose backends must run without graphs: the ranks meet on the host inside their steps).
std::unique_ptr<Communicator> make_communicator(std::span<Backend* const> ranks);

}  // namespace cera
