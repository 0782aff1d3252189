// Decode products fused with the per-row op that consumes their output, so that op's launch and its
// round trip through L2 leave the step's chain of kernels. Both ops only need rows a block can own:
//
//   gemv_qkv_rope_store: the q, k and v products with the per-head RMSNorm + RoPE and the KV-cache
//     store (norm_rope.cu's qkv_rope_store). A block owns one head vector of one token: head_dim
//     rows of one of the three matrices, 16 warps of 4 rows (Q5_K / Q6_K: 2, for registers) in passes.
//     Where each warp's rows hold whole rotation pairs (gemv_qkv_rope_rows_kernel; every type but
//     Q5_K / Q6_K, head_dim 64 or, without a per-head norm, a multiple of 64), the warps normalize,
//     rotate and store their own rows. Otherwise (gemv_qkv_rope_kernel) the row totals go to shared
//     memory and warp 0 normalizes and rotates the head there (its rotations looked up before the
//     PDL wait), writes it out and appends k / v to the cache.
//   gemv_conv: the LFM2 in_proj and short conv of one token (elementwise.cu's short_conv). A block
//     owns 16 channels c, warp w the rows c, n + c and 2n + c (B, C and x of its channel); the conv
//     taps and the rolling state are read before the wait (the state is written only by this op, in
//     earlier steps). The epilogue computes C * conv(B * x), writes it, rolls the state, and the two
//     blocks of a cluster share their maxima (distributed shared memory) to write the output's 8-bit
//     32-channel group for the out-projection. (32 channels a block would need 110 KB of weights in
//     flight per block: more registers than 1,024 threads have.)
//
// The weight loads are issued before the PDL wait as in gemv.cu. The grids are small (48 blocks for
// 32 + 2 x 8 heads of 64, 128 for 2048 channels), so each SM streams more bytes (74 KB of Q4_0 rows
// for a head against ~18 KB in the plain launch): the trade is one launch of ~2-3 us on the critical
// path against a longer stream per SM. Measured (bench/NOTES.md): q/k/v faster for every type tried;
// in_proj + conv faster for Q4_K only, so the backend uses it for the K-quants. Roofline: the
// products' bytes (lfm2-1.2b Q4_0: q/k/v 3.5 MB, in_proj 7.1 MB).
#include <cooperative_groups.h>

#include "backends/cuda/gemv_device.cuh"
#include "backends/cuda/kv_codec.cuh"
#include "backends/cuda/rope_device.cuh"

