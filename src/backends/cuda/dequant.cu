// Dequantization of whole rows: embedding lookups (f32 out, rows picked by token id) and the
// weight -> f16 expansion that feeds the cuBLAS GEMM of prefill.
// Idea: one thread per item (32 elements of a quantized block, see quant_device.cuh), 16-byte loads
// in; a warp's 32 items staged in shared memory and written out as contiguous 16-byte vectors.
// Variants: each split-layout type; float types elementwise.
// Roofline: bytes = image + output (f16 output is ~3.5x a Q4_0 image); the device copy bandwidth
// (cuda_gemv_bench's "copy" line).
#include <climits>
#include <cstdint>

#include "backends/cuda/quant_device.cuh"

namespace cera::cuda {
namespace {

__device__ __forceinline__ int swizzle(int c) { return c ^ ((c >> 3) & 7); }

// A run of 16 values as 16-byte chunks of O: 4 of float, 2 of half.
__device__ __forceinline__ void pack(const float* v, float scale, uint4* c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 f = make_float4(v[4 * i] * scale, v[4 * i + 1] * scale, v[4 * i + 2] * scale, v[4 * i + 3] * scale);
        c[i] = *reinterpret_cast<const uint4*>(&f);
    }
}
__device__ __forceinline__ void pack(const float* v, float scale, __half2 (&h)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = __floats2half2_rn(v[2 * i] * scale, v[2 * i + 1] * scale);
}
template <class O>
__device__ __forceinline__ void stage_run(uint4* st, int c0, const float* v, float scale);
template <>
__device__ __forceinline__ void stage_run<float>(uint4* st, int c0, const float* v, float scale) {
    uint4 c[4];
    pack(v, scale, c);
#pragma unroll
    for (int i = 0; i < 4; ++i) st[swizzle(c0 + i)] = c[i];
}
template <>
__device__ __forceinline__ void stage_run<__half>(uint4* st, int c0, const float* v, float scale) {
    __half2 h[8];
    pack(v, scale, h);
    const uint4* c = reinterpret_cast<const uint4*>(h);
    st[swizzle(c0)] = c[0], st[swizzle(c0 + 1)] = c[1];
}

// One warp a 32-item group of a row: 32 items of a block type always cover whole blocks, 1024
// consecutive elements (fewer at a row's end). The lanes decode their items into a shared-memory stage
// of 16-byte chunks, then write the group out as consecutive chunks, so that every store instruction
// of the warp writes 512 contiguous bytes. The stage's chunk c sits at c ^ ((c >> 3) & 7): the lanes
// of a phase, whose runs lie 64 bytes apart, store to distinct banks.
constexpr int kDqWarps = 8;
template <GgmlType T, class O>
__global__ void __launch_bounds__(kDqWarps * 32) dequant_q_kernel(const uint8_t* __restrict__ q,
                                                                  const uint8_t* __restrict__ m, int64_t row0, int nb,
                                                                  const int32_t* __restrict__ ids, int64_t n_rows,
                                                                  float scale, O* out) {
    pdl_trigger();
    pdl_wait();
    using Tr = QTraits<T>;
    static_assert(Tr::kRun == 16 && 32 % Tr::kItems == 0, "dequant: runs of 16, whole blocks a warp");
    constexpr QuantLayout L = quant_layout(T);
    constexpr int kVec = 16 / sizeof(O);  // elements a chunk
    __shared__ uint4 stage[kDqWarps][32 * 32 / kVec];
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const unsigned items = unsigned(nb) * Tr::kItems, groups = (items + 31) / 32;
    const unsigned gw = blockIdx.x * kDqWarps + unsigned(warp);
    if (gw >= unsigned(n_rows) * groups) return;
    const unsigned t = gw / groups, g = gw % groups;
    const unsigned first = g * 32, n_items = min(32u, items - first);
    const int64_t gr = row0 + (ids ? ids[t] : int64_t(t));
    uint4* st = stage[warp];
    if (unsigned(lane) < n_items) {
        const int it = int(first) + lane, blk = it / Tr::kItems, j = it % Tr::kItems;
        const auto w = Tr::load_w(q + gr * nb * L.q_bytes, m + gr * nb * L.m_bytes, blk, j);
        float va[16], vb[16];
        Tr::dequant(w, j, va, vb);
        int ea, eb;
        Tr::runs(j, ea, eb);
        const int base = (lane / Tr::kItems) * L.block_elems;
        stage_run<O>(st, (base + ea) / kVec, va, scale);
        stage_run<O>(st, (base + eb) / kVec, vb, scale);
    }
    __syncwarp();
    const int n_vec = int(n_items) * 32 / kVec;
    uint4* dst = reinterpret_cast<uint4*>(out + int64_t(t) * nb * L.block_elems + int64_t(first) * 32);
    for (int v = lane; v < n_vec; v += 32) dst[v] = st[swizzle(v)];
}

template <class O>
__device__ __forceinline__ void store(O* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store<__half>(__half* p, float v) { *p = __float2half_rn(v); }

template <GgmlType T, class O>
__global__ void dequant_f_kernel(const uint8_t* __restrict__ image, int64_t row0, int64_t k,
                                 const int32_t* __restrict__ ids, int64_t n_rows, float scale, O* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * k) return;
    const int64_t t = i / k, c = i % k;
    const int64_t gr = row0 + (ids ? ids[t] : t);
    store(out + i, FTraits<T>::one(image + gr * k * float_type_bytes(T), c) * scale);
}

// Rows whose length is a multiple of 8 (every model's): one thread an 8-element item, a 16-byte load
// for F16 / BF16 (two for F32) and 16-byte stores, where the scalar kernel above moves 2 or 4 bytes a
// thread (BF16 prefill expands every weight each chunk through this).
__device__ __forceinline__ void store8(float* p, const float* v, float scale) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4] * scale, v[5] * scale, v[6] * scale, v[7] * scale);
}
__device__ __forceinline__ void store8(__half* p, const float* v, float scale) {
    __half2 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i] * scale, v[2 * i + 1] * scale);
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(h);
}
template <GgmlType T, class O>
__global__ void dequant_f8_kernel(const uint8_t* __restrict__ image, int64_t row0, int64_t k,
                                  const int32_t* __restrict__ ids, int64_t n_rows, float scale, O* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t items = k / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * items) return;
    const int64_t t = i / items, c = i % items;
    const int64_t gr = row0 + (ids ? ids[t] : t);
    float v[8];
    FTraits<T>::load(image + gr * k * float_type_bytes(T), c, v);
    store8(out + t * k + 8 * c, v, scale);
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

