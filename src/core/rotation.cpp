#include "core/rotation.h"

#include <array>
#include <cmath>

#include "core/check.h"

namespace cera {

bool rotation_fits(int64_t n) { return n >= 2 && n <= 1024 && (n & (n - 1)) == 0; }

void rotate_head(float* x, int64_t n, bool inverse) {
    CERA_CHECK(rotation_fits(n), "rotate_head: %lld is not a power of two in 2..1024", (long long)n);
    static const std::array<float, 1024> sign = [] {
        std::array<float, 1024> s{};
        for (int64_t i = 0; i < 1024; ++i) s[size_t(i)] = rotation_sign(i);
        return s;
    }();
    if (!inverse)
        for (int64_t i = 0; i < n; ++i) x[i] *= sign[size_t(i)];
    for (int64_t len = 1; len < n; len <<= 1)
        for (int64_t i = 0; i < n; i += 2 * len)
            for (int64_t j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    const float s = 1.0f / std::sqrt(float(n));
    for (int64_t i = 0; i < n; ++i) x[i] *= inverse ? s * sign[size_t(i)] : s;
}

}  // namespace cera