namespace cera::cuda {
namespace {

// Rows a warp in the q/k/v launch: 4, but 2 for the heavy_scales types, whose 4-row kernels spill.
// Q4_K takes 4 rows (128 registers): its 512-thread blocks then no longer fit beside the down
// product's, so they are not resident, waiting, while it runs.
constexpr int rows_qkv(GgmlType t) { return heavy_scales(t) ? 2 : 4; }

// Rows r0 .. r0 + n - 1 of segment sg (n a multiple of 16 R) with their biases into out[0 .. n): 16
// warps of R rows a pass, the RMSNorm prologue (PRO) made after the PDL wait of the first pass.
template <GgmlType T, bool PRO, int R>
__device__ __forceinline__ void seg_rows(const GemvK& a, const Seg& sg, int yi, int64_t r0, int n, uint8_t* xs,
                                         float* out) {
    constexpr QuantLayout L = quant_layout(T);
    constexpr int kPass = 16 * R;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int pass = 0; pass < n / kPass; ++pass) {
        const int64_t rp = r0 + pass * kPass + warp * R;
        auto set_rows = [&](const uint8_t** qrow, const uint8_t** mrow) {
#pragma unroll
            for (int j = 0; j < R; ++j) {
                const int64_t gr = sg.row0 + rp + j;
                qrow[j] = sg.q + gr * a.nb * L.q_bytes;
                mrow[j] = sg.m + gr * a.nb * L.m_bytes;
            }
        };
        auto hook = [&] {
            if constexpr (PRO)
                if (pass == 0) norm_prologue(a, xs);
        };
        float acc[R];
        dot_rows<T, R>(a, yi, true, false, set_rows, acc, 0, 1, hook, true, NoHook{}, xs, std::bool_constant<PRO>{});
        const float tot = warp_sum_rows<R>(acc);
        if (lane % (32 / R) == 0) {
            const int j = lane / (32 / R);
            out[pass * kPass + warp * R + j] = tot + (sg.bias ? sg.bias[rp + j] : 0.0f);
        }
    }
}

// The v weights in another type than q and k (llama-quantize's Q4_K_M / Q5_K_M / Q4_K_S mixtures give
// some layers' attn_v more bits): the v blocks of the launch take this path, decided per block. Rows
// off .. off + n - 1 of v head `head` (no RoPE, no norm), 16 warps of rows_qkv(TV) rows a pass, then
// the block stores them to y and the cache.
template <GgmlType TV, bool PRO>
__device__ __forceinline__ void qkv_v_rows(const GemvK& a, const QkvRopeArgs& r, int yi, int head, int off, int n,
                                           uint8_t* xs) {
    __shared__ float vs[256];
    const int hd = r.head_dim;
    const Seg& sg = a.seg[2];
    const int32_t p = r.pos[yi];  // written by the host before the step
    if constexpr (PRO) norm_prologue_pre(a, xs);
    seg_rows<TV, PRO, rows_qkv(TV)>(a, sg, yi, int64_t(head) * hd + off, n, xs, vs);
    __syncthreads();
    if (r.rotate_v) {  // a whole head here (the rows kernel takes no rotation)
        if (threadIdx.x < 32) rotate_head_warp(vs, hd, false);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) sg.y[int64_t(yi) * sg.ldy + int64_t(head) * hd + off + i] = vs[i];
    if (p < 0 || p >= r.n_ctx) return;
    unsigned char* cache = static_cast<unsigned char*>(r.v_cache) + p * kv_row_bytes(r.v_codec, int64_t(r.n_head_kv) * hd);
    if (kv_blocked(r.v_codec)) {  // n is a multiple of 32 here: warp w quantizes the w-th block of 32
        const int w = threadIdx.x >> 5;
        if (32 * w < n)
            kv_put_block(r.v_codec, cache + kv_row_bytes(r.v_codec, int64_t(head) * hd + off + 32 * w),
                         vs[32 * w + (threadIdx.x & 31)]);
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) kv_put1(r.v_codec, cache, int64_t(head) * hd + off + i, vs[i]);
}

// grid (n_head + 2 n_head_kv, n_tokens): block hh is q head hh, then the k heads, then the v heads.
// R rows a warp (rows_qkv); v weights of type TV (qkv_v_rows where it is not T).
template <GgmlType T, GgmlType TV, bool PRO, int R>
__global__ void __launch_bounds__(512) gemv_qkv_rope_kernel(const GemvK a, const QkvRopeArgs r) {
    pdl_trigger();
    __shared__ float ys[256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hh = blockIdx.x, yi = blockIdx.y, hd = r.head_dim;
    const int s = hh < r.n_head ? 0 : hh < r.n_head + r.n_head_kv ? 1 : 2;
    const int head = s == 0 ? hh : s == 1 ? hh - r.n_head : hh - r.n_head - r.n_head_kv;
    extern __shared__ __align__(16) uint8_t qkv_xs[];
    if constexpr (TV != T) {
        if (s == 2) return qkv_v_rows<TV, PRO>(a, r, yi, head, 0, hd, PRO ? qkv_xs : nullptr);
    }
    const Seg& sg = a.seg[s];
    // Positions are written by the host before the step: warp 0's rotation is looked up before the wait.
    const int32_t p = r.pos[yi];
    const RopeArgs& rope = s == 0 ? r.q_rope : r.k_rope;
    __shared__ RopeCS cs[32];  // warp 0's rotations (in shared memory, not in registers across the products)
    if (warp == 0 && s < 2) cs[lane] = rope_angles(p, rope);
    uint8_t* const xs = PRO ? qkv_xs : nullptr;  // the RMSNorm prologue's row (one token)
    if constexpr (PRO) norm_prologue_pre(a, xs);
    seg_rows<T, PRO, R>(a, sg, yi, int64_t(head) * hd, hd, xs, ys);
    __syncthreads();
    if (warp != 0) return;
    if (s < 2)
        head_norm_rope(ys, hd, s == 0 ? r.q_norm : r.k_norm, s == 0 ? r.q_eps : r.k_eps, p, rope,
                       rope_precomputable(rope) ? &cs[lane] : nullptr);
    if (s == 0 ? r.rotate_q : s == 1 ? r.rotate_k : r.rotate_v) rotate_head_warp(ys, hd, false);
    __syncwarp();  // the lanes read each other's rotated values
    float* y = sg.y + int64_t(yi) * sg.ldy + int64_t(head) * hd;
    for (int i = lane; i < hd; i += 32) y[i] = ys[i];
    if (s == 0 || p < 0 || p >= r.n_ctx) return;
    const KvCodec cc = s == 1 ? r.codec : r.v_codec;
    unsigned char* cache = static_cast<unsigned char*>(s == 1 ? r.k_cache : r.v_cache) +
                           p * kv_row_bytes(cc, int64_t(r.n_head_kv) * hd) + kv_row_bytes(cc, int64_t(head) * hd);
    kv_put_head(cc, ys, cache, hd);
}

// The q/k/v launch with its epilogue in the warps: blocks of 16 warps x 4 rows (64 rows: a head of 64,
// half a head of 128), and every rotation pair in one warp. Warp wh of a head takes the rows
// 4 wh .. 4 wh + 3, but for neox pairs (i, i + n_rot / 2) below n_rot the rows i, i + 1, i + n_rot / 2,
// i + n_rot / 2 + 1 (i = 2 wh), so the partner of row j is row j ^ 1 (adjacent pairs) or j ^ 2 (neox):
// one shuffle after the warp sum. A per-head RMSNorm needs the whole head in the block (head_dim 64):
// the warps' sums of squares meet in shared memory behind one barrier. Each lane looks its row's
// rotation and norm weight up before the PDL wait. gemv_qkv_rope_kernel instead writes the row totals
// to shared memory and normalizes, rotates and stores the head with warp 0 alone, a longer chain after
// the dots. The row sums are the same (same dot order and lanes). Blocks stay at 16 warps: each block
// makes the RMSNorm prologue, and fewer threads make it slower.
constexpr int kRowsWarps = 16;
template <GgmlType T, GgmlType TV, bool PRO>
__global__ void __launch_bounds__(kRowsWarps * 32) gemv_qkv_rope_rows_kernel(const GemvK a, const QkvRopeArgs r) {
    constexpr QuantLayout L = quant_layout(T);
    constexpr int R = 4, W = kRowsWarps;
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = lane >> 3;  // this lane's row j
    const int hd = r.head_dim, per_head = hd / (4 * W), yi = blockIdx.y;
    const int hh = blockIdx.x / per_head, wh = (blockIdx.x % per_head) * W + warp;
    const int s = hh < r.n_head ? 0 : hh < r.n_head + r.n_head_kv ? 1 : 2;
    const int head = s == 0 ? hh : s == 1 ? hh - r.n_head : hh - r.n_head - r.n_head_kv;
    extern __shared__ __align__(16) uint8_t qkv_rows_xs[];
    if constexpr (TV != T) {
        if (s == 2)
            return qkv_v_rows<TV, PRO>(a, r, yi, head, (blockIdx.x % per_head) * 4 * W, 4 * W,
                                          PRO ? qkv_rows_xs : nullptr);
    }
    const Seg& sg = a.seg[s];
    const RopeArgs& rope = s == 0 ? r.q_rope : r.k_rope;
    const int n_rot = s < 2 && rope.mode != 0 ? rope.n_rot : 0, half = n_rot / 2;
    const bool neox = rope.mode == 2 && 4 * wh < n_rot;
    // Row j of this warp, its rotation pair and whether it is the pair's first element.
    const int row = neox ? 2 * wh + (j & 1) + (j >> 1) * half : 4 * wh + j;
    const int pair = neox ? 2 * wh + (j & 1) : row / 2;
    const bool first = neox ? j < 2 : (j & 1) == 0;
    const bool rot = pair < half && (neox || row < n_rot);
    const int32_t p = r.pos[yi];  // written by the host before the step
    float c = 1.0f, sn = 0.0f;
    if (rot) {
        if (rope.table && p >= 0 && p < rope.table_rows) {
            const float2 v = reinterpret_cast<const float2*>(rope.table)[int64_t(p) * half + pair];
            c = v.x, sn = v.y;
        } else {
            rope_pair_cs(pair, double(p) * rope.freq_scale, n_rot, rope, c, sn);
        }
    }
    const float* const nw = s == 0 ? r.q_norm : s == 1 ? r.k_norm : nullptr;  // the same in the whole block
    const float wn = nw ? nw[row] : 1.0f;
    uint8_t* const xs = PRO ? qkv_rows_xs : nullptr;  // the RMSNorm prologue's row (one token)
    if constexpr (PRO) norm_prologue_pre(a, xs);
    const int64_t hr0 = int64_t(head) * hd;
    auto set_rows = [&](const uint8_t** qrow, const uint8_t** mrow) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int ri = neox ? 2 * wh + (i & 1) + (i >> 1) * half : 4 * wh + i;
            const int64_t gr = sg.row0 + hr0 + ri;
            qrow[i] = sg.q + gr * a.nb * L.q_bytes;
            mrow[i] = sg.m + gr * a.nb * L.m_bytes;
        }
    };
    auto hook = [&] {
        if constexpr (PRO) norm_prologue(a, xs);
        trace_mark(0);
    };
    float acc[R];
    dot_rows<T, R>(a, yi, true, false, set_rows, acc, 0, 1, hook, true, NoHook{}, xs, std::bool_constant<PRO>{});
    trace_mark(1);
    float v = warp_sum_rows<R>(acc) + (sg.bias ? sg.bias[hr0 + row] : 0.0f);
    if (nw) {  // the head's RMSNorm: lanes 8 j .. 8 j + 7 hold row j
        __shared__ float ss_s[W];
        float q = v * v;
        q += __shfl_xor_sync(0xffffffffu, q, 8);
        q += __shfl_xor_sync(0xffffffffu, q, 16);
        if (lane == 0) ss_s[warp] = q;
        __syncthreads();
        float ss = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) ss += ss_s[w];
        v = v * rsqrtf(ss / float(hd) + (s == 0 ? r.q_eps : r.k_eps)) * wn;
    }
    const float o = __shfl_xor_sync(0xffffffffu, v, neox ? 16 : 8);  // the pair's other element
    const float out = !rot ? v : first ? v * c - o * sn : o * sn + v * c;
    if ((lane & 7) == 0) sg.y[int64_t(yi) * sg.ldy + hr0 + row] = out;
    if (s == 0 || p < 0 || p >= r.n_ctx) return;  // the same in the whole block
    const KvCodec cc = s == 1 ? r.codec : r.v_codec;
    unsigned char* cache = static_cast<unsigned char*>(s == 1 ? r.k_cache : r.v_cache) +
                           p * kv_row_bytes(cc, int64_t(r.n_head_kv) * hd);
    if (!kv_blocked(cc)) {
        if ((lane & 7) == 0) kv_put1(cc, cache, hr0 + row, out);
        return;
    }
    // A quantized cache: the block's 64 rows are two whole blocks of 32 (qkv_rows_fit), rows 64 bb ..
    // 64 bb + 63, or for neox pairs rows 32 bb .. 32 bb + 31 and their partners n_rot / 2 further on.
    // They meet in shared memory, and warps 0 and 1 quantize one block each.
    __shared__ float hs[256];
    if ((lane & 7) == 0) hs[row] = out;
    __syncthreads();
    if (warp >= 2) return;
    const int bb = blockIdx.x % per_head;
    const int qb = rope.mode == 2 && 64 * bb < n_rot ? bb + warp * (half / 32) : 2 * bb + warp;
    kv_put_block(cc, cache + kv_row_bytes(cc, hr0 + 32 * qb), hs[32 * qb + lane]);
}

