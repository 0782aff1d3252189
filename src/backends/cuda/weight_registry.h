// The weights uploaded to one CUDA backend (upload_weight): their device images (kernels.h), and the
// map from any pointer inside a weight's GGUF-sized span (row slices, experts) to its image and first
// row, which is how the backend finds the image behind a weight view.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>

#include "backends/cuda/kernels.h"
#include "backends/backend.h"

namespace cera::cuda {

struct WeightInfo {
    void* image = nullptr;
    size_t bytes = 0;       // image bytes
    size_t gguf_bytes = 0;  // rows * row_size(type, k): the span Tensor pointers move in
    GgmlType type = GgmlType::kF32;
    int64_t rows = 0, k = 0;
};

class WeightRegistry {
   public:
    WeightRegistry() = default;
    WeightRegistry(const WeightRegistry&) = delete;
    WeightRegistry& operator=(const WeightRegistry&) = delete;
    ~WeightRegistry();  // frees every image
    // Uploads a [rows, k] GGUF weight of `type` and returns its image, which stands for the weight's
    // first byte. A type without a kernel is expanded to F16 on the host: `type` becomes kF16.
    void* upload(GgmlType& type, int64_t rows, int64_t k, const void* host);
    // The weight whose image starts at p, or null; erase() frees it.
    const WeightInfo* at(const void* p) const;
    void erase(const void* p);
    // The image and row behind t, a view of an uploaded weight (ref fails with a clear error when t
    // is not one); ref_or_buffer: t itself when it is a plain buffer.
    WeightRef ref(const Tensor& t) const;
    WeightRef ref_or_buffer(const Tensor& t) const;
    size_t bytes() const;  // every image

   private:
    const WeightInfo* find(const void* p, int64_t* row0) const;
    std::map<uintptr_t, WeightInfo> map_;  // image address -> weight
};

}  // namespace cera::cuda
