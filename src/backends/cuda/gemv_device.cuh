// The pieces the decode GEMV kernels share (gemv.cu, gemv_glu.cu, gemv_fused.cu, gemv_stream.cu): the launch
// parameters, the warp sums of several rows, the row dot products (weight loads issued before the PDL
// wait, or rows in shared memory), and the host side's launch parameters from GemvArgs.
#pragma once
#include "backends/cuda/quant_device.cuh"

namespace cera::cuda {
namespace {

// One product of a launch. A launch holds up to kMaxSegs products that share the input, the weight
// type and k; blockIdx.x picks the segment (seg_start), so q/k/v or gate/up are one launch.
struct Seg {
    const uint8_t* q;   // quant stream (float types: the rows)
    const uint8_t* m;   // scale stream
    int64_t row0, rows;
    const float* bias;
    float* y;
    int64_t ldy;
    const float* res_a;  // residual epilogue: res_out = res_a + res_scale * y (or null)
    float* res_out;
    float res_scale;
};

struct GemvK {
    Seg seg[kMaxSegs];
    unsigned seg_start[kMaxSegs];  // first blockIdx.x of each segment
    int n_seg;
    int64_t nb;  // blocks (quantized) or 8-element items (float) per row
    int ksplit;  // warps of a block sharing one row group, each a 1/ksplit share of k (1, 2, 4)
    int64_t k;
    const int32_t* ids;
    int x_div;
    const float* x;
    int64_t ldx;
    int accumulate;
    const uint8_t* xq;
    int64_t ldxq;
    float* act;       // SwiGLU pair: silu(gate) * up, [n_y, rows]
    uint8_t* act_xq;  // and its quantize_q8 rows (or null)
    // RMSNorm of seg[0]'s residual rows by the last block of each row (GemvArgs::norm_out), or nctr null.
    const float* nw;
    float neps;
    float* nout;
    uint8_t* nxq;
    unsigned* nctr;
    // RMSNorm prologue (GemvArgs::pro_x, or px null): the input row is made by every block (norm_prologue).
    const float* px;
    const float* pw;
    float peps;
    float* pout;
    // SwiGLU pair: the weight streams of the product launched after it, prefetched into L2 (or null).
    const uint8_t* l2_q;
    const uint8_t* l2_m;
    int64_t l2_qbytes, l2_mbytes;
};

// The segment of this block and the block's index inside it.
__device__ __forceinline__ Seg pick_seg(const GemvK& a, int64_t& bx) {
    const unsigned b = blockIdx.x;
    Seg s = a.seg[0];
    bx = b;
    if (a.n_seg > 1 && b >= a.seg_start[1]) s = a.seg[1], bx = b - a.seg_start[1];
    if (a.n_seg > 2 && b >= a.seg_start[2]) s = a.seg[2], bx = b - a.seg_start[2];
    return s;
}

// The RMSNorm prologue (GemvK::px, one token): the block makes y = rms_norm(px) * pw of the k-float
// row and its quantize_q8 bytes in shared memory, with the arithmetic of rms_norm_kernel and
// warp_quantize_q8 but for the order of the sum of squares; block 0 also writes y to pout.
// Shared memory at xs (prologue_smem): the 8-bit row (k int8, k / 32 float scales), then x and w as
// f32 (staging, so that no registers are held while the weight loads are in flight). The norm weight
// is a bulk copy issued before the PDL wait (norm_prologue_pre, thread 0), x is read after it; a
// 32-group is 8 neighbouring lanes of float4s.
__device__ __forceinline__ uint64_t* prologue_bar() {
    __shared__ uint64_t bar;
    return &bar;
}
// x_regs: for norm_prologue_regs, whose shared memory holds no x before w.
__device__ __forceinline__ void norm_prologue_pre(const GemvK& a, uint8_t* xs, bool x_regs = false) {
    if (!xs || !a.pw || threadIdx.x != 0) return;
    uint64_t* bar = prologue_bar();
    const uint32_t bytes = uint32_t(a.k * sizeof(float));
    mbar_init(bar, 1);
    mbar_init_fence();
    mbar_expect_tx(bar, bytes);
    bulk_copy(xs + q8_row_bytes(a.k) + (x_regs ? 0 : bytes), a.pw, bytes, bar);
}
// One float4 of thread t of the prologue's row, at i of n4 (ok: i < n4): y = v * r * w, the 8-lane group's scale
// (every lane of the group takes part in the shuffles), then y's four 8-bit values and the group's
// scale into the row at xs (scales at xd), and y into pout with `out`.
__device__ __forceinline__ void prologue_group(const GemvK& a, uint8_t* xs, float* xd, int t, int64_t i, bool ok,
                                               bool out, const float4& v, const float4& w, float r) {
    const float4 y = make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
    float m = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (!ok) return;
    if (out) reinterpret_cast<float4*>(a.pout)[i] = y;
    const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint32_t q = uint32_t(uint8_t(int8_t(__float2int_rn(y.x * id)))) |
                       uint32_t(uint8_t(int8_t(__float2int_rn(y.y * id)))) << 8 |
                       uint32_t(uint8_t(int8_t(__float2int_rn(y.z * id)))) << 16 |
                       uint32_t(uint8_t(int8_t(__float2int_rn(y.w * id)))) << 24;
    reinterpret_cast<uint32_t*>(xs)[i] = q;
    if ((t & 7) == 0) xd[i / 8] = d;
}
// Every thread of the block calls it, after the PDL wait; it ends with a block barrier.
__device__ __forceinline__ void norm_prologue(const GemvK& a, uint8_t* xs) {
    __shared__ float red[32];
    const int t = threadIdx.x, bd = blockDim.x;
    const int64_t n4 = a.k / 4;
    const float4* x4 = reinterpret_cast<const float4*>(a.px);
    float4* xf = reinterpret_cast<float4*>(xs + q8_row_bytes(a.k));
    const float4* wf = xf + n4;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = t; i < n4; i += bd) {
        const float4 v = __ldcg(x4 + i);
        xf[i] = v;  // read back by this thread only
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / float(a.k) + a.peps);
    if (a.pw) mbar_wait(prologue_bar(), 0);
    float* xd = reinterpret_cast<float*>(xs + a.k);
    const bool out = a.pout && blockIdx.x == 0;
    // Whole warps run every step (bd % 32 == 0), so the 8-lane shuffles see every lane of a group.
    for (int64_t i0 = 0; i0 < n4; i0 += bd) {
        const int64_t i = i0 + t;
        const bool ok = i < n4;
        const float4 v = ok ? xf[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 w = ok && a.pw ? wf[i] : make_float4(1.f, 1.f, 1.f, 1.f);
        prologue_group(a, xs, xd, t, i, ok, out, v, w, r);
    }
    __syncthreads();
}

// norm_prologue with x in registers (launches whose blocks hold no weights in registers across the
// wait; at most kRegs float4s of x a thread): shared memory holds the 8-bit row, then w
// (prologue_bytes(k, true)); norm_prologue_pre(a, xs, true) issues w's copy there.
template <int kRegs>
__device__ __forceinline__ void norm_prologue_regs(const GemvK& a, uint8_t* xs) {
    __shared__ float red[32];
    const int t = threadIdx.x, bd = blockDim.x;
    const int64_t n4 = a.k / 4;
    const float4* x4 = reinterpret_cast<const float4*>(a.px);
    const float4* wf = reinterpret_cast<const float4*>(xs + q8_row_bytes(a.k));
    float4 v[kRegs];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
        const int64_t i = t + int64_t(j) * bd;
        v[j] = i < n4 ? __ldcg(x4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        ss = fmaf(v[j].x, v[j].x, ss);
        ss = fmaf(v[j].y, v[j].y, ss);
        ss = fmaf(v[j].z, v[j].z, ss);
        ss = fmaf(v[j].w, v[j].w, ss);
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / float(a.k) + a.peps);
    if (a.pw) mbar_wait(prologue_bar(), 0);
    float* xd = reinterpret_cast<float*>(xs + a.k);
    const bool out = a.pout && blockIdx.x == 0;
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
        const int64_t i = t + int64_t(j) * bd;
        if (int64_t(j) * bd >= n4) break;  // the whole block leaves together: the shuffles stay whole
        const bool ok = i < n4;
        const float4 w = ok && a.pw ? wf[i] : make_float4(1.f, 1.f, 1.f, 1.f);
        prologue_group(a, xs, xd, t, i, ok, out, v[j], w, r);
    }
    __syncthreads();
}

// The warp sums of R values at once (R = 1, 2, 4 or 8): each step of the butterfly halves the values a
// lane carries until one is left, so it takes 5 + R - 1 shuffles instead of 5 R. The total of v[r]
// ends in lanes r * 32 / R .. (r + 1) * 32 / R - 1; the function returns the total this lane holds.
template <int R>
__device__ __forceinline__ float warp_sum_rows(const float (&v)[R]) {
    static_assert(R == 1 || R == 2 || R == 4 || R == 8);
    const int lane = threadIdx.x & 31;
    float c[R];
#pragma unroll
    for (int i = 0; i < R; ++i) c[i] = v[i];
    int o = 16;
    // Each step, the lanes with bit o keep the upper half of their values and add the partner's.
#pragma unroll
    for (int n = R; n > 1; n /= 2, o /= 2) {
        const bool hi = lane & o;
#pragma unroll
        for (int i = 0; i < n / 2; ++i)
            c[i] = (hi ? c[i + n / 2] : c[i]) + __shfl_xor_sync(0xffffffffu, hi ? c[i] : c[i + n / 2], o);
    }
    float keep = c[0];
    for (; o > 0; o >>= 1) keep += __shfl_xor_sync(0xffffffffu, keep, o);
    return keep;
}

// The residual input of the row this lane writes in finish() (lanes r * 32 / R write row r0 + r), or
// 0: loaded right after the PDL wait, beside the activation loads, so that its L2 round trip is not
// one more link after the dots. (res_a may be res_out: the same thread reads it before writing.)
template <int R>
__device__ __forceinline__ float residual_in(const Seg& sg, int64_t r0, int yi, bool live) {
    constexpr int W = 32 / R;
    const int lane = threadIdx.x & 31, r = lane / W;
    if (!sg.res_out || !live || lane % W != 0 || r0 + r >= sg.rows) return 0.0f;
    return sg.res_a[int64_t(yi) * sg.ldy + r0 + r];
}

// res: the row's residual input from residual_in(), or null to read it here.
template <int R>
__device__ __forceinline__ void finish(const GemvK& a, const Seg& sg, float (&acc)[R], int64_t r0, int yi,
                                       const float* res = nullptr) {
    constexpr int W = 32 / R;  // lanes holding one row's total
    const int lane = threadIdx.x & 31, r = lane / W;
    const float s = warp_sum_rows<R>(acc);
    if (lane % W == 0 && r0 + r < sg.rows) {
        const int64_t o = int64_t(yi) * sg.ldy + r0 + r;
        float v = s;
        if (sg.bias) v += sg.bias[r0 + r];
        if (a.accumulate) v += sg.y[o];
        sg.y[o] = v;
        if (sg.res_out) sg.res_out[o] = (res ? *res : sg.res_a[o]) + sg.res_scale * v;
    }
}

// The dot products of NR weight rows with one 8-bit activation row: lane l takes items l, l + 32,
// ... of every row, two items x NR rows of 16-byte loads in flight. set_rows(qrow, mrow) fills the
// rows' stream pointers; it runs before the PDL wait (weights only) unless `rows_after_wait`.
// `part` of `parts` (split-K): the warp takes the 32-item strips part, part + parts, ... (two strips,
// `parts` apart, per step). Xs = std::true_type: the activation row is xs, in shared memory
// (norm_prologue), not a.xq (a separate instantiation, so that the a.xq kernels keep their registers).
// Ld: where the rows live (GlobalLd, or PlainLd for copies in shared memory); pre() runs right
// before the PDL wait (the weight loads issued), hook() right after it; wait = false: the caller
// has waited already (a block's later row groups), so the timeline trace keeps the first wait.
struct NoHook {
    __device__ void operator()() const {}
};
template <GgmlType T, int NR, class SetRows, class Ld = GlobalLd, class Hook = NoHook, class Pre = NoHook,
          class Xs = std::false_type>
__device__ __forceinline__ void dot_rows(const GemvK& a, int yi, bool live, bool rows_after_wait, SetRows set_rows,
                                         float (&acc)[NR], int part = 0, int parts = 1, Hook hook = {},
                                         bool wait = true, Pre pre = {}, const uint8_t* xs = nullptr, Xs = {}) {
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    const int lane = threadIdx.x & 31;
    const int64_t n_items = a.nb * Tr::kItems;
    const int64_t start = lane + 32 * int64_t(part), h = 32 * int64_t(parts), stride = 2 * h;
    const uint8_t* qrow[NR];
    const uint8_t* mrow[NR];
    typename Tr::W w[2][NR];
    int64_t it[2] = {start, start + h < n_items ? start + h : start};
    auto load_w = [&]() {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                w[u][r] = Tr::template load_w<Ld>(qrow[r], mrow[r], it[u] / Tr::kItems, int(it[u] % Tr::kItems));
    };
    if (!rows_after_wait && live && start < n_items) {
        set_rows(qrow, mrow);
        load_w();
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < NR; ++r) settle_w(w[u][r]);
    }
    pre();
    if (wait) pdl_wait();
    hook();
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    if (!live) return;
    const uint8_t* xrow = Xs::value ? xs : a.xq + int64_t(yi / a.x_div) * a.ldxq;
    const int8_t* xq = reinterpret_cast<const int8_t*>(xrow);
    const float* xd = reinterpret_cast<const float*>(xrow + a.k);
    if (rows_after_wait) {
        set_rows(qrow, mrow);
        if (start < n_items) load_w();
    }
    for (int64_t i0 = start; i0 < n_items; i0 += stride) {
        const bool ok1 = i0 + h < n_items;
        if (i0 != start) {
            it[0] = i0, it[1] = ok1 ? i0 + h : i0;
            load_w();
        }
        typename Tr::X x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u)
            x[u] = load_item_x<Tr, Xs::value>(xq, xd, it[u] / Tr::kItems, int(it[u] % Tr::kItems), L.block_elems);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            acc[r] += Tr::dot(w[0][r], x[0], int(it[0] % Tr::kItems));
            if (ok1) acc[r] += Tr::dot(w[1][r], x[1], int(it[1] % Tr::kItems));
        }
    }
}