// One token; grid n / 16 in clusters of two blocks (a 32-channel group of the 8-bit output).
template <GgmlType T, bool PRO>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512) gemv_conv_kernel(
    const GemvK a, const float* __restrict__ conv_w, int taps, float* state, float* state_prev, float* out,
    uint8_t* out_xq) {
    constexpr QuantLayout L = quant_layout(T);
    pdl_trigger();
    __shared__ float os[16], wc_s[16][kMaxConv], win_s[16][kMaxConv];
    __shared__ float amax_s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const Seg& sg = a.seg[0];
    const int64_t n = sg.rows / 3, c = int64_t(blockIdx.x) * 16 + warp;
    // The taps and the state (kept in shared memory, not in registers across the products).
    if (lane < taps) wc_s[warp][lane] = conv_w[c * taps + lane];
    if (lane < taps - 1) {
        const float v = state[lane * n + c];
        win_s[warp][lane] = v;
        if (state_prev) state_prev[lane * n + c] = v;
    }
    __syncwarp();  // lane 0 reads them in the epilogue
    auto set_rows = [&](const uint8_t** qrow, const uint8_t** mrow) {
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            const int64_t gr = sg.row0 + j * n + c;
            qrow[j] = sg.q + gr * a.nb * L.q_bytes;
            mrow[j] = sg.m + gr * a.nb * L.m_bytes;
        }
    };
    extern __shared__ __align__(16) uint8_t conv_xs[];
    uint8_t* const xs = PRO ? conv_xs : nullptr;  // the RMSNorm prologue's row
    if constexpr (PRO) norm_prologue_pre(a, xs);
    auto hook = [&] {
        if constexpr (PRO) norm_prologue(a, xs);
    };
    float a3[3];
    dot_rows<T, 3>(a, 0, true, false, set_rows, a3, 0, 1, hook, true, NoHook{}, xs, std::bool_constant<PRO>{});
    // Row j's total ends in lanes 8 j .. 8 j + 7.
    const float acc[4] = {a3[0], a3[1], a3[2], 0.0f};
    const float tot = warp_sum_rows<4>(acc);
    const float b = __shfl_sync(0xffffffffu, tot, 0), g = __shfl_sync(0xffffffffu, tot, 8),
                xv = __shfl_sync(0xffffffffu, tot, 16);
    if (lane == 0) {
        const float B = b + (sg.bias ? sg.bias[c] : 0.0f), Cg = g + (sg.bias ? sg.bias[n + c] : 0.0f),
                    X = xv + (sg.bias ? sg.bias[2 * n + c] : 0.0f);
        sg.y[c] = B, sg.y[n + c] = Cg, sg.y[2 * n + c] = X;
        const float bx = B * X;
        float s = 0.0f;
        for (int j = 0; j < taps - 1; ++j) s = fmaf(wc_s[warp][j], win_s[warp][j], s);
        s = fmaf(wc_s[warp][taps - 1], bx, s);
        const float o = Cg * s;
        out[c] = o;
        os[warp] = o;
        for (int j = 0; j < taps - 1; ++j) state[j * n + c] = j < taps - 2 ? win_s[warp][j + 1] : bx;
    }
    if (!out_xq) return;  // the same for both blocks of the cluster
    // The 32-channel group's scale from both blocks' maxima (distributed shared memory), as
    // warp_quantize_q8 computes it over the whole group.
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __syncthreads();
    const float v = lane < 16 ? os[lane] : 0.0f;
    if (warp == 0) {
        const float m = warp_max(fabsf(v));
        if (lane == 0) amax_s = m;
    }
    cl.sync();
    const unsigned rank = cl.block_rank();
    if (warp == 0) {
        const float other = *cl.map_shared_rank(&amax_s, rank ^ 1u);
        const float d = fmaxf(amax_s, other) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int64_t grp = blockIdx.x / 2;
        if (lane < 16) out_xq[32 * grp + 16 * rank + lane] = uint8_t(int8_t(__float2int_rn(v * id)));
        if (lane == 0 && rank == 0) reinterpret_cast<float*>(out_xq + n)[grp] = d;
    }
    cl.sync();  // the partner has read amax_s before this block leaves
}

