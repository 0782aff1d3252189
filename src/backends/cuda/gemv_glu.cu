// The SwiGLU pair of a decode step (or of a few tokens) as one launch: the gate and up products with
// act = silu(gate) * up and act's 8-bit rows in their epilogue, so that neither a SwiGLU nor a quantize
// launch follows (GemvNode pairs that fuse_glu turns into a GluNode, step_fusion.cpp). Two kernels:
// the register kernel (gemv_glu_kernel: the rows streamed like gemv.cu's products) and the staged one
// (gemv_glu_stage_kernel: a block's rows copied to shared memory before the PDL wait), chosen by
// glu_stage_plan. Roofline: the pair's weight bytes (lfm2-1.2b Q4_0: 18.9 MB).
#include "backends/cuda/gemv_device.cuh"

namespace cera::cuda {
namespace {

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
