// MoE expert products for batches, grouped by expert: each expert's weight rows are read from
// memory once per call instead of once per (token, expert) slot routed to it.
//
// Idea: moe_group() turns the router's ids [n_tokens, k] into per-expert lists of slots
// (s = t * k + j) with one block: counts by shared-memory atomics, an exclusive scan for the
// offsets, then a scatter of the slots. moe_gemv_grouped() runs a grid of (row tiles, n_expert)
// blocks: a block copies the weight image bytes of its tile (quant and scale streams) of expert e
// into shared memory once, then its warps loop over the slots routed to e, one (slot, 8-row group)
// per warp at a time: the lanes walk the items of the 8-bit activation row like the GEMV kernels
// (gemv.cu) and dot them with the staged rows (QTraits<T>::load_w<PlainLd>). Blocks of experts
// that got no slot exit after the PDL wait.
// Variants: every quantized type (CERA_QUANT_TYPES). Float weights keep the per-slot GEMV.
// Bottleneck: the weights are read once (n_expert x rows x k image bytes, e.g. 66 MB for 32 experts
// of 1792 x 2048 Q4_0, >= 15 us at ~4.3 TB/s); from some tens of slots per expert the dp4a work
// and the shared-memory reads of the staged rows dominate instead (each staged item is read once
// per slot).
#include <cstdlib>

#include "backends/cuda/quant_device.cuh"