// One q/k/v launch. Q5_K / Q6_K (heavy_scales) prefer the most L1, which their scale loads go
// through; the other types keep the driver's choice.
template <GgmlType T, GgmlType TV, bool PRO>
void launch_qkv(dim3 grid, size_t smem, cudaStream_t s, const GemvK& p, const QkvRopeArgs& r) {
    constexpr int R = rows_qkv(T);
    if (heavy_scales(T)) prefer_carveout<gemv_qkv_rope_kernel<T, TV, PRO, R>>(0);
    launch(gemv_qkv_rope_kernel<T, TV, PRO, R>, grid, 512, smem, s, p, r);
}

// Whether the q/k/v launch can take gemv_qkv_rope_rows_kernel: 4 rows a warp (not Q5_K / Q6_K),
// head_dim a multiple of 64 (64 with a per-head norm), adjacent pairs over an even n_rot or neox pairs
// over a multiple of 4. A quantized cache's blocks of 32 must each lie in one block of the launch: neox
// k pairs then over a multiple of 64. QkvRopeArgs::rows_kernel = 0 keeps gemv_qkv_rope_kernel.
bool qkv_rows_fit(GgmlType t, const QkvRopeArgs& r) {
    if (r.rotate_q || r.rotate_k || r.rotate_v) return false;  // a rotation mixes the whole head
    if (kv_blocked(r.codec) && r.k_rope.mode == 2 && r.k_rope.n_rot % 64 != 0) return false;
    if (r.rows_kernel == 0 || rows_qkv(t) != 4 || r.head_dim % (4 * kRowsWarps) != 0 ||
        ((r.q_norm || r.k_norm) && r.head_dim != 4 * kRowsWarps))
        return false;
    for (const RopeArgs* rr : {&r.q_rope, &r.k_rope})
        if (rr->mode != 0 && (rr->n_rot > r.head_dim || rr->n_rot % (rr->mode == 2 ? 4 : 2) != 0)) return false;
    return true;
}

