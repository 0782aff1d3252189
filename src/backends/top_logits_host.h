// Backend::top_logits on host memory: the reference for every backend, and the CPU backend's
// implementation (inline so that any backend can fall back to it without a link dependency).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace cera {

inline void top_logits_host(const float* x, int64_t n, int32_t m, const int32_t* gather, int64_t n_g, int32_t* out) {
    const auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    // A threshold scan keeps at most 2 m indices: the best m of them become the bar to pass.
    std::vector<int32_t> keep;
    keep.reserve(size_t(2 * std::max(m, 1)));
    float bar = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n && m > 0; ++i) {
        if (!(x[i] > bar)) continue;  // NaN, -inf, or not above the bar (a later index loses a tie)
        keep.push_back(int32_t(i));
        if (keep.size() == size_t(2 * m)) {
            std::nth_element(keep.begin(), keep.begin() + (m - 1), keep.end(), better);
            keep.resize(size_t(m));
            bar = x[keep[size_t(m - 1)]];
        }
    }
    const int32_t c = int32_t(std::min<size_t>(size_t(std::max(m, 0)), keep.size()));
    std::partial_sort(keep.begin(), keep.begin() + c, keep.end(), better);
    out[0] = c;
    for (int32_t j = 0; j < c; ++j) {
        out[1 + j] = keep[size_t(j)];
        std::memcpy(&out[1 + m + j], &x[keep[size_t(j)]], sizeof(float));
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t g = 0; g < n_g; ++g) {
        const int32_t i = gather[g];
        std::memcpy(&out[1 + 2 * int64_t(m) + g], i >= 0 && i < n ? &x[i] : &nan, sizeof(float));
    }
}

}  // namespace cera
