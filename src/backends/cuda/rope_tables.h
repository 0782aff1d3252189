// The (cos, sin) tables of the RoPE rotations for decode (cuda_backend.cpp): one per rotation, for the
// positions below the cache length, so that the step's RoPE kernels load the angles instead of
// computing them in double. Made outside recorded steps and kept.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

class RopeTables {
   public:
    RopeTables() = default;
    RopeTables(const RopeTables&) = delete;
    RopeTables& operator=(const RopeTables&) = delete;
    ~RopeTables();
    // Points r at the table of its rotation for positions 0 .. rows - 1, made on `stream` when there is
    // none or it is too short; leaves r without one while `capturing` a graph would need a new table,
    // or when there is nothing to rotate. A longer table replaces the old one: `before_free` runs first
    // (it must wait for the stream and forget whatever recorded the old address).
    void attach(RopeArgs& r, int64_t rows, bool capturing, Stream stream, const std::function<void()>& before_free);
    size_t bytes() const;  // every table

   private:
    struct Table {
        float* ptr = nullptr;  // [rows, n_rot / 2, 2]
        int64_t rows = 0;
    };
    std::map<std::tuple<int, int, float, float, const float*>, Table> map_;
};

}  // namespace cera::cuda