// Whether a product can take the RMSNorm prologue (GemvArgs::pro_x): gemv_norm_prologue_supported and
// 16-byte aligned rows.
inline bool norm_prologue_fits(const GemvArgs& a) {
    auto at16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return gemv_norm_prologue_supported(a.w.type, a.w.k, a.n_y) && !a.ids && a.x_div == 1 && at16(a.pro_x) &&
           at16(a.pro_w) && at16(a.pro_out);
}
// Dynamic shared memory of the prologue (norm_prologue) for rows of k: the 8-bit row, then x and w as
// f32 (x_regs, norm_prologue_regs: w only); prologue_smem: a launch's (0 without a prologue).
inline size_t prologue_bytes(int64_t k, bool x_regs = false) {
    return size_t(q8_row_bytes(k) + (x_regs ? 4 : 8) * k);
}
inline size_t prologue_smem(const GemvK& p) { return p.px ? prologue_bytes(p.k) : 0; }

// The launch parameters shared by every product of a launch (from the first).
inline GemvK common_params(const GemvArgs& a, bool& vec) {
    const GgmlType type = a.w.type;
    const int64_t k = a.w.k;
    GemvK p{};
    const QuantLayout L = quant_layout(type);
    vec = true;
    if (L.block_elems > 0) {
        CERA_CHECK((a.xq != nullptr || a.pro_x != nullptr) && k % L.block_elems == 0);
        p.nb = k / L.block_elems;
    } else {
        CERA_CHECK(is_float_type(type) && a.x != nullptr, "gemv: unsupported weight type %s", type_name(type));
        vec = k % 8 == 0 && a.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
        p.nb = k / 8;
    }
    p.k = k;
    p.ksplit = 1;
    p.ids = a.ids, p.x_div = a.x_div;
    p.x = a.x, p.ldx = a.ldx;
    p.xq = static_cast<const uint8_t*>(a.xq), p.ldxq = q8_row_bytes(k);
    p.accumulate = a.accumulate;
    return p;
}