template <class O>
void launch_dequant(const WeightRef& w, const int32_t* ids, int64_t n_rows, float scale, O* out, cudaStream_t s) {
    const QuantLayout L = quant_layout(w.type);
    if (L.block_elems > 0) {
        const int nb = int(w.k / L.block_elems);
        const auto* q = static_cast<const uint8_t*>(w.image);
        const uint8_t* m = scale_stream(w);
        const int64_t groups = ceil_div(int64_t(nb) * (L.block_elems / 32), int64_t(32));
        CERA_CHECK(n_rows * groups < INT32_MAX, "dequantize_rows: %lld rows of %lld elements", (long long)n_rows,
                   (long long)w.k);
        const unsigned grid = unsigned(ceil_div(n_rows * groups, int64_t(kDqWarps)));
        const unsigned block = kDqWarps * 32;
        switch (w.type) {
#define CERA_Q(T)                                                                                         \
    case GgmlType::T:                                                                                     \
        launch((dequant_q_kernel<GgmlType::T, O>), grid, block, 0, s, q, m, w.row0, nb, ids, n_rows, scale, out); \
        break;
            CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
            default: break;
        }
    } else {
        const auto* img = static_cast<const uint8_t*>(w.image);
        const bool vec =
            w.k % 8 == 0 && reinterpret_cast<uintptr_t>(img) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
        const unsigned grid = unsigned(ceil_div(n_rows * (vec ? w.k / 8 : w.k), 256));
        switch (w.type) {
#define CERA_F(T)                                                                                                    \
    case GgmlType::T:                                                                                                \
        if (vec)                                                                                                     \
            launch((dequant_f8_kernel<GgmlType::T, O>), grid, 256, 0, s, img, w.row0, w.k, ids, n_rows, scale, out); \
        else                                                                                                         \
            launch((dequant_f_kernel<GgmlType::T, O>), grid, 256, 0, s, img, w.row0, w.k, ids, n_rows, scale, out);  \
        break;
            CERA_F(kF32) CERA_F(kF16) CERA_F(kBF16)
#undef CERA_F
                default : CERA_CHECK(false, "dequantize_rows: unsupported type %s", type_name(w.type));
        }
    }
}

}  // namespace

void dequantize_rows(const WeightRef& w, const int32_t* row_ids, int64_t n_rows, float scale, void* out, bool out_f16,
                     Stream stream) {
    if (n_rows == 0) return;
    if (out_f16) launch_dequant(w, row_ids, n_rows, scale, static_cast<__half*>(out), as_stream(stream));
    else launch_dequant(w, row_ids, n_rows, scale, static_cast<float*>(out), as_stream(stream));
}

void convert_f32_to_f16(const float* x, int64_t n, void* out, Stream stream) {
    if (n == 0) return;
    launch(f32_to_f16_kernel, unsigned(ceil_div(n, 256)), 256, 0, as_stream(stream), x, n, static_cast<__half*>(out));
}

}  // namespace cera::cuda
