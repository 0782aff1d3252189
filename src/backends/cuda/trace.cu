// Timeline trace of the kernels (common.cuh, CERA_CUDA_TRACE builds): with CERA_CUDA_TRACE_FILE set,
// the backend allocates the record buffer at start and writes it to that file at the end (raw
// TraceRec array, record 0's first word = the number of records asked for). scripts/trace_report.py
// reads it. In ordinary builds both calls do nothing.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/common.cuh"

namespace cera::cuda {

#ifdef CERA_CUDA_TRACE
namespace {
TraceRec* g_buf = nullptr;
constexpr unsigned kCap = 1u << 20;
}  // namespace

void trace_start() {
    if (!std::getenv("CERA_CUDA_TRACE_FILE") || g_buf) return;
    CUDA_CHECK(cudaMalloc(&g_buf, sizeof(TraceRec) * kCap));
    CUDA_CHECK(cudaMemset(g_buf, 0, sizeof(TraceRec) * kCap));
    for (TraceSetter set : trace_setters()) set(g_buf, kCap);
    CUDA_CHECK(cudaDeviceSynchronize());
}

void trace_finish() {
    if (!g_buf) return;
    cudaDeviceSynchronize();
    std::vector<TraceRec> h(kCap);
    cudaMemcpy(h.data(), g_buf, sizeof(TraceRec) * kCap, cudaMemcpyDeviceToHost);
    const unsigned n = *reinterpret_cast<const unsigned*>(h.data());
    const size_t keep = std::min<size_t>(size_t(n) + 1, kCap);
    if (FILE* f = std::fopen(std::getenv("CERA_CUDA_TRACE_FILE"), "wb")) {
        std::fwrite(h.data(), sizeof(TraceRec), keep, f);
        std::fclose(f);
    }
    std::fprintf(stderr, "cuda trace: %u block records\n", n);
    for (TraceSetter set : trace_setters()) set(nullptr, 0);
    cudaFree(g_buf);
    g_buf = nullptr;
}
#else
void trace_start() {}
void trace_finish() {}
#endif

}  // namespace cera::cuda
