#include "backends/cuda/w16_cache.h"

#include <cuda_runtime.h>

#include <cstdlib>

#include "backends/cuda/cuda_check.h"

namespace cera::cuda {

W16Cache::~W16Cache() {
    for (auto& [img, p] : map_) cudaFree(p);
}

const void* W16Cache::get(const WeightRef& w, bool capturing, Stream stream) {
    if (auto it = map_.find(w.image); it != map_.end()) return it->second;
    if (capturing || budget_ == 0) return nullptr;
    if (budget_ < 0) {
        size_t free_b = 0, total_b = 0;
        budget_ = cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ? 0 : static_cast<long long>(free_b / 2);
        if (budget_ == 0) return nullptr;
    }
    const size_t bytes = size_t(w.image_rows * w.k) * 2;
    if (bytes_ + bytes > size_t(budget_)) return nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();  // clear the allocation error; the scratch path still works
        budget_ = 0;
        return nullptr;
    }
    WeightRef all = w;
    all.row0 = 0;
    dequantize_rows(all, nullptr, w.image_rows, 1.0f, p, true, stream);
    map_[w.image] = p;
    bytes_ += bytes;
    return p;
}

void W16Cache::drop(const void* image, int64_t image_rows, int64_t k) {
    auto it = map_.find(image);
    if (it == map_.end()) return;
    CUDA_CHECK(cudaFree(it->second));
    bytes_ -= size_t(image_rows * k) * 2;
    map_.erase(it);
}

}  // namespace cera::cuda
