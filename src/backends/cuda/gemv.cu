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

// The SwiGLU pair's next product's weights into L2 (GemvK::l2_q): this block's share of each stream,
// in pieces of up to 32 KB over the lanes of one warp.
__device__ __forceinline__ void next_product_to_l2(const GemvK& a) {
    if (!a.l2_q) return;
    const int lane = threadIdx.x & 31;
    auto share = [&](const uint8_t* p, int64_t bytes) {
        const int64_t per = (bytes / gridDim.x + 15) / 16 * 16, b0 = int64_t(blockIdx.x) * per;
        const int64_t b1 = min(b0 + per, bytes / 16 * 16);
        for (int64_t o = b0 + int64_t(lane) * 32768; o < b1; o += 32 * 32768)
            prefetch_l2(p + o, uint32_t(min(int64_t(32768), b1 - o)));
    };
    share(a.l2_q, a.l2_qbytes);
    share(a.l2_m, a.l2_mbytes);
}

// SwiGLU pair: segment 0 = gate, 1 = up, the same rows (a multiple of 32). A block of 16 warps owns
// groups of 32 output rows (group x, x + gridDim.x, ...); each warp 2 rows of both matrices (4 weight
// streams, like R = 4), the first group's loads issued before the PDL wait into registers and, with
// `prefetch`, the second group's rows copied into shared memory (cp.async) before it too, so a grid
// of one block per SM requests the whole pair early and computes the first group while the second
// lands. Epilogue: gate and up outputs, act = silu(gate) * up, and act's 8-bit rows for the next
// matmul (one 32-group per row group), so neither a SwiGLU nor a quantize launch follows.
template <GgmlType T, bool PRO>
__global__ void __launch_bounds__(512) gemv_glu_kernel(const GemvK a, int prefetch) {
    constexpr QuantLayout L = quant_layout(T);
    constexpr int R = 2;
    pdl_trigger();
    __shared__ float act_s[32];
    extern __shared__ __align__(16) uint8_t glu_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int yi = blockIdx.y;
    const Seg& g = a.seg[0];
    const Seg& u = a.seg[1];
    // prefetch (1 before the PDL wait, 2 right after it): the block's second row group is copied into
    // shared memory (cp.async, each warp its own 2 + 2 rows) while the first is computed.
    const int64_t qb = a.nb * L.q_bytes, mb = a.nb * L.m_bytes;
    uint8_t* const wsm = glu_smem + int64_t(warp) * 2 * R * (qb + mb);
    // The prologue's row after the prefetch's 16 warps of rows.
    uint8_t* const xs = PRO ? glu_smem + (prefetch ? 16 * 2 * R * (qb + mb) : 0) : nullptr;
    if constexpr (PRO) norm_prologue_pre(a, xs);
    auto next_to_l2 = [&] {
        if (warp == 0) next_product_to_l2(a);
    };
    bool staged = false;
    for (int64_t gb = blockIdx.x; gb * 32 < g.rows; gb += gridDim.x) {
        const int64_t rb = gb * 32;
        const int64_t r0 = rb + warp * R;
        const bool first = gb == blockIdx.x;
        const int64_t nr0 = r0 + int64_t(gridDim.x) * 32;
        const bool pf = prefetch && first && nr0 < g.rows;
        auto issue = [&] {
#pragma unroll
            for (int j = 0; j < 2 * R; ++j) {
                const Seg& sg = j < R ? g : u;
                const int64_t row = sg.row0 + nr0 + j % R;
                for (int64_t o = lane * 16; o < qb; o += 32 * 16) cp_async16v(wsm + j * qb + o, sg.q + row * qb + o);
                for (int64_t o = lane * 16; o < mb; o += 32 * 16)
                    cp_async16v(wsm + 2 * R * qb + j * mb + o, sg.m + row * mb + o);
            }
            cp_async_commit();
        };
        if (pf) issue();
        auto hook = [&] {
            if constexpr (PRO)
                if (first) norm_prologue(a, xs);
        };
        auto pre = [&] {
            if (first && a.l2_q) next_to_l2();
        };
        auto set_smem = [&](const uint8_t** qrow, const uint8_t** mrow) {
#pragma unroll
            for (int j = 0; j < 2 * R; ++j) qrow[j] = wsm + j * qb, mrow[j] = wsm + 2 * R * qb + j * mb;
        };
        auto set_rows = [&](const uint8_t** qrow, const uint8_t** mrow) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int64_t gg = g.row0 + r0 + r, gu = u.row0 + r0 + r;
                qrow[r] = g.q + gg * a.nb * L.q_bytes;
                mrow[r] = g.m + gg * a.nb * L.m_bytes;
                qrow[R + r] = u.q + gu * a.nb * L.q_bytes;
                mrow[R + r] = u.m + gu * a.nb * L.m_bytes;
            }
        };
        float acc[2 * R];
        if (staged) {
            cp_async_wait<0>();
            __syncwarp();
            dot_rows<T, 2 * R, decltype(set_smem), PlainLd>(a, yi, true, true, set_smem, acc, 0, 1, {}, false, {}, xs,
                                                            std::bool_constant<PRO>{});
        } else {
            dot_rows<T, 2 * R, decltype(set_rows), GlobalLd, decltype(hook), decltype(pre)>(
                a, yi, true, false, set_rows, acc, 0, 1, hook, first, pre, xs, std::bool_constant<PRO>{});
        }
        staged = pf;
        // Totals: gate rows in lanes 0-7 and 8-15, up rows in 16-23 and 24-31; lane 8 r gets both of row r.
        static_assert(R == 2);
        const float tot = warp_sum_rows<2 * R>(acc);
        const float tot_up = __shfl_sync(0xffffffffu, tot, (lane + 16) & 31);
        {
            const int r = lane / 8;
            const float sgv = tot, suv = tot_up;
            if (lane % 8 == 0 && lane < 16) {
                const int64_t o = int64_t(yi) * g.ldy + r0 + r;
                const float gv = sgv + (g.bias ? g.bias[r0 + r] : 0.0f);
                const float uv = suv + (u.bias ? u.bias[r0 + r] : 0.0f);
                const float act = gv / (1.0f + __expf(-gv)) * uv;
                g.y[o] = gv;
                u.y[int64_t(yi) * u.ldy + r0 + r] = uv;
                a.act[int64_t(yi) * g.rows + r0 + r] = act;
                act_s[warp * R + r] = act;
            }
        }
        if (!a.act_xq) continue;
        __syncthreads();
        if (warp == 0) warp_quantize_q8(act_s[lane], a.act_xq + int64_t(yi) * q8_row_bytes(g.rows), g.rows, rb / 32);
        __syncthreads();  // act_s is rewritten by the next group
    }
}

