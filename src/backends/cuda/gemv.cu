// Matrix-vector products for decode (and small batches): y = W x, W in its device image.
//
// Idea: batch-1 decode is bound by reading the weights once, so every weight byte is fetched with
// 16-byte streamed loads, coalesced across the warp (lane l reads item l, l + 32, ...), with
// R rows x 2 items = up to 8 independent 16-byte loads in flight per lane. One warp owns R output
// rows (R = 1, 2 or 4, chosen from the shape) so the activations it loads are reused R times.
// Quantized weights are dotted against 8-bit activations (quantize_q8, one scale per 32) with
// dp4a; float weights against the f32 activations with FMA. No shared memory, no block barriers.
// With programmatic dependent launch the first weight loads are issued before waiting for the
// kernel that produces x, so the weight stream overlaps the previous kernel's tail.
// Variants: quantized (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K) x R; float (F32 F16 BF16) x R with
// k % 8 == 0; a scalar fallback for float rows of other lengths.
// Roofline: bytes = weight image (+ x, L2-resident). H200 ~4.3 TB/s copy bandwidth: a 2048 x 8192
// Q4_0 matrix (9.4 MB) takes >= 2.2 us; launch and tail effects dominate below ~4 MB.
#include <cstdlib>

#include "backends/cuda/quant_device.cuh"

namespace cera::cuda {
namespace {

struct GemvK {
    const uint8_t* q;   // quant stream (float types: the rows)
    const uint8_t* m;   // scale stream
    int64_t row0, rows, nb;  // nb: blocks (quantized) or 8-element items (float) per row
    int64_t k;
    const int32_t* ids;
    int x_div;
    const float* x;
    int64_t ldx;
    const float* bias;
    float* y;
    int64_t ldy;
    int accumulate;
    const uint8_t* xq;
    int64_t ldxq;
};

template <int R>
__device__ __forceinline__ void finish(const GemvK& a, float (&acc)[R], int64_t r0, int yi) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float s = warp_sum(acc[r]);
        if (lane == r && r0 + r < a.rows) {
            float* out = a.y + int64_t(yi) * a.ldy + r0 + r;
            float v = s;
            if (a.bias) v += a.bias[r0 + r];
            if (a.accumulate) v += *out;
            *out = v;
        }
    }
}

// Block: 4 warps, R rows each. The first items' weights are loaded before waiting for the previous
// kernel (PDL), so the weight stream starts while that kernel drains.
template <GgmlType T, int R>
__global__ void __launch_bounds__(128) gemv_q_kernel(const GemvK a) {
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t r0 = (int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5)) * R;
    const bool live = r0 < a.rows;
    const int yi = blockIdx.y;
    const int64_t n_items = a.nb * Tr::kItems;
    const uint8_t* qrow[R];
    const uint8_t* mrow[R];
    typename Tr::W w[2][R];
    int64_t it[2] = {lane, lane + 32 < n_items ? lane + 32 : lane};
    const bool ids_first = a.ids != nullptr;
    auto set_rows = [&](int64_t mat) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t gr = a.row0 + mat * a.rows + min(r0 + r, a.rows - 1);
            qrow[r] = a.q + gr * a.nb * L.q_bytes;
            mrow[r] = a.m + gr * a.nb * L.m_bytes;
        }
    };
    auto load_w = [&]() {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r)
                w[u][r] = Tr::load_w(qrow[r], mrow[r], it[u] / Tr::kItems, int(it[u] % Tr::kItems));
    };
    if (!ids_first && live && lane < n_items) {  // expert ids come from an earlier kernel: wait first
        set_rows(0);
        load_w();
    }
    pdl_wait();
    if (!live) return;
    const uint8_t* xrow = a.xq + int64_t(yi / a.x_div) * a.ldxq;
    const int8_t* xq = reinterpret_cast<const int8_t*>(xrow);
    const float* xd = reinterpret_cast<const float*>(xrow + a.k);
    if (ids_first) {
        set_rows(a.ids[yi]);
        if (lane < n_items) load_w();
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t i0 = lane; i0 < n_items; i0 += 64) {
        const bool ok1 = i0 + 32 < n_items;
        if (i0 != lane) {
            it[0] = i0, it[1] = ok1 ? i0 + 32 : i0;
            load_w();
        }
        XQ x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            int ea, eb;
            const int j = int(it[u] % Tr::kItems);
            Tr::runs(j, ea, eb);
            const int base = int(it[u] / Tr::kItems) * L.block_elems;
            x[u] = load_xq(xq, xd, base + ea, base + eb);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] += Tr::dot(w[0][r], x[0], int(it[0] % Tr::kItems));
            if (ok1) acc[r] += Tr::dot(w[1][r], x[1], int(it[1] % Tr::kItems));
        }
    }
    finish<R>(a, acc, r0, yi);
}

