#include "backends/cuda/rope_tables.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_check.h"

namespace cera::cuda {

RopeTables::~RopeTables() {
    for (auto& [key, t] : map_) cudaFree(t.ptr);
}

void RopeTables::attach(RopeArgs& r, int64_t rows, bool capturing, Stream stream,
                        const std::function<void()>& before_free) {
    if (r.mode == 0 || r.n_rot <= 0 || r.n_rot % 2 != 0 || rows <= 0 || rows > (1 << 16)) return;
    const auto key = std::make_tuple(r.mode, r.n_rot, r.freq_base, r.freq_scale, r.freq_factors);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.rows < rows) {
        if (capturing) return;  // nothing is allocated inside a recorded step
        if (it != map_.end()) {
            before_free();  // recorded graphs hold the old table
            CUDA_CHECK(cudaFree(it->second.ptr));
            map_.erase(it);
        }
        Table t;
        t.rows = rows;
        CUDA_CHECK(cudaMalloc(&t.ptr, size_t(rows) * size_t(r.n_rot / 2) * 2 * sizeof(float)));
        RopeArgs plain = r;
        plain.table = nullptr, plain.table_rows = 0;
        rope_table(plain, rows, t.ptr, stream);
        it = map_.emplace(key, t).first;
    }
    r.table = it->second.ptr, r.table_rows = it->second.rows;
}

size_t RopeTables::bytes() const {
    size_t n = 0;
    for (const auto& [key, t] : map_) n += size_t(t.rows) * size_t(std::get<1>(key) / 2) * 2 * sizeof(float);
    return n;
}

}  // namespace cera::cuda
