// `cera devices` (alias `cera cpu`): CPU features and any CUDA GPUs.
#include <cstdio>

#include "backends/cpu/kernels.h"
#include "backends/device.h"
#include "cli/command.h"
#include "core/cpu_features.h"

namespace cera::cli {
namespace {

int run_devices(const std::vector<std::string>& args) {
    for (const auto& a : args) {
        if (a == "--help" || a == "-h") {
            std::printf("usage: cera devices\n\nPrints the CPU's features and the CUDA GPUs present.\n");
            return 0;
        }
        std::fprintf(stderr, "cera devices: error: unknown option '%s'\n", a.c_str());
        return 2;
    }
    const CpuFeatures& f = cpu_features();
    std::printf("cpu: %s\n", f.brand.empty() ? "(unknown)" : f.brand.c_str());
    std::printf("  cores: %d physical, %d logical\n", f.physical_cores, f.logical_cores);
    std::printf("  features: %s\n", cpu_features_string().c_str());
    std::printf("  kernels: %s\n", cpu::isa_name(cpu::best_isa()));
    std::string why;
    auto gpus = cuda_devices(&why);
    std::printf("cuda: %s\n", cuda_compiled() ? "compiled in" : "not compiled in");
    if (gpus.empty()) std::printf("  no GPU: %s\n", why.c_str());
    for (const auto& g : gpus)
        std::printf("  cuda:%d %s, compute %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", g.index, g.name.c_str(), g.cc_major,
                    g.cc_minor, g.sm_count, double(g.total_memory) / (1 << 30), double(g.l2_bytes) / (1 << 20));
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(devices, "devices", "CPU features and CUDA GPUs", run_devices);
CERA_CLI_COMMAND(cpu, "cpu", "same as `devices`", run_devices);

}  // namespace cera::cli