// Staged SwiGLU: a block's weight rows are copied into shared memory with bulk copies (a few 16 KB
// pieces issued by one warp) before the PDL wait, so the bytes are requested as soon as the block is
// resident. At 64-80 registers a thread and one or two blocks of 64 or 32 rows per SM, the whole pair
// (18.9 MB for a 2048 x 8192 Q4_0 pair) is requested in one wave, then computed from shared memory,
// and the blocks leave room on their SMs for the launches before and after (glu_stage_plan: every
// type whose pair fits one wave; Q8_0 keeps gemv_glu_kernel). A staged version of the plain products
// measured slower (fewer warps per row after the wait) and was not kept.

// Issues the bulk copies of `n` byte ranges (dst[i] <- src[i], bytes[i] multiples of 16) on `bar`.
// Warp 0 only; the block must __syncthreads() before any thread waits on bar.
template <int N>
__device__ __forceinline__ void stage_rows(uint64_t* bar, uint8_t* const (&dst)[N], const uint8_t* const (&src)[N],
                                           const uint32_t (&bytes)[N]) {
    constexpr uint32_t kPiece = 16 * 1024;
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
        uint32_t total = 0;
#pragma unroll
        for (int i = 0; i < N; ++i) total += bytes[i];
        mbar_expect_tx(bar, total);
    }
    __syncwarp();
    int piece = 0;