// The RMSNorm prologue of a launch that takes it (gemv_glu, gemv_qkv_rope_store, gemv_conv).
inline void set_prologue(GemvK& p, const GemvArgs& a) {
    if (!a.pro_x) return;
    CERA_CHECK(norm_prologue_fits(a), "gemv: an RMSNorm prologue this launch cannot take");
    p.px = a.pro_x, p.pw = a.pro_w, p.peps = a.pro_eps, p.pout = a.pro_out;
}

inline Seg make_seg(const GemvArgs& a) {
    Seg s{};
    s.q = static_cast<const uint8_t*>(a.w.image);
    s.m = scale_stream(a.w);
    s.row0 = a.w.row0, s.rows = a.rows;
    s.bias = a.bias, s.y = a.y, s.ldy = a.ldy;
    s.res_a = a.res_a, s.res_out = a.res_out, s.res_scale = a.res_scale;
    return s;
}

// The dot products of NR weight rows in plain (shared) memory with one 8-bit activation row: lane l
// takes items l, l + 32, ... (Tr: the item traits); rows(r, q, m) gives row r's quant and scale rows.
// XS: the activation row is in shared memory.
template <GgmlType T, class Tr, int NR, bool XS, class Rows>
__device__ __forceinline__ void plain_dot_rows(const int8_t* xq, const float* xd, int n_items, Rows rows,
                                               float (&acc)[NR]) {
    const int lane = threadIdx.x & 31;
#pragma unroll 2
    for (int i = lane; i < n_items; i += 32) {
        const int blk = i / Tr::kItems, j = i % Tr::kItems;
        const auto x = load_item_x<Tr, XS>(xq, xd, blk, j, quant_layout(T).block_elems);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const uint8_t *q, *m;
            rows(r, q, m);
            acc[r] += Tr::dot(Tr::template load_w<PlainLd>(q, m, blk, j), x, j);
        }
    }
}

// The bulk copies need 16-byte aligned sources: the product's first row, in both streams, at a 16-byte
// boundary (sizes are whole 32-row groups: multiples of 16 bytes).
inline bool stage_aligned(const GemvArgs& a, int64_t qrow, int64_t mrow) {
    auto at16 = [](const void* p, int64_t off) { return (reinterpret_cast<uintptr_t>(p) + uintptr_t(off)) % 16 == 0; };
    return at16(a.w.image, a.w.row0 * qrow) && at16(scale_stream(a.w), a.w.row0 * mrow);
}

}  // namespace
}  // namespace cera::cuda
