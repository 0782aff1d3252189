// Helpers shared by the CUDA kernel files: launches (every launch() is error-checked), warp
// reductions, wide loads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>


#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "core/check.h"


namespace cera::cuda {

inline cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s); }
__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Programmatic dependent launch (PDL): a kernel launched with launch() may start while the one
// before it in the stream is still running. Each such kernel calls pdl_trigger() (let the next one
// launch) and must call pdl_wait() before it reads or writes any memory an earlier kernel touches;
// only reads of weights (constant during a step), of step inputs the host wrote before the step
// (token ids, positions) and of data earlier steps wrote that no other kernel of this step writes
// (the KV rows below the step's positions, the short conv's state) may come before it. A step's
// first kernel is launched without PDL (pdl_skip_next), so it waits for all earlier work.
#ifndef CERA_CUDA_TRACE
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#define trace_mark(i) ((void)0)
#else
// Timeline trace (diagnosis builds only: cmake -DCERA_CUDA_TRACE=ON; trace.cu writes the records).
// Thread 0 of every block records the global timer where the kernel starts (pdl_trigger, the first
// statement of every kernel) and where its PDL wait returns, with the kernel's source place (file
// hash, line) and the block's index, so a replayed step's critical path can be read off: a kernel's
// share is the time from its wait's release to the next kernel's.
struct TraceRec {
    unsigned long long t0, t1, t2, ta;  // block start, PDL wait released, thread 0 done, thread 0 at the wait
    unsigned long long tm[2];           // thread 0 at trace_mark(0) / trace_mark(1), where a kernel has them
    uint32_t file, line_sm, block, grid;
};
constexpr uint32_t trace_hash(const char* s) {
    const char* b = s;
    for (const char* p = s; *p; ++p)
        if (*p == '/') b = p + 1;
    uint32_t h = 2166136261u;
    for (; *b; ++b) h = (h ^ uint32_t(uint8_t(*b))) * 16777619u;
    return h;
}
namespace {
__device__ TraceRec* d_trace_buf;  // record 0 holds the counter; set per file by trace_start()
__device__ unsigned d_trace_cap;
__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ TraceRec** trace_slot() {
    __shared__ TraceRec* slot;
    return &slot;
}
__device__ __forceinline__ void trace_trigger(uint32_t file, uint32_t line) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
    const unsigned long long t0 = trace_now();
    TraceRec* buf = d_trace_buf;
    TraceRec* r = nullptr;
    if (buf) {
        const unsigned i = atomicAdd(reinterpret_cast<unsigned*>(buf), 1u) + 1;
        if (i < d_trace_cap) {
            r = buf + i;
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            r->t0 = t0, r->t1 = 0, r->t2 = 0, r->ta = 0, r->tm[0] = 0, r->tm[1] = 0;
            r->file = file, r->line_sm = line | (sm << 16);
            r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            r->grid = gridDim.x * gridDim.y * gridDim.z;
        }
    }
    *trace_slot() = r;
}
// pdl_trigger() declares one of these at the top of every kernel: its destructor marks thread 0's end.
struct TraceScope {
    __device__ __forceinline__ TraceScope(uint32_t file, uint32_t line) { trace_trigger(file, line); }
    __device__ __forceinline__ ~TraceScope() {
        if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
        if (TraceRec* r = *trace_slot()) r->t2 = trace_now();
    }
};
__device__ __forceinline__ void trace_wait() {
    const unsigned long long ta = trace_now();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
    if (TraceRec* r = *trace_slot()) {
        r->t1 = trace_now();
        if (!r->ta) r->ta = ta;  // the first wait's arrival (a block may wait again)
    }
}
// Thread 0's time at a point of interest inside a kernel (i = 0 or 1; the first call of each counts).
__device__ __forceinline__ void trace_mark_at(int i) {
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
    if (TraceRec* r = *trace_slot())
        if (!r->tm[i]) r->tm[i] = trace_now();
}
}  // namespace
#define trace_mark(i) ::cera::cuda::trace_mark_at(i)
#define pdl_trigger()                    \
    ::cera::cuda::TraceScope cera_trace_scope_( \
        std::integral_constant<uint32_t, ::cera::cuda::trace_hash(__FILE__)>::value, __LINE__)
#define pdl_wait() ::cera::cuda::trace_wait()
// Host: every file's setter (registered at static initialisation) points its copy of d_trace_buf at
// the buffer.
using TraceSetter = void (*)(void* buf, unsigned cap);
inline std::vector<TraceSetter>& trace_setters() {
    static std::vector<TraceSetter> v;
    return v;
}
namespace {
void trace_set_this_file(void* buf, unsigned cap) {
    cudaMemcpyToSymbol(d_trace_buf, &buf, sizeof buf);
    cudaMemcpyToSymbol(d_trace_cap, &cap, sizeof cap);
}
[[maybe_unused]] const bool trace_registered = (trace_setters().push_back(trace_set_this_file), true);
}  // namespace
#endif