template <GgmlType T, GgmlType TV, bool PRO>
void launch_qkv_rows(dim3 grid, size_t smem, cudaStream_t s, const GemvK& p, const QkvRopeArgs& r) {
    grid.x *= unsigned(r.head_dim / (4 * kRowsWarps));
    launch(gemv_qkv_rope_rows_kernel<T, TV, PRO>, grid, kRowsWarps * 32, smem, s, p, r);
}

// The q/k/v launch of q/k weights T and v weights TV: the warps' epilogue where it fits (rows:
// qkv_rows_fit), else warp 0's (gemv_qkv_rope_kernel; the only one for Q5_K / Q6_K).
template <GgmlType T, GgmlType TV, bool PRO>
void launch_qkv_type(bool rows, dim3 grid, size_t smem, cudaStream_t s, const GemvK& p, const QkvRopeArgs& r) {
    if constexpr (rows_qkv(T) == 4) {
        if (rows) {
            launch_qkv_rows<T, TV, PRO>(grid, smem, s, p, r);
            return;
        }
    }
    launch_qkv<T, TV, PRO>(grid, smem, s, p, r);
}
template <GgmlType T, GgmlType TV>
void launch_qkv_types(const QkvRopeArgs& r, bool rows, dim3 grid, size_t smem, cudaStream_t s, const GemvK& p) {
    if (smem) launch_qkv_type<T, TV, true>(rows, grid, smem, s, p, r);
    else launch_qkv_type<T, TV, false>(rows, grid, 0, s, p, r);
}

}  // namespace

