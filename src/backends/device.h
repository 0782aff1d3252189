// Which compute devices exist. The CUDA backend is optional at build time and
// chosen at run time; a build without CUDA answers "none" here.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace cera {

struct GpuInfo {
    int index = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;  // compute capability
    size_t total_memory = 0;         // bytes
    int sm_count = 0;
    size_t l2_bytes = 0;
};

bool cuda_compiled();  // true when this build has the CUDA backend
// The CUDA devices present; empty with a reason in *why when there are none.
std::vector<GpuInfo> cuda_devices(std::string* why = nullptr);

}  // namespace cera
