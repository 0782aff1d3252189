// What the attention kernels of attention.cu, attention_mma.cu and attention_decode.cu share: the
// argument block, the scratch layout, shared-memory loads and asynchronous copies, the output writer, and the merge of a
// decode step's key splits by the last split to finish.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_codec.cuh"

namespace cera::cuda {

// The attention scratch starts with the decode kernels' counters (one int per (token, kv head), at
// the same place whatever the call's shape, so no call's partials overwrite another's counters);
// every kernel's partials follow them.
constexpr int64_t kDecodeCounterFloats = 1024;

struct DecodeAttnArgs {
    const float* q;
    const void* k;
    const void* v;
    const int32_t* pos;
    int64_t n_ctx, n_tokens;
    int n_head, n_head_kv, head_dim, n_splits, sliding_window;
    float scale;
    float* out;
    float* partial;
    int kc;           // decode kernels: keys per chunk
    uint8_t* out_xq;  // quantize_q8 rows of out (row = n_head * head_dim), or null
    // attn_decw_kernel: n_head_kv counts blocks of query heads, kv_div of them to a cache head (a
    // GQA group split over kv_div blocks); every other kernel: 1.
    int kv_div = 1;
    // attn_decw_kernel: chunks in flight at once (a pipeline of shared-memory stages); others: 1.
    int stages = 1;
    // Paged caches (AttentionArgs): the cache row of position p of query t's sequence is
    // table[seq[t]][p >> block_shift] << block_shift | p % block size; table null: row p.
    const int32_t* seq;
    const int32_t* table;
    int table_stride, block_shift;
    bool each_seq;  // every query is a sequence of its own (a batch of decode tokens)
};

// The cache row that holds position p of query t's sequence.
__device__ __forceinline__ int64_t kv_row(const DecodeAttnArgs& a, int64_t t, int64_t p) {
    if (!a.table) return p;
    const int64_t b = __ldg(a.table + int64_t(__ldg(a.seq + t)) * a.table_stride + (p >> a.block_shift));
    return (b << a.block_shift) | (p & ((int64_t(1) << a.block_shift) - 1));
}

// The rows of query t's sequence below this position are complete before the step's first kernel
// (earlier steps wrote them): its position when every query is a sequence of its own, else the
// smallest position of the step (the queries of one sequence).
__device__ __forceinline__ int64_t rows_written_before(const DecodeAttnArgs& a, int64_t t) {
    if (a.each_seq) return a.pos[t];
    int64_t safe = INT64_MAX;
    for (int64_t i = 0; i < a.n_tokens; ++i) safe = min(safe, int64_t(a.pos[i]));
    return safe;
}

// How the decode kernels stage a head's K and V rows in shared memory: their cache bytes, copied with
// cp.async in 16-byte pieces (element codecs) or 4-byte pieces (block codecs: a head of a multiple of
// 64 elements keeps 4-byte alignment, kv_staged). K rows are padded so that lanes reading the same
// element of different keys hit different banks: by 16 bytes for the 16-byte reads, to an odd number
// of words for the block codecs' 2-byte reads.
CERA_HD constexpr int kv_staged_bytes(KvCodec c, int hd) { return int(kv_row_bytes(c, hd)); }
CERA_HD constexpr int kv_staged_krow(KvCodec c, int hd) {
    return kv_blocked(c) ? kv_staged_bytes(c, hd) + (kv_staged_bytes(c, hd) / 4 % 2 == 0 ? 4 : 0)
                         : kv_staged_bytes(c, hd) + 16;
}
// Whether heads of hd elements of codec c can be staged so.
CERA_HD constexpr bool kv_staged(KvCodec c, int hd) { return kv_blocked(c) ? hd % 64 == 0 : hd % 8 == 0; }

// Keys of codec K, values of codec V: a row's pieces, the larger count of the two (pieces), and the
// copy of piece c of a key row (a value row), none past its own count.
template <class K, class V = K>
struct KvRows {
    int krow, vrow, kpieces, vpieces, pieces;
    __device__ explicit KvRows(int hd)
        : krow(kv_staged_krow(K::kCodec, hd)),
          vrow(kv_staged_bytes(V::kCodec, hd)),
          kpieces(kv_staged_bytes(K::kCodec, hd) / (kv_blocked(K::kCodec) ? 4 : 16)),
          vpieces(kv_staged_bytes(V::kCodec, hd) / (kv_blocked(V::kCodec) ? 4 : 16)),
          pieces(kpieces > vpieces ? kpieces : vpieces) {}
    template <class C>
    __device__ __forceinline__ static void piece(unsigned char* dst, const unsigned char* src, int c) {
        if constexpr (kv_blocked(C::kCodec)) cp_async4(dst + 4 * c, src + 4 * c);
        else cp_async16v(dst + 16 * c, src + 16 * c);
    }
    __device__ __forceinline__ void copy_k(unsigned char* dst, const unsigned char* src, int c) const {
        if (std::is_same_v<K, V> || c < kpieces) piece<K>(dst, src, c);
    }
    __device__ __forceinline__ void copy_v(unsigned char* dst, const unsigned char* src, int c) const {
        if (std::is_same_v<K, V> || c < vpieces) piece<V>(dst, src, c);
    }
};

// out[qrow][d] = v, and its 8-bit group when out_xq is set (whole warps cover 32 consecutive d).
// store = false: the same instructions, nothing written (attn_decw_kernel's dry pass).
__device__ __forceinline__ void write_out(const DecodeAttnArgs& a, int64_t qrow, int d, float v,
                                          bool store = true) {
    if (store) a.out[qrow * a.head_dim + d] = v;
    if (a.out_xq) {
        const int64_t width = int64_t(a.n_head) * a.head_dim;
        const int64_t t = qrow / a.n_head, e = (qrow % a.n_head) * a.head_dim + d;
        warp_quantize_q8(v, a.out_xq + t * q8_row_bytes(width), width, e >> 5, store);
    }
}

// A decode kernel's split s of n_act has written its (o [G][hd], m [G], l [G]) at `base` + s * per
// (per = G * (hd + 2)); the last split of (token, kv head) `group` to finish (an atomic counter at the
// start of the scratch, reset by that block) merges all of them into the output rows qrow0 .. + G.
// Every thread of the block calls it; sm is the kernel's shared memory, at least merge_smem_bytes
// (free once every thread has taken the ticket). The splits' m and l are loaded all at once and turned
// into each split's weight first, so the loads of o that follow are independent of one another (a
// running rescale would chain them: a long context has tens of splits, and one L2 round trip a split
// costs more than the split's own key loop).
CERA_HD constexpr size_t merge_smem_bytes(int n_splits, int G) { return sizeof(float) * 3 * size_t(n_splits) * G; }
__device__ __forceinline__ void merge_last_split(const DecodeAttnArgs& a, const float* base, int64_t per, int G,
                                                 int hd, int n_act, int64_t group, int64_t qrow0, void* sm) {
    const int tid = threadIdx.x;
    unsigned* counter = reinterpret_cast<unsigned*>(a.partial) + group;
    if (block_ticket(counter) != unsigned(n_act - 1)) return;
    const int nw = n_act * G;  // [split][head]
    float* ms = static_cast<float*>(sm);
    float* ls = ms + nw;
    float* ws = ls + nw;
    for (int i = tid; i < nw; i += blockDim.x) {
        const float* pj = base + (i / G) * per;
        ms[i] = __ldcg(pj + G * hd + i % G), ls[i] = __ldcg(pj + G * hd + G + i % G);
    }
    __syncthreads();
    for (int i = tid; i < nw; i += blockDim.x) {
        const int g = i % G;
        float M = -INFINITY;
        for (int j = 0; j < n_act; ++j)
            if (ls[j * G + g] > 0.0f) M = fmaxf(M, ms[j * G + g]);
        ws[i] = ls[i] > 0.0f ? __expf(ms[i] - M) : 0.0f;  // a split without keys weighs nothing
    }
    __syncthreads();
    for (int e = tid; e < G * hd; e += blockDim.x) {
        const int g = e / hd;
        float L = 0.0f, O = 0.0f;
#pragma unroll 16
        for (int j = 0; j < n_act; ++j) {
            const float w = ws[j * G + g], o = __ldcg(base + j * per + e);
            if (w > 0.0f) O = fmaf(o, w, O), L = fmaf(ls[j * G + g], w, L);  // a weightless split's o does not count
        }
        write_out(a, qrow0 + g, e - g * hd, L > 0.0f ? O / L : 0.0f);
    }
    if (tid == 0) *counter = 0;
}

// Prefill on tensor cores (attention_mma.cu): any codec but F32, head_dim 64 or 128, one split. A block owns
// kFaRows rows of (query, head of the GQA group) pairs of one kv head: grid (n_head_kv,
// ceil(n_tokens * G / kFaRows)).
constexpr int kFaRows = 64;
void attention_prefill_mma(const DecodeAttnArgs& k, KvCodec codec, dim3 grid, cudaStream_t s);

// The warp-parallel decode kernel (attention_decode.cu) on a, whose kc and n_splits come from the
// decode plan of attention.cu; false (nothing launched) when it does not serve these shapes
// (head_dim other than 64 / 128, GQA groups above 8).
bool attention_decode_warp(const DecodeAttnArgs& a, KvCodec codec, cudaStream_t s);

}  // namespace cera::cuda