// The (q/k, v) type pairs of llama-quantize's mixtures that one launch takes (v rows of a wider type,
// the same block size: GemvK::nb is the launch's).
#define CERA_QKV_PAIRS(X) \
    X(kQ4_K, kQ5_K)       \
    X(kQ4_K, kQ6_K) X(kQ5_K, kQ6_K) X(kQ2_K, kQ3_K) X(kQ2_K, kQ4_K) X(kQ3_K, kQ4_K) X(kQ3_K, kQ5_K) X(kIQ4_XS, kQ5_K)

bool gemv_qkv_v_fits(GgmlType t, GgmlType tv) {
#define CERA_PAIR(T, TV) || (t == GgmlType::T && tv == GgmlType::TV)
    return tv == t CERA_QKV_PAIRS(CERA_PAIR);
#undef CERA_PAIR
}

bool gemv_qkv_rope_supported(const GemvArgs (&qkv)[3], const QkvRopeArgs& r) {
    const GgmlType type = qkv[0].w.type;
    const int hd = r.head_dim;
    if (quant_layout(type).block_elems == 0 || (hd != 64 && hd != 128 && hd != 256)) return false;
    const int64_t rows[3] = {int64_t(r.n_head) * hd, int64_t(r.n_head_kv) * hd, int64_t(r.n_head_kv) * hd};
    for (int i = 0; i < 3; ++i) {
        const GemvArgs& g = qkv[i];
        const bool type_fits = i < 2 ? g.w.type == type : gemv_qkv_v_fits(type, g.w.type);
        if (!type_fits || g.w.k != qkv[0].w.k || g.rows != rows[i] || g.n_y != qkv[0].n_y || g.ids ||
            g.xq != qkv[0].xq || g.pro_x != qkv[0].pro_x || (!g.xq && !g.pro_x) || g.accumulate || g.res_out ||
            g.ldy != g.rows || g.n_y > 64)
            return false;
    }
    for (const RopeArgs* rr : {&r.q_rope, &r.k_rope})
        if (rr->mode != 0 && (rr->n_rot % 2 != 0 || rr->n_rot > hd)) return false;
    return qkv[0].y == r.q && qkv[1].y == r.k && qkv[2].y == r.v && r.n_tokens == qkv[0].n_y;
}