// The next launch() on this thread goes without the PDL attribute: a decode step's first kernel, so
// that it starts only when everything queued before it (the previous step, possibly a graph that
// ended in a kernel) has finished, and every kernel of the step may read earlier steps' results
// before its PDL wait (the rule above).
// pdl_skip_next() is declared in kernels.h; pdl_take_skip() reads and clears the request.
bool pdl_take_skip();

template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    const bool skip = pdl_take_skip();
    cfg.numAttrs = skip ? 0 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Lets Kernel take `bytes` of dynamic shared memory beyond the 48 KB default: the limit is raised on
// the current device when a launch first asks for more than was granted there (once, not per launch).
template <auto Kernel>
void allow_dynamic_smem(size_t bytes) {
    if (bytes <= 48 * 1024) return;
    static std::atomic<int> granted[64] = {};  // per device index (mod 64): the largest limit set
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& g = granted[dev & 63];
    int have = g.load(std::memory_order_relaxed);
    if (int(bytes) <= have) return;
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    while (have < int(bytes) && !g.compare_exchange_weak(have, int(bytes), std::memory_order_relaxed)) {
    }
}

// Kernel's preferred split of an SM's unified L1 / shared memory: percent of the most shared memory an
// SM can have (0: the most L1; -1: no preference, the driver's choice; other values: left alone), set
// once per device index (mod 64). An SM runs blocks of different kernels side by side only when its
// split suits them all, so the kernels of a decode chain that should overlap want compatible
// preferences (bench/NOTES.md).
template <auto Kernel>
void prefer_carveout(int percent) {
    if (percent < -1 || percent > 100) return;
    static std::atomic<bool> done[64] = {};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (done[dev & 63].exchange(true, std::memory_order_relaxed)) return;
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
}

// Attribute A of the current device, queried once per device index (mod 64).
template <cudaDeviceAttr A>
int device_attr() {
    static std::atomic<int> cache[64] = {};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& c = cache[dev & 63];
    int v = c.load(std::memory_order_relaxed);
    if (v == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&v, A, dev));
        c.store(v, std::memory_order_relaxed);
    }
    return v;
}
inline int sm_count() { return device_attr<cudaDevAttrMultiProcessorCount>(); }

// Keys a query at position p sees in a cache of n_ctx rows: [begin, end), causal and limited to the
// last `window` positions when window > 0.
__device__ __forceinline__ void attn_key_range(int64_t p, int64_t n_ctx, int window, int64_t& begin, int64_t& end) {
    end = min(p + 1, n_ctx);
    begin = window > 0 ? max(int64_t(0), p + 1 - window) : 0;
}
// The most keys attn_key_range gives any query: what a decode plan sizes its chunks and splits for.
inline int64_t attn_max_keys(int64_t n_ctx, int window) { return window > 0 && window < n_ctx ? window : n_ctx; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* shared32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // shared32 may still be read by an earlier call
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared32[lane] : 0.0f;
    return warp_sum(v);
}

// The "last block to arrive" ticket. Every thread of the block calls it after the writes another block
// may read; thread 0 adds one to *counter with release semantics (the block's writes, ordered before
// it by the barrier) and acquire semantics (the writes of the blocks that took their ticket before), in
// one atomic instead of a fence on each side. Returns the count before this block's, in every thread;
// the block that gets the last count may read what the others wrote and resets the counter.
__device__ __forceinline__ unsigned block_ticket(unsigned* counter) {
    __shared__ unsigned ticket;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned t;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(t) : "l"(counter) : "memory");
        ticket = t;
    }
    __syncthreads();
    return ticket;
}

// 16-byte load of streamed data (weights): read-only path, not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
// 16-byte load of reused data (activations): read-only path, cached.
__device__ __forceinline__ uint4 ld_cached16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// Group c of a quantize_q8 row (kernels.h) from the warp's 32 values (lane i holds element 32c + i);
// the same arithmetic as quantize_q8, so a fused producer writes the same bytes.
__device__ __forceinline__ void warp_quantize_q8(float v, uint8_t* xq_row, int64_t k, int64_t c, bool store = true) {
    const int lane = threadIdx.x & 31;
    const float d = warp_max(fabsf(v)) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!store) return;
    xq_row[32 * c + lane] = uint8_t(int8_t(__float2int_rn(v * id)));
    if (lane == 0) reinterpret_cast<float*>(xq_row + k)[c] = d;
}

// Asks for `bytes` (a multiple of 16, 16-byte aligned) to be brought into L2, without waiting.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// 16 bytes global -> shared, asynchronously (cp.async groups).
__device__ __forceinline__ void cp_async16v(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src)
                 : "memory");
}
// 4 bytes global -> shared, asynchronously (both 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// cp_async_wait for a count known at run time (0 to 3; more waits as 3).
__device__ __forceinline__ void cp_async_wait_n(int n) {
    switch (n) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        default: cp_async_wait<3>(); break;
    }
}

// Bulk asynchronous copies into shared memory (sm_90): an mbarrier completes when the bytes it was
// told to expect have landed.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the asynchronous (bulk copy) proxy.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
    const uint32_t a = smem_u32(b);
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

}  // namespace cera::cuda
