// Dequantization of whole rows: embedding lookups (f32 out, rows picked by token id) and the
// weight -> f16 expansion that feeds the cuBLAS GEMM of prefill.
// Idea: one thread per item (32 elements of a quantized block, see quant_device.cuh), 16-byte loads
// in, contiguous 16-element runs out. Variants: each split-layout type; float types elementwise.
// Roofline: bytes = image + output (f16 output is ~3.5x a Q4_0 image); ~4.3 TB/s.
#include "backends/cuda/quant_device.cuh"

namespace cera::cuda {
namespace {

template <class O>
__device__ __forceinline__ void store(O* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store<__half>(__half* p, float v) { *p = __float2half_rn(v); }

template <GgmlType T, class O>
__global__ void dequant_q_kernel(const uint8_t* __restrict__ q, const uint8_t* __restrict__ m, int64_t row0,
                                 int64_t nb, const int32_t* __restrict__ ids, int64_t n_rows, float scale, O* out) {
    pdl_trigger();
    pdl_wait();
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    const int64_t items_per_row = nb * Tr::kItems;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * items_per_row) return;
    const int64_t t = i / items_per_row, it = i % items_per_row;
    const int64_t gr = row0 + (ids ? ids[t] : t);
    const int64_t blk = it / Tr::kItems;
    const int j = int(it % Tr::kItems);
    const auto w = Tr::load_w(q + gr * nb * L.q_bytes, m + gr * nb * L.m_bytes, blk, j);
    float va[Tr::kRun], vb[Tr::kRun];
    Tr::dequant(w, j, va, vb);
    int ea, eb;
    Tr::runs(j, ea, eb);
    O* o = out + t * nb * L.block_elems + blk * L.block_elems;
#pragma unroll
    for (int e = 0; e < Tr::kRun; ++e) {
        store(o + ea + e, va[e] * scale);
        store(o + eb + e, vb[e] * scale);
    }
}

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
        const int64_t nb = w.k / L.block_elems;
        const auto* q = static_cast<const uint8_t*>(w.image);
        const uint8_t* m = scale_stream(w);
        const int64_t items = n_rows * nb * (L.block_elems / 32);
        const unsigned grid = unsigned(ceil_div(items, 128));
        switch (w.type) {
#define CERA_Q(T)                                                                                         \
    case GgmlType::T:                                                                                     \
        launch((dequant_q_kernel<GgmlType::T, O>), grid, 128, 0, s, q, m, w.row0, nb, ids, n_rows, scale, out); \
        break;
            CERA_Q(kQ4_0) CERA_Q(kQ4_1) CERA_Q(kQ5_0) CERA_Q(kQ5_1) CERA_Q(kQ8_0) CERA_Q(kQ4_K) CERA_Q(kQ5_K)
            CERA_Q(kQ6_K)
#undef CERA_Q
            default: break;
        }
    } else {
        const auto* img = static_cast<const uint8_t*>(w.image);
        const unsigned grid = unsigned(ceil_div(n_rows * w.k, 256));
        switch (w.type) {
            case GgmlType::kF32:
                launch((dequant_f_kernel<GgmlType::kF32, O>), grid, 256, 0, s, img, w.row0, w.k, ids, n_rows, scale, out);
                break;
            case GgmlType::kF16:
                launch((dequant_f_kernel<GgmlType::kF16, O>), grid, 256, 0, s, img, w.row0, w.k, ids, n_rows, scale, out);
                break;
            case GgmlType::kBF16:
                launch((dequant_f_kernel<GgmlType::kBF16, O>), grid, 256, 0, s, img, w.row0, w.k, ids, n_rows, scale, out);
                break;
            default: CERA_CHECK(false, "dequantize_rows: unsupported type %s", type_name(w.type));
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
