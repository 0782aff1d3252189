// The streamed GEMV for one-token products of tens of MB (the LM head), and the greedy pick made in
// its launch (gemv_argmax_feed). The register kernel (gemv.cu) serves every other product.
#include <algorithm>
#include <climits>

#include "backends/cuda/gemv_device.cuh"
#include "backends/cuda/pick_device.cuh"

namespace cera::cuda {
namespace {

// Streamed product for very tall matrices (the LM head: 50-150k rows, 50-300 MB). The register
// kernel runs such a matrix in waves of short blocks that load, then dot, then leave, the first waves
// in step. Here one block a SM owns a contiguous share of the rows (balanced to a row) and walks it in
// tiles of 8 R rows through a ring of `stages` tiles in shared memory, each filled by bulk copies
// (one mbarrier a stage) issued `stages` tiles ahead, so the SM has stages - 1 tiles of bytes in
// flight while its 8 warps dot the current one (warp w: rows w R.. of the tile, the lanes over the
// items as in dot_rows; x from shared memory, copied once after the PDL wait). The first tiles are
// requested before the wait. One token, one product, no expert ids.
// With pk.out the kernel also makes the greedy pick of its output row (argmax_feed's work): each
// block its best (value, index) into pk's scratch, and the last block to finish the pick, so no
// arg-max launch follows the LM head.
// Roofline: the weight image once at the HBM rate: 84 MB (Q6_K, 50,257 x 2048) >= 19.5 us.
constexpr int kStreamMaxStages = 8;
struct StreamPick {
    int32_t* out = nullptr;  // null: no pick
    int32_t* feed_ids = nullptr;
    int32_t* feed_pos = nullptr;
    int64_t pos_last = 0;
    SplitPick split{};  // the arg-max scratch (pick_device.cuh)
    PickMail mail;
};
template <GgmlType T, int R>
__global__ void __launch_bounds__(256, 1) gemv_stream_kernel(const GemvK a, int stages, const StreamPick pk) {
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    constexpr int TR = 8 * R;       // rows a tile
    constexpr int LW = 32 / R;      // lanes holding one row's total
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t full[kStreamMaxStages];
    pdl_trigger();
    const Seg& sg = a.seg[0];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t qrow = uint32_t(a.nb * L.q_bytes), mrow = uint32_t(a.nb * L.m_bytes);
    const uint32_t stage_bytes = TR * (qrow + mrow);
    uint8_t* const xs = smem + size_t(stages) * stage_bytes;
    // This block's rows [lo, hi), its tiles of TR rows.
    const int64_t lo = sg.rows * blockIdx.x / gridDim.x, hi = sg.rows * (blockIdx.x + 1) / gridDim.x;
    const int n_tiles = int((hi - lo + TR - 1) / TR);
    // Stage s <- tile t: rows lo + t TR.., quant rows then scale rows, in 16 KB pieces over warp 0's lanes.
    auto issue = [&](int t, int s) {
        const int64_t r0 = lo + int64_t(t) * TR;
        const uint32_t n = uint32_t(min(int64_t(TR), hi - r0));
        uint8_t* dq = smem + size_t(s) * stage_bytes;
        uint8_t* dm = dq + TR * qrow;
        const uint8_t* srcq = sg.q + (sg.row0 + r0) * qrow;
        const uint8_t* srcm = sg.m + (sg.row0 + r0) * mrow;
        if (lane == 0) mbar_expect_tx(&full[s], n * (qrow + mrow));
        __syncwarp();
        constexpr uint32_t kPiece = 16 * 1024;
        int piece = 0;
        for (uint32_t o = 0; o < n * qrow; o += kPiece, ++piece)
            if (piece % 32 == lane) bulk_copy(dq + o, srcq + o, min(kPiece, n * qrow - o), &full[s]);
        for (uint32_t o = 0; o < n * mrow; o += kPiece, ++piece)
            if (piece % 32 == lane) bulk_copy(dm + o, srcm + o, min(kPiece, n * mrow - o), &full[s]);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == 0)
        for (int s = 0; s < stages && s < n_tiles; ++s) issue(s, s);
    const unsigned seq_before = pk.out ? mail_seq(pk.mail) : 0u;
    pdl_wait();
    {  // the 8-bit activation row (k bytes, then k / 32 float scales) into shared memory
        const int64_t xbytes = q8_row_bytes(a.k);
        for (int64_t o = int64_t(threadIdx.x) * 16; o < xbytes; o += 256 * 16)
            *reinterpret_cast<uint4*>(xs + o) = ld_cached16(a.xq + o);
    }
    __syncthreads();
    const int8_t* xq = reinterpret_cast<const int8_t*>(xs);
    const float* xd = reinterpret_cast<const float*>(xs + a.k);
    const int n_items = int(a.nb) * Tr::kItems;
    float best = -INFINITY;
    int bi = INT_MAX;
    for (int t = 0; t < n_tiles; ++t) {
        const int s = t % stages;
        mbar_wait(&full[s], uint32_t(t / stages) & 1u);
        const uint8_t* tq = smem + size_t(s) * stage_bytes;
        const uint8_t* tm = tq + TR * qrow;
        const int rl = warp * R;
        float acc[R] = {};
        plain_dot_rows<T, Tr, R, true>(xq, xd, n_items, [&](int r, const uint8_t*& q, const uint8_t*& m) {
            q = tq + (rl + r) * qrow, m = tm + (rl + r) * mrow;
        }, acc);
        // finish()'s epilogue for one token (rows past hi are a partial tile's stale bytes: not written).
        const float tot = warp_sum_rows<R>(acc);
        const int64_t row = lo + int64_t(t) * TR + rl + lane / LW;
        if (lane % LW == 0 && row < hi) {
            float v = tot;
            if (sg.bias) v += sg.bias[row];
            if (a.accumulate) v += sg.y[row];
            sg.y[row] = v;
            if (sg.res_out) sg.res_out[row] = sg.res_a[row] + sg.res_scale * v;
            take(v, int(row), best, bi);
        }
        __syncthreads();  // every warp is done with stage s
        if (warp == 0 && t + stages < n_tiles) issue(t + stages, s);
    }
    if (pk.out) split_pick<8>(best, bi, pk.split, pk.out, pk.feed_ids, pk.feed_pos, pk.pos_last, pk.mail, seq_before);
}

// The streamed kernel (gemv_stream_kernel) for a product of at least kStreamBytes of weights, one
// token, no expert ids, quantized rows whose two streams are 16-byte multiples at 16-byte aligned
// starts (GemvArgs::no_stream: never). 4 rows a warp, as many tiles in the ring as fit, up to
// kStreamMaxStages. The weights stream through shared memory while the register kernel's loads
// stall on each warp's own rows, which pays for products this large.
constexpr int64_t kStreamBytes = 32 << 20;
struct StreamPlan {
    int R = 0;  // 0: not streamed
    int stages = 0;
    size_t smem = 0;
    unsigned blocks = 0;
};
StreamPlan stream_plan(const GemvArgs& a) {
    const QuantLayout L = quant_layout(a.w.type);
    if (a.no_stream || L.block_elems == 0 || a.n_y != 1 || a.ids || a.x_div != 1 || a.norm_out || a.pro_x) return {};
    if (a.w.k % L.block_elems != 0 || reinterpret_cast<uintptr_t>(a.xq) % 16) return {};
    const int64_t nb = a.w.k / L.block_elems, qrow = nb * L.q_bytes, mrow = nb * L.m_bytes;
    if (a.rows * (qrow + mrow) < kStreamBytes || qrow % 16 || mrow % 16 || !stage_aligned(a, qrow, mrow)) return {};
    constexpr int R = 4;
    const int64_t stage = 8 * R * (qrow + mrow), xbytes = q8_row_bytes(a.w.k);
    const int64_t room = device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>() - xbytes - 1024;  // + static
    const int stages = int(std::min<int64_t>(kStreamMaxStages, room / stage));
    const int64_t blocks = sm_count();
    if (stages < 2 || a.rows < 8 * R * blocks || a.rows >= INT_MAX) return {};
    return {R, stages, size_t(stages * stage + xbytes), unsigned(blocks)};
}
template <int R>
void launch_stream(GgmlType type, const GemvK& p, const StreamPlan& sp, const StreamPick& pk, cudaStream_t s) {
    switch (type) {
#define CERA_Q(T)                                                                                            \
    case GgmlType::T:                                                                                        \
        allow_dynamic_smem<gemv_stream_kernel<GgmlType::T, R>>(sp.smem);                                     \
        prefer_carveout<gemv_stream_kernel<GgmlType::T, R>>(100);                                            \
        launch(gemv_stream_kernel<GgmlType::T, R>, sp.blocks, 256, sp.smem, s, p, sp.stages, pk);        \
        break;
        CERA_QUANT_TYPES(CERA_Q)
#undef CERA_Q
        default: CERA_CHECK(false, "gemv: unsupported weight type %s", type_name(type));
    }
}
void run_stream(const StreamPlan& sp, const GemvArgs& a, const StreamPick& pk, cudaStream_t s) {
    bool vec = true;
    GemvK p = common_params(a, vec);
    p.seg[0] = make_seg(a);
    p.n_seg = 1;
    launch_stream<4>(a.w.type, p, sp, pk, s);
}

}  // namespace

bool gemv_stream(const GemvArgs& a, Stream stream) {
    const StreamPlan sp = stream_plan(a);
    if (sp.R == 0) return false;
    run_stream(sp, a, StreamPick{}, as_stream(stream));
    return true;
}

bool gemv_argmax_feed(const GemvArgs& a, int32_t* out, int32_t* ids, int32_t* pos, int64_t pos_last, Stream stream,
                      void* scratch, PickMail mail) {
    if (!scratch || a.accumulate || a.res_out) return false;
    const StreamPlan sp = stream_plan(a);
    if (sp.R == 0 || sp.blocks > unsigned(kArgmaxSplitBlocks)) return false;
    StreamPick pk;
    pk.out = out, pk.feed_ids = ids, pk.feed_pos = pos, pk.pos_last = pos_last, pk.mail = mail;
    pk.split = split_pick_scratch(scratch);
    run_stream(sp, a, pk, as_stream(stream));
    return true;
}

}  // namespace cera::cuda