template <GgmlType T, int R>
__global__ void __launch_bounds__(128) gemv_f_kernel(const GemvK a) {
    constexpr int es = float_type_bytes(T);
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t r0 = (int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5)) * R;
    if (r0 >= a.rows) {
        pdl_wait();
        return;
    }
    const int yi = blockIdx.y;
    const uint8_t* row[R];
    float w[2][R][8];
    int64_t it[2] = {lane, lane + 32 < a.nb ? lane + 32 : lane};
    auto set_rows = [&](int64_t mat) {
#pragma unroll
        for (int r = 0; r < R; ++r) row[r] = a.q + (a.row0 + mat * a.rows + min(r0 + r, a.rows - 1)) * a.k * es;
    };
    auto load_w = [&]() {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) FTraits<T>::load(row[r], it[u], w[u][r]);
    };
    if (!a.ids) {
        set_rows(0);
        if (lane < a.nb) load_w();
    }
    pdl_wait();
    if (a.ids) {
        set_rows(a.ids[yi]);
        if (lane < a.nb) load_w();
    }
    const float* x = a.x + int64_t(yi / a.x_div) * a.ldx;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t i0 = lane; i0 < a.nb; i0 += 64) {
        const bool ok1 = i0 + 32 < a.nb;
        if (i0 != lane) {
            it[0] = i0, it[1] = ok1 ? i0 + 32 : i0;
            load_w();
        }
        float4 xv[2][2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            xv[u][0] = *reinterpret_cast<const float4*>(x + 8 * it[u]);
            xv[u][1] = *(reinterpret_cast<const float4*>(x + 8 * it[u]) + 1);
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            if (u == 1 && !ok1) break;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float* v = w[u][r];
                float s = v[0] * xv[u][0].x;
                s = fmaf(v[1], xv[u][0].y, s);
                s = fmaf(v[2], xv[u][0].z, s);
                s = fmaf(v[3], xv[u][0].w, s);
                s = fmaf(v[4], xv[u][1].x, s);
                s = fmaf(v[5], xv[u][1].y, s);
                s = fmaf(v[6], xv[u][1].z, s);
                s = fmaf(v[7], xv[u][1].w, s);
                acc[r] += s;
            }
        }
    }
    finish<R>(a, acc, r0, yi);
}

// Any row length: one warp per row, one element per lane and step.
template <GgmlType T>
__global__ void __launch_bounds__(128) gemv_f_scalar_kernel(const GemvK a) {
    constexpr int es = float_type_bytes(T);
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t r0 = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
    if (r0 >= a.rows) return;
    const int yi = blockIdx.y;
    const int64_t mat = a.ids ? a.ids[yi] : 0;
    const float* x = a.x + int64_t(yi / a.x_div) * a.ldx;
    const uint8_t* row = a.q + (a.row0 + mat * a.rows + r0) * a.k * es;
    float acc[1] = {0.0f};
    for (int64_t i = lane; i < a.k; i += 32) acc[0] = fmaf(FTraits<T>::one(row, i), x[i], acc[0]);
    finish<1>(a, acc, r0, yi);
}

