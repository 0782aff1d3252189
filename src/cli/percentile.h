// The q-quantile (0..1) of a sample, interpolated linearly between ranks; 0 for an empty one.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace cera::cli {

inline double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const double pos = q * double(v.size() - 1);
    const size_t i = size_t(pos);
    const double frac = pos - double(i);
    return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

}  // namespace cera::cli