namespace cera::cuda {
namespace {

constexpr int kMaxExperts = 256;  // moe_group: one thread per expert
constexpr int kThreads = 256;     // moe_gemv_grouped block
constexpr int kWarps = kThreads / 32;
constexpr int kNR = 8;                          // rows per warp unit
constexpr size_t kSmemDefault = 48 * 1024;      // tiles are sized to stay under this when they can
constexpr size_t kSmemMax = 160 * 1024;         // one 8-row group must fit (opt-in shared memory)

__device__ __forceinline__ int expert_of(int32_t id, int n_expert) { return min(max(int(id), 0), n_expert - 1); }

// route: counts [n_expert], offsets [n_expert + 1], slots [n_slots] (int32, see kernels.h).
__global__ void __launch_bounds__(kMaxExperts) moe_group_kernel(const int32_t* __restrict__ ids, int n_slots,
                                                                int n_expert, int32_t* __restrict__ route) {
    __shared__ int cnt[kMaxExperts], scan[kMaxExperts], cur[kMaxExperts];
    pdl_trigger();
    pdl_wait();
    const int tid = threadIdx.x;
    cnt[tid] = 0;
    __syncthreads();
    for (int s = tid; s < n_slots; s += kMaxExperts) atomicAdd(&cnt[expert_of(ids[s], n_expert)], 1);
    __syncthreads();
    const int v = cnt[tid];  // 0 past n_expert
    scan[tid] = v;
    __syncthreads();
    for (int off = 1; off < kMaxExperts; off <<= 1) {  // inclusive scan (Hillis-Steele)
        const int add = tid >= off ? scan[tid - off] : 0;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    const int excl = scan[tid] - v;
    cur[tid] = excl;
    int32_t* counts = route;
    int32_t* offsets = route + n_expert;
    int32_t* slots = offsets + n_expert + 1;
    if (tid < n_expert) counts[tid] = v, offsets[tid] = excl;
    if (tid == n_expert - 1) offsets[n_expert] = scan[tid];
    __syncthreads();
    for (int s = tid; s < n_slots; s += kMaxExperts) slots[atomicAdd(&cur[expert_of(ids[s], n_expert)], 1)] = s;
}

struct GroupedK {
    const uint8_t* q;  // quant stream of the whole image
    const uint8_t* m;  // scale stream of the whole image
    int64_t row0;      // image row of expert 0, row 0
    int64_t rows;      // rows per expert
    int64_t nb;        // blocks per row
    int64_t k;
    int n_expert;
    int tile_rows;     // rows per block, a multiple of kNR
    const int32_t* route;
    const uint8_t* xq;  // quantize_q8 rows; slot s reads row s / x_div
    int64_t ldxq;
    int x_div;
    float* y;  // [n_slots, ldy]
    int64_t ldy;
};

// Shared memory of a tile: its quant bytes, then its scale bytes in a 16-byte aligned window.
__host__ __device__ inline size_t tile_q_bytes(const QuantLayout& L, int64_t nb, int tile_rows) {
    return size_t(tile_rows) * size_t(nb) * size_t(L.q_bytes);
}
inline size_t tile_smem(const QuantLayout& L, int64_t nb, int tile_rows) {
    return tile_q_bytes(L, nb, tile_rows) + (size_t(tile_rows) * size_t(nb) * size_t(L.m_bytes) + 15) / 16 * 16 + 32;
}

template <GgmlType T>
__global__ void __launch_bounds__(kThreads) moe_gemv_grouped_kernel(const GroupedK a) {
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    extern __shared__ uint4 smem[];
    pdl_trigger();
    pdl_wait();
    const int e = blockIdx.y;
    const int32_t* counts = a.route;
    const int32_t* offsets = a.route + a.n_expert;
    const int32_t* slots = offsets + a.n_expert + 1;
    const int count = counts[e];
    const int64_t r0 = int64_t(blockIdx.x) * a.tile_rows;
    if (count == 0 || r0 >= a.rows) return;
    const int n_rows = int(min(int64_t(a.tile_rows), a.rows - r0));
    const int64_t gr0 = a.row0 + int64_t(e) * a.rows + r0;  // first image row of the tile
    const int64_t q_row = a.nb * L.q_bytes, m_row = a.nb * L.m_bytes;

    // Stage the tile: quant bytes (16-byte multiples, aligned), then the 16-byte aligned window
    // around its scale bytes (the image has spare bytes after its end).
    uint8_t* sq = reinterpret_cast<uint8_t*>(smem);
    const uint8_t* q_src = a.q + gr0 * q_row;
    const int64_t q_vecs = int64_t(n_rows) * q_row / 16;
    for (int64_t i = threadIdx.x; i < q_vecs; i += kThreads) smem[i] = ld_stream16(q_src + 16 * i);
    uint8_t* sm = sq + tile_q_bytes(L, a.nb, a.tile_rows);
    const int64_t m_lo = gr0 * m_row, m_hi = m_lo + int64_t(n_rows) * m_row;
    const int64_t w0 = m_lo & ~int64_t(15), w1 = (m_hi + 15) & ~int64_t(15);
    uint4* smv = reinterpret_cast<uint4*>(sm);
    for (int64_t i = threadIdx.x; i < (w1 - w0) / 16; i += kThreads) smv[i] = ld_stream16(a.m + w0 + 16 * i);
    const uint8_t* sm_rows = sm + (m_lo - w0);
    __syncthreads();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_groups = (n_rows + kNR - 1) / kNR;
    const int first = offsets[e];
    const int64_t n_items = a.nb * Tr::kItems;
    for (int u = warp; u < count * n_groups; u += kWarps) {
        const int g = u % n_groups;
        const int s = slots[first + u / n_groups];
        const uint8_t* qrow[kNR];
        const uint8_t* mrow[kNR];
#pragma unroll
        for (int r = 0; r < kNR; ++r) {
            const int lr = min(g * kNR + r, n_rows - 1);
            qrow[r] = sq + lr * q_row;
            mrow[r] = sm_rows + lr * m_row;
        }
        const uint8_t* xrow = a.xq + int64_t(s / a.x_div) * a.ldxq;
        const int8_t* xq = reinterpret_cast<const int8_t*>(xrow);
        const float* xd = reinterpret_cast<const float*>(xrow + a.k);
        float acc[kNR];
#pragma unroll
        for (int r = 0; r < kNR; ++r) acc[r] = 0.0f;
        for (int64_t it = lane; it < n_items; it += 32) {
            const int64_t blk = it / Tr::kItems;
            const int j = int(it % Tr::kItems);
            const auto x = load_item_x<Tr>(xq, xd, blk, j, L.block_elems);
#pragma unroll
            for (int r = 0; r < kNR; ++r)
                acc[r] += Tr::dot(Tr::template load_w<PlainLd>(qrow[r], mrow[r], blk, j), x, j);
        }
#pragma unroll
        for (int r = 0; r < kNR; ++r) {
            const float v = warp_sum(acc[r]);
            const int lr = g * kNR + r;
            if (lane == r && lr < n_rows) a.y[int64_t(s) * a.ldy + r0 + lr] = v;
        }
    }
}

// Rows per block: `forced` (tests: a multiple of 8 up to 128) when it fits, else the most 8-row
// groups (up to 4) whose staged bytes stay under 48 KB, else one group.
int pick_tile(const QuantLayout& L, int64_t nb, int forced) {
    if (forced >= kNR && forced <= 128 && forced % kNR == 0 && tile_smem(L, nb, forced) <= kSmemMax) return forced;
    for (int g = 4; g > 1; --g)
        if (tile_smem(L, nb, g * kNR) <= kSmemDefault) return g * kNR;
    return kNR;
}

}  // namespace

size_t moe_group_ints(int n_expert, int64_t n_slots) { return size_t(2 * n_expert + 1) + size_t(n_slots); }

void moe_group(const int32_t* ids, int64_t n_slots, int n_expert, int32_t* route, Stream stream) {
    CERA_CHECK(n_expert >= 1 && n_expert <= kMaxExperts && n_slots >= 0 && n_slots <= INT32_MAX,
               "moe_group: n_expert %d, n_slots %lld", n_expert, (long long)n_slots);
    launch(moe_group_kernel, 1, kMaxExperts, 0, as_stream(stream), ids, int(n_slots), n_expert, route);
}

bool moe_grouped_supported(GgmlType type, int64_t k, int n_expert) {
    const QuantLayout L = quant_layout(type);
    if (L.block_elems == 0 || k <= 0 || k % L.block_elems != 0 || n_expert < 1 || n_expert > kMaxExperts) return false;
    return tile_smem(L, k / L.block_elems, kNR) <= kSmemMax;
}

void moe_gemv_grouped(const MoeGemvArgs& a, Stream stream) {
    const GgmlType type = a.w.type;
    CERA_CHECK(moe_grouped_supported(type, a.w.k, a.n_expert), "moe_gemv_grouped: type %s, k %lld, n_expert %d",
               type_name(type), (long long)a.w.k, a.n_expert);
    CERA_CHECK(a.w.row0 + int64_t(a.n_expert) * a.rows <= a.w.image_rows && a.route && a.xq && a.y && a.x_div >= 1 &&
               a.ldy >= a.rows);
    if (a.rows == 0 || a.n_slots == 0) return;
    const QuantLayout L = quant_layout(type);
    GroupedK p{};
    p.nb = a.w.k / L.block_elems;
    p.q = static_cast<const uint8_t*>(a.w.image);
    p.m = scale_stream(a.w);
    p.row0 = a.w.row0, p.rows = a.rows, p.k = a.w.k;
    p.n_expert = a.n_expert;
    p.tile_rows = pick_tile(L, p.nb, a.tile_rows);
    p.route = a.route;
    p.xq = static_cast<const uint8_t*>(a.xq), p.ldxq = q8_row_bytes(a.w.k), p.x_div = a.x_div;
    p.y = a.y, p.ldy = a.ldy;
    const size_t smem = tile_smem(L, p.nb, p.tile_rows);
    const dim3 grid(unsigned(ceil_div(a.rows, p.tile_rows)), unsigned(a.n_expert));
    cudaStream_t s = as_stream(stream);
    switch (type) {
#define CERA_Q(T)                                                                                         \
    case GgmlType::T:                                                                                     \
        allow_dynamic_smem<moe_gemv_grouped_kernel<GgmlType::T>>(smem);                                   \
        launch(moe_gemv_grouped_kernel<GgmlType::T>, grid, kThreads, smem, s, p);                         \
        break;
        CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
        default: CERA_CHECK(false, "moe_gemv_grouped: unsupported weight type %s", type_name(type));
    }
}

}  // namespace cera::cuda