// One warp per 32-element group: d = max|x| / 127, q = round(x / d).
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_rows, int64_t k, int64_t ldx,
                                   uint8_t* __restrict__ xq) {
    pdl_trigger();
    pdl_wait();
    const int64_t groups_per_row = k / 32;
    const int64_t g = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (g >= n_rows * groups_per_row) return;
    const int lane = threadIdx.x & 31;
    const int64_t row = g / groups_per_row, c = g % groups_per_row;
    const float v = x[row * ldx + c * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = xq + row * q8_row_bytes(k);
    out[c * 32 + lane] = uint8_t(int8_t(__float2int_rn(v * id)));
    if (lane == 0) reinterpret_cast<float*>(out + k)[c] = d;
}

template <int R>
void launch_r(GgmlType type, const GemvK& k, dim3 grid, cudaStream_t s, bool vec) {
    switch (type) {
#define CERA_Q(T)                                                            \
    case GgmlType::T:                                            \
        launch(gemv_q_kernel<GgmlType::T, R>, grid, 128, 0, s, k); \
        break;
        CERA_Q(kQ4_0) CERA_Q(kQ4_1) CERA_Q(kQ5_0) CERA_Q(kQ5_1) CERA_Q(kQ8_0) CERA_Q(kQ4_K) CERA_Q(kQ5_K) CERA_Q(kQ6_K)
#undef CERA_Q
#define CERA_F(T)                                                                    \
    case GgmlType::T:                                                                \
        if (vec) launch(gemv_f_kernel<GgmlType::T, R>, grid, 128, 0, s, k);          \
        else launch(gemv_f_scalar_kernel<GgmlType::T>, grid, 128, 0, s, k);          \
        break;
        CERA_F(kF32) CERA_F(kF16) CERA_F(kBF16)
#undef CERA_F
        default: CERA_CHECK(false, "gemv: unsupported weight type %s", type_name(type));
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_q8(const float* x, int64_t n_rows, int64_t k, int64_t ldx, void* xq, Stream stream) {
    CERA_CHECK(k % 32 == 0, "quantize_q8: k = %lld is not a multiple of 32", (long long)k);
    const int64_t groups = n_rows * (k / 32);
    if (groups == 0) return;
    launch(quantize_q8_kernel, unsigned(ceil_div(groups, 8)), 256, 0, as_stream(stream), x, n_rows, k, ldx,
           static_cast<uint8_t*>(xq));
    CUDA_CHECK_LAUNCH();
}

bool pdl_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("CERA_CUDA_PDL");
        return !(e && e[0] == '0');
    }();
    return on;
}

void gemv(const GemvArgs& a, Stream stream) {
    const GgmlType type = a.w.type;
    const int64_t k = a.w.k;
    if (a.rows == 0 || a.n_y == 0) return;
    GemvK p{};
    const QuantLayout L = quant_layout(type);
    const bool quant = L.block_elems > 0;
    bool vec = true;
    if (quant) {
        CERA_CHECK(a.xq != nullptr && k % L.block_elems == 0);
        p.nb = k / L.block_elems;
        p.q = static_cast<const uint8_t*>(a.w.image);
        p.m = p.q + a.w.image_rows * p.nb * L.q_bytes;
    } else {
        CERA_CHECK(is_float_type(type) && a.x != nullptr, "gemv: unsupported weight type %s", type_name(type));
        p.q = static_cast<const uint8_t*>(a.w.image);
        vec = k % 8 == 0 && a.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
        p.nb = k / 8;
    }
    p.row0 = a.w.row0, p.rows = a.rows, p.k = k;
    p.ids = a.ids, p.x_div = a.x_div;
    p.x = a.x, p.ldx = a.ldx;
    p.xq = static_cast<const uint8_t*>(a.xq), p.ldxq = q8_row_bytes(k);
    p.bias = a.bias, p.y = a.y, p.ldy = a.ldy, p.accumulate = a.accumulate;
    static const int forced = [] {
        const char* e = std::getenv("CERA_CUDA_GEMV_R");  // benchmarks: force rows per warp
        return e ? std::atoi(e) : 0;
    }();
    int R = a.rows_per_warp ? a.rows_per_warp : forced;
    if (!vec || (R != 1 && R != 2 && R != 4)) R = vec ? 0 : 1;
    if (R == 0) {
        // Enough warps to cover the SMs several times over first, then activation reuse.
        const int64_t work = a.rows * a.n_y;
        // Measured on the H200 (bench/NOTES.md): 4 rows per warp is best for Q4_0/Q8_0/float from 2048
        // rows; the K-quants, heavier per byte, do better with 2 below LM-head sizes.
        const bool kquant = L.block_elems == 256;
        R = work >= 2048 ? (kquant && work < 32768 ? 2 : 4) : work >= 512 ? 2 : 1;
    }
    const dim3 grid(unsigned(ceil_div(a.rows, 4 * R)), unsigned(a.n_y));
    cudaStream_t s = as_stream(stream);
    if (R == 4) launch_r<4>(type, p, grid, s, vec);
    else if (R == 2) launch_r<2>(type, p, grid, s, vec);
    else launch_r<1>(type, p, grid, s, vec);
}

}  // namespace cera::cuda
