// Device queries through the CUDA runtime. Never fails hard: no driver or no GPU
// simply means an empty list and a reason.
#include <cuda_runtime.h>

#include "backends/device.h"

namespace cera {

bool cuda_compiled() { return true; }

std::vector<GpuInfo> cuda_devices(std::string* why) {
    std::vector<GpuInfo> out;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why) *why = cudaGetErrorString(err);
        cudaGetLastError();  // clear the sticky error
        return out;
    }
    if (n == 0 && why) *why = "no CUDA device found";
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        GpuInfo g;
        g.index = i;
        g.name = p.name;
        g.cc_major = p.major;
        g.cc_minor = p.minor;
        g.total_memory = p.totalGlobalMem;
        g.sm_count = p.multiProcessorCount;
        g.l2_bytes = size_t(p.l2CacheSize);
        out.push_back(g);
    }
    return out;
}

}  // namespace cera
