// The F16 expansions of whole quantized weights for the cuBLAS prefill path (cuda_backend.cpp), made
// on a weight's first batched matmul and kept, instead of re-expanding it for every prefill chunk,
// while the cached copies stay under half the device memory that was free at the first one.
#pragma once
#include <cstddef>
#include <unordered_map>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

class W16Cache {
   public:
    W16Cache() = default;
    W16Cache(const W16Cache&) = delete;
    W16Cache& operator=(const W16Cache&) = delete;
    ~W16Cache();
    // The expansion of w's whole image (rows from 0), made on `stream` when it is not cached yet; null
    // when it is not cached and cannot be (over budget, out of memory, or `capturing` a graph).
    const void* get(const WeightRef& w, bool capturing, Stream stream);
    // Frees the expansion of the image (image_rows x k), if there is one.
    void drop(const void* image, int64_t image_rows, int64_t k);
    size_t bytes() const { return bytes_; }  // every expansion

   private:
    std::unordered_map<const void*, void*> map_;  // weight image -> its expansion
    size_t bytes_ = 0;
    long long budget_ = -1;  // bytes; -1 until the first expansion asks
};

}  // namespace cera::cuda
