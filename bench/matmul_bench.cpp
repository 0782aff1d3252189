// CPU matmul benchmark: GEMV (decode, 1 token) and GEMM (prefill, 512 tokens) on the benchmark
// models' shapes, per weight type and thread count. Prints one line per case:
//   weight GB/s (weight bytes / time: compare with ~33 GB/s DRAM read on 2 threads) and GFLOP/s.
// GEMV cycles through enough copies of the weights (>= 128 MiB) that they come from DRAM, not L3.
// --packed registers the weights (cpu::register_weight), so types with a packed layout use it.
// --tiles lets the products take the table's tile kernels (the image encoder's products; AMX table).
// Usage: matmul_bench [--quick] [--hot] [--packed] [--tiles] [--isa ref|avx2|avx512|amx] [--type NAME]
// (--type: any weight type with a quantizer; without it Q4_0, Q8_0, Q4_K, Q6_K and F16)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "core/quant/quant.h"

using namespace cera;

namespace {

// CPU time of the calling thread: with 1 thread, robust to other load on a shared machine.
double cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Shape {
    const char* name;
    int64_t rows, k;
};

}  // namespace

int main(int argc, char** argv) {
    bool quick = false, hot = false, packed = false, tiles = false;
    std::string only_type;  // --hot: one copy of the weights (L3-resident for the small shapes)
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) quick = true;
        if (std::strcmp(argv[i], "--hot") == 0) hot = true;
        if (std::strcmp(argv[i], "--packed") == 0) packed = true;
        if (std::strcmp(argv[i], "--tiles") == 0) tiles = true;
        if (std::strcmp(argv[i], "--type") == 0 && i + 1 < argc) only_type = argv[++i];
        if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            const std::string v = argv[++i];
            cpu::force_isa(v == "ref"    ? cpu::Isa::kRef
                           : v == "avx2" ? cpu::Isa::kAvx2
                           : v == "amx"  ? cpu::Isa::kAmx
                                         : cpu::Isa::kAvx512);
        }
    }
    const Shape shapes[] = {{"ffn_up 350m", 4608, 1024}, {"ffn_down 350m", 1024, 4608}, {"ffn_down 1.2b", 2048, 8192},
                            {"output 350m", 50257, 1024}};
    // The default set; --type picks any type with a quantizer.
    const std::vector<GgmlType> types =
        only_type.empty()
            ? std::vector<GgmlType>{GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16}
            : std::vector<GgmlType>{GgmlType::kQ4_0,  GgmlType::kQ4_1,   GgmlType::kQ5_0,   GgmlType::kQ5_1,
                                    GgmlType::kQ8_0,  GgmlType::kQ2_K,   GgmlType::kQ3_K,   GgmlType::kQ4_K,
                                    GgmlType::kQ5_K,  GgmlType::kQ6_K,   GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                                    GgmlType::kF16,   GgmlType::kBF16};
    std::printf("# isa %s; GB/s = weight bytes / time; roofline ~33 GB/s (2 threads)\n",
                cpu::isa_name(cpu::active_isa()));
    std::printf("%-14s %-6s %3s %7s %10s %8s %9s %12s\n", "shape", "type", "thr", "tokens", "us/call", "GB/s", "GFLOP/s",
                "GFLOP/s(cpu)");
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (const Shape& s : shapes) {
        std::vector<float> wf(size_t(s.rows * s.k));
        for (auto& v : wf) v = g(rng) * 0.05f;
        for (GgmlType t : types) {
            if (!only_type.empty() && only_type != type_name(t)) continue;
            const size_t bytes = row_size(t, s.k) * size_t(s.rows);
            std::vector<uint8_t> w0(bytes);
            for (int64_t r = 0; r < s.rows; ++r)
                quantize_row_ref(t, wf.data() + r * s.k, w0.data() + size_t(r) * row_size(t, s.k), s.k);
            const int copies = hot ? 1 : int(std::max<size_t>(1, (size_t(128) << 20) / bytes + 1));
            std::vector<uint8_t> wall(bytes * size_t(copies));
            for (int c = 0; c < copies; ++c) std::memcpy(wall.data() + size_t(c) * bytes, w0.data(), bytes);
            bool is_packed = false;
            if (packed)
                for (int c = 0; c < copies; ++c)
                    is_packed = cpu::register_weight(t, wall.data() + size_t(c) * bytes, s.rows, s.k);
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                for (int64_t nt : {int64_t(1), int64_t(512)}) {
                    if (quick && nt > 1 && t == GgmlType::kF16) continue;
                    if (nt > 1 && s.rows > 8192) continue;  // the LM head runs on the last token only
                    std::vector<float> x(size_t(nt * s.k)), y(size_t(nt * s.rows));
                    for (auto& v : x) v = g(rng);
                    const int reps = nt == 1 ? (quick ? 50 : 200) : (quick ? 1 : 3);
                    std::vector<double> times, ctimes;
                    int c = 0;
                    const cpu::KernelTable& tab = cpu::active_table();
                    cpu::matmul(tab, t, wall.data(), s.rows, s.k, x.data(), nt, y.data(), s.rows, &pool,
                                tiles);  // warm-up
                    for (int rep = 0; rep < reps; ++rep) {
                        const uint8_t* w = wall.data() + size_t(c) * bytes;
                        c = (c + 1) % copies;
                        const double t0 = now_s(), c0 = cpu_s();
                        cpu::matmul(tab, t, w, s.rows, s.k, x.data(), nt, y.data(), s.rows, &pool, tiles);
                        times.push_back(now_s() - t0);
                        ctimes.push_back(cpu_s() - c0);
                    }
                    std::sort(times.begin(), times.end());
                    std::sort(ctimes.begin(), ctimes.end());
                    const double med = times[times.size() / 2], cmed = ctimes[ctimes.size() / 2];
                    const double flop = 2.0 * double(s.rows) * double(s.k) * double(nt);
                    // the cpu-time rate is per thread (the caller's share of the work) when threads > 1
                    std::printf("%-14s %-5s%s %3d %7lld %10.1f %8.2f %9.1f %12.1f\n", s.name, type_name(t), is_packed ? "p" : " ", threads,
                                (long long)nt, med * 1e6, double(bytes) / med * 1e-9, flop / med * 1e-9,
                                flop / double(threads) / cmed * 1e-9);
                    std::fflush(stdout);
                }
            }
            if (is_packed)
                for (int c = 0; c < copies; ++c) cpu::unregister_weight(wall.data() + size_t(c) * bytes);
        }
    }
    return 0;
}
