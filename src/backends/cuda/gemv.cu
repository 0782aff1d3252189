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
// Variants: quantized (CERA_QUANT_TYPES) x R; float (F32 F16 BF16) x R with
// k % 8 == 0; a scalar fallback for float rows of other lengths.
// Roofline: bytes = weight image (+ x, L2-resident). H200 ~4.3 TB/s copy bandwidth: a 2048 x 8192
// Q4_0 matrix (9.4 MB) takes >= 2.2 us; launch and tail effects dominate below ~4 MB.
#include <algorithm>

#include "backends/cuda/gemv_device.cuh"

namespace cera::cuda {
namespace {

// RMSNorm of one row of n = 128 E floats by a block of 128 threads, thread t elements [t E, t E + E)
// (x read from L2: written by other blocks of this launch), with the same arithmetic as rms_norm_kernel
// but for the order of the sum of squares; the 8-bit groups as warp_quantize_q8 makes them, a group
// spread over 32 / E neighbouring threads.
template <int E>
__device__ __forceinline__ void norm_row_128(const float* x, const float* w, float eps, int64_t n, float* out,
                                             uint8_t* xq) {
    static_assert(E % 2 == 0 && 32 % E == 0);
    __shared__ float red[4];
    const int t = threadIdx.x;
    float v[E], wv[E];
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int j = 0; j < E / 4; ++j) {
            const float4 a = __ldcg(reinterpret_cast<const float4*>(x + t * E) + j);
            const float4 b = w ? __ldg(reinterpret_cast<const float4*>(w + t * E) + j) : make_float4(1.f, 1.f, 1.f, 1.f);
            v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
            wv[4 * j] = b.x, wv[4 * j + 1] = b.y, wv[4 * j + 2] = b.z, wv[4 * j + 3] = b.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < E / 2; ++j) {
            const float2 a = __ldcg(reinterpret_cast<const float2*>(x + t * E) + j);
            const float2 b = w ? __ldg(reinterpret_cast<const float2*>(w + t * E) + j) : make_float2(1.f, 1.f);
            v[2 * j] = a.x, v[2 * j + 1] = a.y, wv[2 * j] = b.x, wv[2 * j + 1] = b.y;
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) ss = fmaf(v[j], v[j], ss);
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    __syncthreads();
    ss = red[0] + red[1] + red[2] + red[3];
    const float r = rsqrtf(ss / float(n) + eps);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = v[j] * r * wv[j], m = fmaxf(m, fabsf(v[j]));
#pragma unroll
    for (int j = 0; j < E / 2; ++j) reinterpret_cast<float2*>(out + t * E)[j] = make_float2(v[2 * j], v[2 * j + 1]);
    if (!xq) return;
#pragma unroll
    for (int o = 1; o < 32 / E; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
#pragma unroll
    for (int j = 0; j < E / 2; ++j) {
        const uint32_t q0 = uint8_t(int8_t(__float2int_rn(v[2 * j] * id)));
        const uint32_t q1 = uint8_t(int8_t(__float2int_rn(v[2 * j + 1] * id)));
        reinterpret_cast<uint16_t*>(xq + t * E)[j] = uint16_t(q0 | q1 << 8);
    }
    if ((t * E) % 32 == 0) reinterpret_cast<float*>(xq + n)[t * E / 32] = d;
}

// Split-K: the ks warps of each row group add their partial row sums through shared memory; after it
// lane 0 of every warp holds its group's totals in acc and the other lanes 0 (finish() sums the warp
// again). Every thread of the block calls it.
template <int R>
__device__ __forceinline__ void ksplit_sum(float (&acc)[R], int ks) {
    __shared__ float part_s[4][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float s = warp_sum_rows<R>(acc);
    if (lane % (32 / R) == 0) part_s[warp][lane / (32 / R)] = s;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float t = 0.0f;
        for (int j = 0; j < ks; ++j) t += part_s[(warp & ~(ks - 1)) + j][r];
        acc[r] = lane == 0 ? t : 0.0f;
    }
}

// The residual product's RMSNorm (GemvK::nctr): every block takes a ticket after writing its rows; the
// last block of row yi to finish normalizes the whole row and puts the counter back to zero.
__device__ __forceinline__ void last_block_norm(const GemvK& a, const Seg& sg, int yi) {
    if (block_ticket(a.nctr + yi) != gridDim.x - 1) return;
    if (threadIdx.x == 0) a.nctr[yi] = 0;
    const int64_t n = sg.rows;
    const float* x = sg.res_out + int64_t(yi) * sg.ldy;
    float* out = a.nout + int64_t(yi) * n;
    uint8_t* xq = a.nxq ? a.nxq + int64_t(yi) * q8_row_bytes(n) : nullptr;
    switch (n) {
        case 256: norm_row_128<2>(x, a.nw, a.neps, n, out, xq); break;
        case 512: norm_row_128<4>(x, a.nw, a.neps, n, out, xq); break;
        case 1024: norm_row_128<8>(x, a.nw, a.neps, n, out, xq); break;
        case 2048: norm_row_128<16>(x, a.nw, a.neps, n, out, xq); break;
        case 4096: norm_row_128<32>(x, a.nw, a.neps, n, out, xq); break;
        default: break;  // gemv_norm_supported
    }
}

// Block: 4 warps, R rows each, or (split-K, short and wide matrices) 4 / ksplit row groups of R
// rows, each summed by ksplit warps over interleaved 64-item strips of k and combined in shared
// memory, so that a 2048-row matrix still puts several warps on every SM. The first items' weights
// are loaded before waiting for the previous kernel (PDL), so the weight stream starts while that
// kernel drains (expert ids come from an earlier kernel: those rows are known only after the wait).
// With GemvK::nctr the last block to finish also makes the RMSNorm of the residual output
// (last_block_norm), so no norm launch follows a residual product.
template <GgmlType T, int R>
__global__ void __launch_bounds__(128) gemv_q_kernel(const GemvK a) {
    constexpr QuantLayout L = quant_layout(T);
    pdl_trigger();
    int64_t bx;
    const Seg sg = pick_seg(a, bx);
    const int warp = threadIdx.x >> 5, ks = a.ksplit;
    const int group = warp / ks, part = warp % ks;
    const int64_t r0 = (bx * (4 / ks) + group) * R;
    const bool live = r0 < sg.rows;
    const int yi = blockIdx.y;
    auto set_rows = [&](const uint8_t** qrow, const uint8_t** mrow) {
        const int64_t mat = a.ids ? a.ids[yi] : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t gr = sg.row0 + mat * sg.rows + min(r0 + r, sg.rows - 1);
            qrow[r] = sg.q + gr * a.nb * L.q_bytes;
            mrow[r] = sg.m + gr * a.nb * L.m_bytes;
        }
    };
    // The residual RMSNorm's weight into L2 for whichever block ends last (a weight: before the wait).
    if (a.nctr && a.nw && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        prefetch_l2(a.nw, uint32_t(sg.rows * sizeof(float)));
    float acc[R], res = 0.0f;
    auto hook = [&] {
        if (part == 0) res = residual_in<R>(sg, r0, yi, live);
    };
    dot_rows<T, R>(a, yi, live, a.ids != nullptr, set_rows, acc, part, ks, hook);
    trace_mark(0);
    if (ks > 1) ksplit_sum<R>(acc, ks);
    trace_mark(1);
    const bool fin = live && part == 0;
    if (fin) finish<R>(a, sg, acc, r0, yi, &res);
    if (a.nctr) last_block_norm(a, sg, yi);
}

// F16 / BF16 / F32 rows against f32 activations: lane l takes 8-element items l and l + 32 of a
// 64-item strip, R rows a warp, the first items' loads before the PDL wait; split-K as gemv_q_kernel
// (a 2048-row product of a 1-2B model is otherwise 512 warps, too few loads in flight for the HBM).
template <GgmlType T, int R>
__global__ void __launch_bounds__(128) gemv_f_kernel(const GemvK a) {
    constexpr int es = float_type_bytes(T);
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    int64_t bx;
    const Seg sg = pick_seg(a, bx);
    const int warp = threadIdx.x >> 5, ks = a.ksplit;
    const int group = warp / ks, part = warp % ks;
    const int64_t r0 = (bx * (4 / ks) + group) * R;
    if (ks == 1 && r0 >= sg.rows) {
        pdl_wait();
        return;
    }
    const bool live = r0 < sg.rows;
    const int yi = blockIdx.y;
    const uint8_t* row[R];
    float w[2][R][8];
    const int64_t first = lane + 64 * part;
    int64_t it[2] = {first, first + 32 < a.nb ? first + 32 : first};
    auto set_rows = [&](int64_t mat) {
#pragma unroll
        for (int r = 0; r < R; ++r) row[r] = sg.q + (sg.row0 + mat * sg.rows + min(r0 + r, sg.rows - 1)) * a.k * es;
    };
    auto load_w = [&]() {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) FTraits<T>::load(row[r], it[u], w[u][r]);
    };
    if (!a.ids) {
        set_rows(0);
        if (live && first < a.nb) load_w();
    }
    pdl_wait();
    if (a.ids) {
        set_rows(a.ids[yi]);
        if (live && first < a.nb) load_w();
    }
    const float* x = a.x + int64_t(yi / a.x_div) * a.ldx;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t i0 = first; live && i0 < a.nb; i0 += 64 * ks) {
        const bool ok1 = i0 + 32 < a.nb;
        if (i0 != first) {
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
    if (ks > 1) {
        ksplit_sum<R>(acc, ks);
        if (!live || part != 0) return;
    }
    finish<R>(a, sg, acc, r0, yi);
}

// Any row length: one warp per row, one element per lane and step.
template <GgmlType T>
__global__ void __launch_bounds__(128) gemv_f_scalar_kernel(const GemvK a) {
    constexpr int es = float_type_bytes(T);
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    int64_t bx;
    const Seg sg = pick_seg(a, bx);
    const int64_t r0 = bx * 4 + (threadIdx.x >> 5);
    if (r0 >= sg.rows) return;
    const int yi = blockIdx.y;
    const int64_t mat = a.ids ? a.ids[yi] : 0;
    const float* x = a.x + int64_t(yi / a.x_div) * a.ldx;
    const uint8_t* row = sg.q + (sg.row0 + mat * sg.rows + r0) * a.k * es;
    float acc[1] = {0.0f};
    for (int64_t i = lane; i < a.k; i += 32) acc[0] = fmaf(FTraits<T>::one(row, i), x[i], acc[0]);
    finish<1>(a, sg, acc, r0, yi);
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
    warp_quantize_q8(x[row * ldx + c * 32 + lane], xq + row * q8_row_bytes(k), k, c);
}

// The L1 / shared-memory split the plain GEMV prefers (prefer_carveout), per weight type:
//   Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, IQ4_NL, IQ4_XS: the most shared memory (100), like the staged
//     SwiGLU pair between the out-projection and the down product, so that their blocks share SMs (the
//     pair's blocks are resident, their rows requested, before the out-projection ends; the down's
//     before the pair ends);
//   the heavy_scales types (Q2_K, Q3_K, Q5_K, Q6_K): the most L1 (0), which their scale loads go
//     through;
//   Q8_0: the driver's choice (both fixed splits are slower).
// (-1: the driver's choice.)
int gemv_carveout(GgmlType t) { return heavy_scales(t) ? 0 : t == GgmlType::kQ8_0 ? -1 : 100; }

template <int R>
void launch_r(GgmlType type, const GemvK& k, dim3 grid, cudaStream_t s, bool vec) {
    switch (type) {
#define CERA_Q(T)                                                                             \
    case GgmlType::T: {                                                                       \
        prefer_carveout<gemv_q_kernel<GgmlType::T, R>>(gemv_carveout(GgmlType::T));           \
        launch(gemv_q_kernel<GgmlType::T, R>, grid, 128, 0, s, k);                            \
        break;                                                                                \
    }
        CERA_QUANT_TYPES(CERA_Q)
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
}

}  // namespace

void quantize_q8(const float* x, int64_t n_rows, int64_t k, int64_t ldx, void* xq, Stream stream) {
    CERA_CHECK(k % 32 == 0, "quantize_q8: k = %lld is not a multiple of 32", (long long)k);
    const int64_t groups = n_rows * (k / 32);
    if (groups == 0) return;
    launch(quantize_q8_kernel, unsigned(ceil_div(groups, 8)), 256, 0, as_stream(stream), x, n_rows, k, ldx,
           static_cast<uint8_t*>(xq));
}

namespace {
thread_local bool t_pdl_skip = false;
}  // namespace
void pdl_skip_next() { t_pdl_skip = true; }
bool pdl_take_skip() {
    const bool s = t_pdl_skip;
    t_pdl_skip = false;
    return s;
}


namespace {

// Rows per warp from the shape: enough warps to cover the SMs several times over first, then
// activation reuse: 4 rows per warp for Q4_0/Q8_0/float from 2048 rows; Q5_K / Q6_K (heavy_scales),
// heavier per byte, take 2 below LM-head sizes.
int pick_r(GgmlType type, int64_t rows, int n_y, int requested) {
    if (requested == 1 || requested == 2 || requested == 4) return requested;
    const int64_t work = rows * n_y;
    return work >= 2048 ? (heavy_scales(type) && work < 32768 ? 2 : 4) : work >= 512 ? 2 : 1;
}

// Split-K for short and wide matrices: while the row warps do not fill the GPU (< 2048 warps, ~16
// per SM), give each row group 2 or 4 warps, each at least 64 items of k (fewer cost more in the
// cross-warp sums than the extra warps bring).
int pick_ksplit(int64_t n_items, int64_t row_warps) {
    constexpr int strip = 64;
    constexpr int64_t target = 2048;
    int ks = 1;
    while (ks < 4 && row_warps * ks < target && n_items >= strip * 2 * ks) ks *= 2;
    return ks;
}

}  // namespace

void gemv_multi(const GemvArgs* a, int n, Stream stream) {
    CERA_CHECK(n >= 1 && n <= kMaxSegs && !a[0].pro_x);
    if (n == 1 && gemv_stream(a[0], stream)) return;  // an LM head (gemv_stream.cu)
    bool vec = true;
    GemvK p = common_params(a[0], vec);
    int64_t max_rows = 0, total_rows = 0;
    for (int i = 0; i < n; ++i) {
        CERA_CHECK(a[i].w.type == a[0].w.type && a[i].w.k == a[0].w.k && a[i].n_y == a[0].n_y &&
                       a[i].xq == a[0].xq && a[i].x == a[0].x && (a[i].ids == nullptr) == (a[0].ids == nullptr) &&
                       (n == 1 || a[i].ids == nullptr),
                   "gemv_multi: products of one launch must share the input, type, k and n_y");
        max_rows = std::max(max_rows, a[i].rows);
        total_rows += a[i].rows;
    }
    if (total_rows == 0 || a[0].n_y == 0) return;
    cudaStream_t s = as_stream(stream);
    const GgmlType type = a[0].w.type;
    const QuantLayout L = quant_layout(a[0].w.type);
    int R = pick_r(type, total_rows, a[0].n_y, a[0].rows_per_warp);
    if (!vec) R = 1;
    if (L.block_elems > 0) {
        const int items = L.block_elems == 256 ? 8 : 1;  // QTraits<T>::kItems
        p.ksplit = pick_ksplit(p.nb * items, ceil_div(total_rows, R) * a[0].n_y);
    } else if (vec) {
        p.ksplit = pick_ksplit(p.nb, ceil_div(total_rows, R) * a[0].n_y);  // 8-element items
    }
    const int rows_per_block = 4 / p.ksplit * R;
    unsigned blocks = 0;
    for (int i = 0; i < n; ++i) {
        p.seg[i] = make_seg(a[i]);
        p.seg_start[i] = blocks;
        blocks += unsigned(ceil_div(a[i].rows, rows_per_block));
    }
    p.n_seg = n;
    if (a[0].norm_out) {
        CERA_CHECK(n == 1 && gemv_norm_supported(a[0]), "gemv: a residual RMSNorm this launch cannot take");
        p.nw = a[0].norm_w, p.neps = a[0].norm_eps, p.nout = a[0].norm_out;
        p.nxq = static_cast<uint8_t*>(a[0].norm_xq), p.nctr = a[0].norm_ctr;
    }
    const dim3 grid(blocks, unsigned(a[0].n_y));
    if (R == 4) launch_r<4>(type, p, grid, s, vec);
    else if (R == 2) launch_r<2>(type, p, grid, s, vec);
    else launch_r<1>(type, p, grid, s, vec);
}

void gemv(const GemvArgs& a, Stream stream) { gemv_multi(&a, 1, stream); }

bool gemv_norm_supported(const GemvArgs& a) {
    const int64_t n = a.rows;
    auto at16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return quant_layout(a.w.type).block_elems > 0 && !a.ids && a.res_out && a.ldy == n &&
           (n == 256 || n == 512 || n == 1024 || n == 2048 || n == 4096) && a.n_y >= 1 && a.n_y <= 64 && at16(a.res_out) &&
           (!a.norm_w || at16(a.norm_w)) && at16(a.norm_out) && (!a.norm_xq || at16(a.norm_xq));
}

bool gemv_norm_prologue_supported(GgmlType type, int64_t k, int n_y) {
    return quant_layout(type).block_elems > 0 && n_y == 1 && k % 32 == 0 && k > 0 && k <= kProMaxK;
}

}  // namespace cera::cuda
