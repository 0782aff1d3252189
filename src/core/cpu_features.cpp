#include "core/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

namespace cera {
namespace {

// The low half of XCR0 (the state components the OS saves), or 0 without OSXSAVE.
unsigned xcr0() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return lo;
}

bool os_saves_avx512() { return (xcr0() & 0xe6) == 0xe6; }  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
bool os_saves_avx() { return (xcr0() & 0x6) == 0x6; }
bool os_saves_amx() { return (xcr0() & 0x60000) == 0x60000; }  // XTILECFG, XTILEDATA

// Linux hands out the tile data state on request, per process; without the permission the first tile
// instruction faults.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

int count_physical_cores() {
    // Distinct (physical id, core id) pairs in /proc/cpuinfo; falls back to logical count.
    std::ifstream f("/proc/cpuinfo");
    std::set<std::pair<int, int>> cores;
    std::string line;
    int phys = 0, core = -1;
    while (std::getline(f, line)) {
        if (line.rfind("physical id", 0) == 0) phys = std::atoi(line.c_str() + line.find(':') + 1);
        if (line.rfind("core id", 0) == 0) {
            core = std::atoi(line.c_str() + line.find(':') + 1);
            cores.insert({phys, core});
        }
    }
    int n = int(cores.size());
    int logical = int(std::thread::hardware_concurrency());
    if (n <= 0 || n > logical) n = logical > 0 ? logical : 1;
    return n;
}

CpuFeatures detect() {
    CpuFeatures f;
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool avx_ok = os_saves_avx();
    const bool avx512_ok = os_saves_avx512();
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        char vendor[13] = {};
        std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &c, 4);
        f.amd = std::strcmp(vendor, "AuthenticAMD") == 0;
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        f.fma = avx_ok && (c & (1u << 12));
        f.f16c = avx_ok && (c & (1u << 29));
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = avx_ok && (b & (1u << 5));
        f.avx512f = avx512_ok && (b & (1u << 16));
        f.avx512dq = avx512_ok && (b & (1u << 17));
        f.avx512bw = avx512_ok && (b & (1u << 30));
        f.avx512vl = avx512_ok && (b & (1u << 31));
        f.avx512vnni = avx512_ok && (c & (1u << 11));
        const bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22);
        f.amx_bf16 = avx512_ok && amx_tile && amx_bf16 && os_saves_amx() && request_amx_permission();
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f.avx_vnni = avx_ok && (a & (1u << 4));
        f.avx512bf16 = avx512_ok && (a & (1u << 5));
    }
    unsigned brand[12] = {};
    if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
        for (unsigned i = 0; i < 3; ++i)
            __get_cpuid(0x80000002 + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2], &brand[4 * i + 3]);
        f.brand = std::string(reinterpret_cast<const char*>(brand), strnlen(reinterpret_cast<const char*>(brand), 48));
        while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
        while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(0, 1);
    }
    f.logical_cores = int(std::thread::hardware_concurrency());
    if (f.logical_cores <= 0) f.logical_cores = 1;
    f.physical_cores = count_physical_cores();
    return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

std::string cpu_features_string() {
    const CpuFeatures& f = cpu_features();
    std::string s;
    auto add = [&](bool on, const char* name) {
        if (on) {
            if (!s.empty()) s += ' ';
            s += name;
        }
    };
    add(f.avx2, "AVX2");
    add(f.fma, "FMA");
    add(f.f16c, "F16C");
    add(f.avx_vnni, "AVX_VNNI");
    add(f.avx512f, "AVX512F");
    add(f.avx512bw, "AVX512BW");
    add(f.avx512vl, "AVX512VL");
    add(f.avx512dq, "AVX512DQ");
    add(f.avx512vnni, "AVX512_VNNI");
    add(f.avx512bf16, "AVX512_BF16");
    add(f.amx_bf16, "AMX_BF16");
    return s;
}

}  // namespace cera
