// Benchmark and test switches read from the environment (host code; common.cuh and the backend's
// switches use them).
#pragma once
#include <cstdlib>
#include <cstring>

namespace cera::cuda {

// An integer from the environment, or fallback when unset or empty.
inline int env_int(const char* name, int fallback) {
    const char* e = std::getenv(name);
    return e && *e ? std::atoi(e) : fallback;
}
// Whether the variable is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
    const char* e = std::getenv(name);
    return e && std::strcmp(e, value) == 0;
}

}  // namespace cera::cuda
