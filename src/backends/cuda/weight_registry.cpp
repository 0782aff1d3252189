#include "backends/cuda/weight_registry.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"
#include "core/quant/quant.h"

namespace cera::cuda {

WeightRegistry::~WeightRegistry() {
    for (auto& [p, w] : map_) cudaFree(w.image);
}

void* WeightRegistry::upload(GgmlType& type, int64_t rows, int64_t k, const void* host) {
    std::vector<uint8_t> expanded;
    if (!weight_type_supported(type)) {  // no kernel for this type: F16, expanded once on the host
        expanded = expand_to_f16(type, host, rows, k);
        host = expanded.data();
        type = GgmlType::kF16;
    }
    WeightInfo w;
    w.type = type, w.rows = rows, w.k = k;
    w.bytes = weight_image_bytes(type, rows, k);
    w.gguf_bytes = row_size(type, k) * size_t(rows);
    // 64 spare bytes: the decode program copies 16-byte aligned windows around row ranges.
    CUDA_CHECK(cudaMalloc(&w.image, w.bytes + 64));
    if (quant_layout(type).block_elems > 0) {
        std::vector<uint8_t> img(w.bytes);
        make_weight_image(type, host, rows, k, img.data());
        CUDA_CHECK(cudaMemcpy(w.image, img.data(), w.bytes, cudaMemcpyHostToDevice));
    } else {
        CUDA_CHECK(cudaMemcpy(w.image, host, w.bytes, cudaMemcpyHostToDevice));
    }
    map_[reinterpret_cast<uintptr_t>(w.image)] = w;
    return w.image;
}

const WeightInfo* WeightRegistry::at(const void* p) const {
    auto it = map_.find(reinterpret_cast<uintptr_t>(p));
    return it == map_.end() ? nullptr : &it->second;
}

void WeightRegistry::erase(const void* p) {
    auto it = map_.find(reinterpret_cast<uintptr_t>(p));
    if (it == map_.end()) return;
    CUDA_CHECK(cudaFree(it->second.image));
    map_.erase(it);
}

const WeightInfo* WeightRegistry::find(const void* p, int64_t* row0) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = map_.upper_bound(a);
    if (it == map_.begin()) return nullptr;
    --it;
    const WeightInfo& w = it->second;
    if (a >= it->first + std::max<size_t>(w.gguf_bytes, 1)) return nullptr;
    const size_t rb = row_size(w.type, w.k);
    CERA_CHECK((a - it->first) % rb == 0, "a weight view that does not start on a row");
    *row0 = int64_t((a - it->first) / rb);
    return &w;
}

namespace {
WeightRef ref_of(const WeightInfo& w, const Tensor& t, int64_t row0) {
    CERA_CHECK(w.k == t.ne[0] && w.type == t.type, "weight view shape or type differs from the upload");
    WeightRef r;
    r.type = w.type, r.image = w.image, r.image_rows = w.rows, r.k = w.k, r.row0 = row0;
    return r;
}
}  // namespace

WeightRef WeightRegistry::ref(const Tensor& t) const {
    int64_t row0 = 0;
    const WeightInfo* w = find(t.data, &row0);
    CERA_CHECK(w != nullptr, "CUDA backend: a matmul/embed weight that was not made by upload_weight");
    return ref_of(*w, t, row0);
}

WeightRef WeightRegistry::ref_or_buffer(const Tensor& t) const {
    int64_t row0 = 0;
    if (const WeightInfo* w = find(t.data, &row0)) return ref_of(*w, t, row0);
    WeightRef r;
    r.type = t.type, r.image = t.data, r.image_rows = t.rows(), r.k = t.ne[0];
    return r;
}

size_t WeightRegistry::bytes() const {
    size_t n = 0;
    for (const auto& [addr, w] : map_) n += w.bytes;
    return n;
}

}  // namespace cera::cuda