#pragma unroll
    for (int i = 0; i < N; ++i)
        for (uint32_t o = 0; o < bytes[i]; o += kPiece, ++piece)
            if (piece % 32 == lane) bulk_copy(dst[i] + o, src[i] + o, min(kPiece, bytes[i] - o), bar);
}

// SwiGLU pair (gemv_glu_kernel's work): a block owns rb = 32 or 64 rows of both matrices; W = 16 or 8
// warps, a warp R = 32 / W gate + R up rows per pass (rb / 32 passes); the same epilogue (act and its
// 8-bit groups, one 32-row group per pass). Shared memory: gate q, up q, gate m, up m (rb rows each).
// kWide: Q5_K in 32-byte items (WideTraits). At 16 warps (64 registers) two blocks take a
// whole SM's registers; at 8 (at most 80 registers) two blocks leave room for a block of the plain
// GEMV beside them (the out-projection before, the down product after), and each x item read from
// shared memory serves 4 rows instead of 2 (8 warps pair with the GEMV's carveout, gemv_carveout).
// PRO: 0 no prologue, 1 the prologue, 2 the prologue with x in registers (k <= 2048). gridDim.y blocks
// share a row group, each taking every gridDim.y-th token of the batch.
template <GgmlType T, int PRO, bool kWide, int W>
__global__ void __launch_bounds__(W * 32, W == 16 ? 2 : 3) gemv_glu_stage_kernel(const GemvK a, int rb, int n_y) {
    constexpr int KR = PRO == 2 ? 512 / (W * 32) : 0;
    using Tr = WideTraits<T, kWide>;
    constexpr QuantLayout L = quant_layout(T);
    constexpr int R = 32 / W;
    constexpr int LW = 16 / R;  // lanes holding one row's total
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t bar;
    __shared__ float act_s[64];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = int64_t(blockIdx.x) * rb;
    const Seg& g = a.seg[0];
    const Seg& u = a.seg[1];
    const uint32_t qrow = uint32_t(a.nb * L.q_bytes), mrow = uint32_t(a.nb * L.m_bytes);
    uint8_t* const gq = smem;
    uint8_t* const uq = gq + rb * qrow;
    uint8_t* const gm = uq + rb * qrow;
    uint8_t* const um = gm + rb * mrow;
    if (threadIdx.x < 32)
        stage_rows<4>(&bar, {gq, uq, gm, um},
                      {g.q + (g.row0 + r0) * qrow, u.q + (u.row0 + r0) * qrow, g.m + (g.row0 + r0) * mrow,
                       u.m + (u.row0 + r0) * mrow},
                      {rb * qrow, rb * qrow, rb * mrow, rb * mrow});
    // The prologue's row after the staged rows (one token).
    uint8_t* const xs = PRO ? um + rb * mrow : nullptr;
    if constexpr (PRO) norm_prologue_pre(a, xs, PRO == 2);
    __syncthreads();
    pdl_wait();
    if constexpr (PRO == 1) norm_prologue(a, xs);
    if constexpr (PRO == 2) norm_prologue_regs<KR>(a, xs);
    trace_mark(0);
    mbar_wait(&bar, 0);
    trace_mark(1);
    const int n_items = int(a.nb) * Tr::kItems;
    for (int t = int(blockIdx.y); t < n_y; t += int(gridDim.y)) {
        const uint8_t* xrow = PRO ? xs : a.xq + int64_t(t / a.x_div) * a.ldxq;
        const int8_t* xq = reinterpret_cast<const int8_t*>(xrow);
        const float* xd = reinterpret_cast<const float*>(xrow + a.k);
        for (int pass = 0; pass < rb / 32; ++pass) {
            const int rl = pass * 32 + warp * R;
            float acc[2 * R] = {};
            plain_dot_rows<T, Tr, 2 * R, PRO != 0>(xq, xd, n_items, [&](int r, const uint8_t*& q, const uint8_t*& m) {
                const int row = rl + (r % R);
                q = (r < R ? gq : uq) + row * qrow, m = (r < R ? gm : um) + row * mrow;
            }, acc);
            // Totals: gate rows in lanes 0-15, up rows in 16-31, LW lanes a row (R = 2: as gemv_glu_kernel).
            const float tot = warp_sum_rows<2 * R>(acc);
            const float tot_up = __shfl_sync(0xffffffffu, tot, (lane + 16) & 31);
            if (lane % LW == 0 && lane < 16) {
                const int64_t row = r0 + rl + lane / LW;
                const int64_t o = int64_t(t) * g.ldy + row;
                const float gv = tot + (g.bias ? g.bias[row] : 0.0f);
                const float uv = tot_up + (u.bias ? u.bias[row] : 0.0f);
                const float act = gv / (1.0f + __expf(-gv)) * uv;
                g.y[o] = gv;
                u.y[int64_t(t) * u.ldy + row] = uv;
                a.act[int64_t(t) * g.rows + row] = act;
                act_s[rl + lane / LW] = act;
            }
        }
        if (!a.act_xq) continue;
        __syncthreads();
        if (warp < rb / 32)
            warp_quantize_q8(act_s[warp * 32 + lane], a.act_xq + int64_t(t) * q8_row_bytes(g.rows), g.rows,
                             r0 / 32 + warp);
        __syncthreads();  // act_s is rewritten by the next token
    }
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

// The most shared memory a SwiGLU block stages its rows in (the staged kernel, the prefetch).
constexpr int64_t kGluStageMax = 160 * 1024;
// The largest product whose weights a SwiGLU launch prefetches into L2 for the launch after it.
constexpr int64_t kL2Next = 12 << 20;

// Whether a staged pair keeps its prologue's x in registers (norm_prologue_regs; k <= 2048, one or two
// float4s a thread at 16 or 8 warps) rather than in shared memory (norm_prologue), which leaves that
// memory to the staged rows. GemvArgs::pro_xreg = 0: never.
bool glu_pro_xreg(const GemvArgs& g) { return g.pro_xreg != 0 && g.pro_x && g.w.k <= 2048; }

// Rows per block and dynamic shared memory of a staged launch (rb = 0: the register kernels serve it).
struct StagePlan {
    int rb = 0;
    size_t smem = 0;
    int split = 1;  // blocks a row group: each takes every split-th token of the batch
};

template <GgmlType T, int PRO, bool kWide, int W>
void launch_glu_stage_w(dim3 blocks, size_t smem, cudaStream_t s, const GemvK& p, int rb, int n_y) {
    allow_dynamic_smem<gemv_glu_stage_kernel<T, PRO, kWide, W>>(smem);
    launch(gemv_glu_stage_kernel<T, PRO, kWide, W>, blocks, W * 32, smem, s, p, rb, n_y);
}

// Warps a staged block: 8 for the light types, 16 for the heavy_scales ones, whose heavier scale
// decoding wants more warps in flight, and Q8_0 (whose 8-warp kernel spills; its pairs are
// staged only for small rows).
template <GgmlType T, int PRO>
void launch_glu_stage(bool wide, dim3 blocks, size_t smem, cudaStream_t s, const GemvK& p, int rb, int n_y) {
    const bool eight = !heavy_scales(T) && T != GgmlType::kQ8_0;
    if constexpr (T == GgmlType::kQ5_K) {
        if (wide) {
            if (eight) launch_glu_stage_w<T, PRO, true, 8>(blocks, smem, s, p, rb, n_y);
            else launch_glu_stage_w<T, PRO, true, 16>(blocks, smem, s, p, rb, n_y);
            return;
        }
    }
    if (eight) launch_glu_stage_w<T, PRO, false, 8>(blocks, smem, s, p, rb, n_y);
    else launch_glu_stage_w<T, PRO, false, 16>(blocks, smem, s, p, rb, n_y);
}

// SwiGLU pairs: blocks of 32 rows of both matrices (Q5_K / Q6_K: 64), else of the other size, at
// most 160 KB a block, and only where the whole grid is resident at once (a second wave is slower
// than the register kernel). Batches of up to 8 tokens. Every block type that fits: at 64 registers
// a thread a staged block leaves room on its SM for blocks of the launches before and after it,
// where the register kernel's 512 threads at 124 take the whole SM. Q8_0 rows do not fit one wave
// (139 KB a 32-row block) and keep the register kernel. GemvArgs::glu_stage = 0: never; 1: K-quants
// only.
StagePlan glu_stage_plan(const GemvArgs& g, const GemvArgs& u) {
    const int mode = g.glu_stage >= 0 ? g.glu_stage : 2;
    const QuantLayout L = quant_layout(g.w.type);
    if (mode == 0 || L.block_elems == 0 || g.n_y < 1 || g.n_y > 8) return {};
    if (mode == 1 && L.block_elems != 256) return {};
    const int64_t nb = g.w.k / L.block_elems, qrow = nb * L.q_bytes, mrow = nb * L.m_bytes;
    if (!stage_aligned(g, qrow, mrow) || !stage_aligned(u, qrow, mrow)) return {};
    const int64_t per_row = 2 * (qrow + mrow), per_sm = device_attr<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
    const int64_t pro = g.pro_x ? int64_t(prologue_bytes(g.w.k, glu_pro_xreg(g))) : 0;
    auto waves_ok = [&](int64_t rb, int64_t split) {
        const int64_t bytes = rb * per_row, fit = per_sm / (bytes + pro + 2048);  // + static and reserved memory
        return g.rows % rb == 0 && bytes <= kGluStageMax && fit >= 1 && g.rows / rb * split <= fit * sm_count();
    };
    const bool heavy = heavy_scales(g.w.type);
    for (int64_t rb : {int64_t(heavy ? 64 : 32), int64_t(heavy ? 32 : 64)})
        if (waves_ok(rb, 1)) {
            // A block walks its tokens one after another (a chain of dot products, sums and barriers a
            // token); where the grid still fits one wave with a block for each token, the tokens run side
            // by side, each block staging the same rows (L2 hits after the first).
            const int split = waves_ok(rb, g.n_y) ? int(g.n_y) : 1;
            return {int(rb), size_t(rb * per_row), split};
        }
    return {};
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

bool gemv_glu_staged(const GemvArgs& gate, const GemvArgs& up) { return glu_stage_plan(gate, up).rb > 0; }

bool gemv_glu_supported(GgmlType type, int64_t rows) { return quant_layout(type).block_elems > 0 && rows % 32 == 0; }

void gemv_glu(const GemvArgs& gate, const GemvArgs& up, float* act, void* act_xq, Stream stream,
              const GemvArgs* next) {
    CERA_CHECK(gemv_glu_supported(gate.w.type, gate.rows) && up.w.type == gate.w.type && up.w.k == gate.w.k &&
               up.rows == gate.rows && up.n_y == gate.n_y && up.xq == gate.xq && !gate.ids && !up.ids &&
               !gate.accumulate && !up.accumulate && gate.ldy == gate.rows);
    if (gate.rows == 0 || gate.n_y == 0) return;
    bool vec = true;
    GemvK p = common_params(gate, vec);
    p.seg[0] = make_seg(gate);
    p.seg[1] = make_seg(up);
    p.n_seg = 2;
    set_prologue(p, gate);
    p.act = act;
    p.act_xq = static_cast<uint8_t*>(act_xq);
    cudaStream_t s = as_stream(stream);
    if (const StagePlan sp = glu_stage_plan(gate, up); sp.rb > 0) {
        const dim3 blocks(unsigned(gate.rows / sp.rb), unsigned(sp.split));
        // Q5_K in 32-byte items (one scale decode per 32 bytes). The register kernels keep 16-byte
        // items: wide ones take 126 registers at R = 2.
        const bool wide = gate.glu_wide != 0;
        const bool xreg = glu_pro_xreg(gate);
        const size_t smem = sp.smem + (p.px ? prologue_bytes(p.k, xreg) : 0);
        switch (gate.w.type) {
#define CERA_Q(T)                                                                                   \
    case GgmlType::T:                                                                               \
        if (xreg) launch_glu_stage<GgmlType::T, 2>(wide, blocks, smem, s, p, sp.rb, int(gate.n_y));     \
        else if (p.px) launch_glu_stage<GgmlType::T, 1>(wide, blocks, smem, s, p, sp.rb, int(gate.n_y)); \
        else launch_glu_stage<GgmlType::T, 0>(wide, blocks, smem, s, p, sp.rb, int(gate.n_y));          \
        break;
            CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
            default: CERA_CHECK(false, "gemv_glu: unsupported weight type %s", type_name(gate.w.type));
        }
        return;
    }
    // Pairs the staged kernel does not take (Q8_0; every type with GemvArgs::glu_stage = 0). For the
    // 32-element block types one wave: blocks of 32 rows walk the row groups (one block per SM at
    // ~120 registers a thread), instead of a second wave of blocks that start only as the first ones
    // leave, and each block's second group is copied to shared memory before the PDL wait
    // (prefetch). The K-quants keep two waves, where their heavier rows hide the late start.
    const GgmlType t = gate.w.type;
    const bool one_wave = quant_layout(t).block_elems == 32;
    const int64_t groups = gate.rows / 32;
    int64_t n_rb = groups;
    if (one_wave) n_rb = ceil_div(groups, ceil_div(groups, int64_t(sm_count())));
    // The second row group's rows in shared memory (gemv_glu_kernel's prefetch), 16-byte aligned rows.
    const QuantLayout L = quant_layout(t);
    const int64_t nb = gate.w.k / L.block_elems, qb = nb * L.q_bytes, mb = nb * L.m_bytes;
    const size_t pf_bytes = size_t(16 * 4 * (qb + mb));  // 16 warps, 2 + 2 rows each
    const int prefetch = n_rb < groups && qb % 16 == 0 && mb % 16 == 0 && stage_aligned(gate, qb, mb) &&
                                 stage_aligned(up, qb, mb) && int64_t(pf_bytes) <= kGluStageMax
                             ? 1
                             : 0;
    // The down product's weights into L2 while the pair runs: its blocks cannot be resident before this
    // launch's leave, so its own loads start late. Issued before the PDL wait. Only for products of up
    // to kL2Next bytes (a larger one evicts the pair's own rows) and not beside the staged kernel, whose
    // rows already fill the memory pipes.
    if (next && one_wave && !next->ids && quant_layout(next->w.type).block_elems > 0) {
        const QuantLayout NL = quant_layout(next->w.type);
        const int64_t nnb = next->w.k / NL.block_elems, nq = nnb * NL.q_bytes, nm = nnb * NL.m_bytes;
        const int64_t rows = next->rows;
        const auto* q = static_cast<const uint8_t*>(next->w.image) + next->w.row0 * nq;
        const auto* m = scale_stream(next->w) + next->w.row0 * nm;
        if (reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(m) % 16 == 0 &&
            rows * (nq + nm) <= kL2Next) {
            p.l2_q = q, p.l2_m = m, p.l2_qbytes = rows * nq, p.l2_mbytes = rows * nm;
        }
    }
    const dim3 grid(unsigned(n_rb), unsigned(gate.n_y));
    const size_t smem = (prefetch ? pf_bytes : 0) + prologue_smem(p);
    switch (gate.w.type) {
#define CERA_Q(T)                                                                                 \
    case GgmlType::T:                                                                             \
        if (p.px) {                                                                               \
            allow_dynamic_smem<gemv_glu_kernel<GgmlType::T, true>>(smem);                         \
            launch(gemv_glu_kernel<GgmlType::T, true>, grid, 512, smem, s, p, prefetch);          \
        } else {                                                                                  \
            allow_dynamic_smem<gemv_glu_kernel<GgmlType::T, false>>(smem);                        \
            launch(gemv_glu_kernel<GgmlType::T, false>, grid, 512, smem, s, p, prefetch);         \
        }                                                                                         \
        break;
        CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
        default: CERA_CHECK(false, "gemv_glu: unsupported weight type %s", type_name(gate.w.type));
    }
}

}  // namespace cera::cuda
