// Device queries for a build without the CUDA backend.
#include "backends/device.h"

namespace cera {

bool cuda_compiled() { return false; }

std::vector<GpuInfo> cuda_devices(std::string* why) {
    if (why) *why = "this build has no CUDA backend";
    return {};
}

}  // namespace cera
