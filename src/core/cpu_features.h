// CPU feature detection (CPUID), read once.
#pragma once
#include <string>

namespace cera {

struct CpuFeatures {
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
    bool avx512vnni = false, avx512bf16 = false, avx_vnni = false;
    // AMX tiles with the BF16 tile product, usable by this process: the CPU has them, the OS saves the tile
    // state, and Linux granted the process its permission (arch_prctl ARCH_REQ_XCOMP_PERM), which
    // cpu_features() asks for once.
    bool amx_bf16 = false;
    bool amd = false;  // vendor AuthenticAMD
    int logical_cores = 1;
    int physical_cores = 1;
    std::string brand;

    bool has_avx2_set() const { return avx2 && fma && f16c; }
    bool has_avx512_set() const { return has_avx2_set() && avx512f && avx512bw && avx512vl && avx512dq; }
};

const CpuFeatures& cpu_features();
std::string cpu_features_string();  // e.g. "AVX2 FMA F16C AVX512F ... "

}  // namespace cera
