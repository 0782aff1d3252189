// The devices a model-level test runs on: the CPU, and CUDA in CUDA builds (a CUDA case skips itself
// where no GPU is there).
#pragma once
#include <vector>

#include "backends/backend.h"
#include "backends/device.h"

namespace cera::test {

inline std::vector<DeviceKind> devices() {
#ifdef CERA_TEST_HAVE_CUDA
    return {DeviceKind::kCpu, DeviceKind::kCuda};
#else
    return {DeviceKind::kCpu};
#endif
}

}  // namespace cera::test