void gemv_qkv_rope_store(const GemvArgs (&qkv)[3], const QkvRopeArgs& r, Stream stream) {
    CERA_CHECK(gemv_qkv_rope_supported(qkv, r), "gemv_qkv_rope_store: unsupported shapes or types");
    bool vec = true;
    GemvK p = common_params(qkv[0], vec);
    for (int i = 0; i < 3; ++i) p.seg[i] = make_seg(qkv[i]);
    p.n_seg = 3;
    set_prologue(p, qkv[0]);
    const dim3 grid(unsigned(r.n_head + 2 * r.n_head_kv), unsigned(r.n_tokens));
    const size_t smem = prologue_smem(p);
    cudaStream_t s = as_stream(stream);
    const bool rows = qkv_rows_fit(qkv[0].w.type, r);
    const GgmlType tv = qkv[2].w.type;
    if (tv != qkv[0].w.type) {
        const GgmlType t = qkv[0].w.type;
#define CERA_PAIR(T, TV)                        \
    if (t == GgmlType::T && tv == GgmlType::TV) \
        return launch_qkv_types<GgmlType::T, GgmlType::TV>(r, rows, grid, smem, s, p);
        CERA_QKV_PAIRS(CERA_PAIR)
#undef CERA_PAIR
    }
    switch (qkv[0].w.type) {
#define CERA_Q(T)                                                            \
    case GgmlType::T: launch_qkv_types<GgmlType::T, GgmlType::T>(r, rows, grid, smem, s, p); break;
        CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
        default: CERA_CHECK(false, "gemv_qkv_rope_store: unsupported weight type %s", type_name(qkv[0].w.type));
    }
}

bool gemv_conv_supported(const GemvArgs& in_proj, int taps) {
    const int64_t n = in_proj.rows / 3;
    return quant_layout(in_proj.w.type).block_elems > 0 && in_proj.n_y == 1 && in_proj.rows % 3 == 0 && n % 32 == 0 &&
           n > 0 && taps >= 1 && taps <= kMaxConv && (in_proj.xq || in_proj.pro_x) && !in_proj.ids && !in_proj.accumulate &&
           !in_proj.res_out && in_proj.ldy == in_proj.rows;
}

void gemv_conv(const GemvArgs& in_proj, const float* conv_w, int taps, float* state, float* state_prev, float* out,
               void* out_xq, Stream stream) {
    CERA_CHECK(gemv_conv_supported(in_proj, taps), "gemv_conv: unsupported shapes or types");
    bool vec = true;
    GemvK p = common_params(in_proj, vec);
    p.seg[0] = make_seg(in_proj);
    p.n_seg = 1;
    set_prologue(p, in_proj);
    const unsigned grid = unsigned(in_proj.rows / 3 / 16);
    cudaStream_t s = as_stream(stream);
    auto* xq = static_cast<uint8_t*>(out_xq);
    switch (in_proj.w.type) {
#define CERA_Q(T)                                                                                               \
    case GgmlType::T:                                                                                           \
        if (p.px)                                                                                           \
            launch(gemv_conv_kernel<GgmlType::T, true>, grid, 512, prologue_smem(p), s, p, conv_w, taps, state, \
                   state_prev, out, xq);                                                                    \
        else                                                                                                \
            launch(gemv_conv_kernel<GgmlType::T, false>, grid, 512, 0, s, p, conv_w, taps, state, state_prev,  \
                   out, xq);                                                                                \
        break;
        CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
        default: CERA_CHECK(false, "gemv_conv: unsupported weight type %s", type_name(in_proj.w.type));
    }
}

}  // namespace cera::cuda
