// Causal GQA attention for the CPU kernel tables (kernel_table.h: KernelTable::attention), one kernel
// per ISA; the scalar reference in kernels_attention.cpp.
// Idea: each (query token, query head) row computes its scores against the
// cached keys 0..pos (window-limited), a softmax, and the weighted sum of the
// cached values, two passes over the cache with the scores kept in a per-thread
// buffer. The keys/values of one KV head stay in L2 across the rows that share
// it. Bottleneck: for decode, reading the cache (bytes = 2 * n_kv * head_dim *
// elem per head); for prefill, FLOPs (4 * n_tokens * n_kv/2 * head_dim per
// head), vectorized here with FMAs; exp is a vectorized polynomial.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/kv_groups.h"

namespace cera::cpu_attention {

// The cache element types. The block types (Q8_0, Q4_0, Q3_KV, Q4_KV: 32 elements a block) cover a token's row
// of n_head_kv * head_dim elements, which must be a multiple of 32; heads narrower than a block share
// one. The kernels read element offsets as block and place in the block.
// Q4_CH (keys only) codes each channel over groups of 64 rows (core/quant/kv_groups.h): element c of row r
// is in the group of r / 64, which needs the row's width (Args::kv_width).
enum class Elem : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ3_KV, kQ4_KV, kQ4_CH };

inline bool is_block(Elem e) { return e == Elem::kQ8_0 || e == Elem::kQ4_0 || e == Elem::kQ3_KV || e == Elem::kQ4_KV; }

struct Args {
    const float* q = nullptr;      // f32 [n_tokens, n_head * head_dim]
    const void* k = nullptr;       // [n_ctx, n_head_kv * head_dim] of k_type
    const void* v = nullptr;       // [n_ctx, n_head_kv * head_dim] of v_type
    Elem k_type = Elem::kF32, v_type = Elem::kF32;
    const int32_t* pos = nullptr;  // [n_tokens]
    float* out = nullptr;          // f32 [n_tokens, n_head * head_dim]
    int n_head = 0, group = 1, head_dim = 0;
    int64_t kv_width = 0;  // n_head_kv * head_dim
    int window = 0;        // > 0: sliding window
    float scale = 1.0f;
    // Paged caches (backend.h KvPaging): the query rows' sequence's block table, blocks of
    // 1 << block_shift rows; null: position j at row j.
    const int32_t* table = nullptr;
    int block_shift = 0;
    // Q4_CH keys: a query at position p reads keys [64 (p / 64), p] as Q8_0 rows (core/quant/kv_groups.h):
    // those at positions from new_first on from k_new (the step's keys as kv_groups::round_rows leaves them,
    // row j - new_first), those before from k_slot (the open group of new_first's group, Q8_0 rows by
    // j % 64; null: none, the codes are read).
    const float* k_new = nullptr;
    int32_t new_first = 0;
    const uint8_t* k_slot = nullptr;
};

// The cache row of position j.
inline int64_t kv_row(const Args& a, int64_t j) {
    if (!a.table) return j;
    return (int64_t(a.table[j >> a.block_shift]) << a.block_shift) | (j & ((int64_t(1) << a.block_shift) - 1));
}

// Q4_CH: the first key that a query at key range end reads as a Q8_0 row (the start of its group of 64).
inline int32_t open_begin(const Args& a, int32_t end) {
    return a.k_type == Elem::kQ4_CH ? (end - 1) / kv_groups::kRows * kv_groups::kRows : end;
}
// Q4_CH: the key of position j as the step stored it (j >= new_first), or as its open group holds it.
inline const float* new_key(const Args& a, int32_t j, int64_t c0) {
    return a.k_new + int64_t(j - a.new_first) * a.kv_width + c0;
}
// The Q8_0 row of the open group that holds position j (c0 is then its element offset).
inline const uint8_t* slot_row(const Args& a, int32_t j) {
    return a.k_slot + size_t(j % kv_groups::kRows) * kv_groups::open_row_bytes(a.kv_width);
}
// Q4_CH: channel c's record of the group holding cache row `row`.
inline const uint8_t* key_record(const Args& a, int64_t row, int64_t c) {
    return static_cast<const uint8_t*>(a.k) + kv_groups::record_offset(row, c, a.kv_width);
}

// Q4_CH: elements [c0, c0 + n) of the key at position j (j >= open_begin of the query) as its open group
// holds them.
inline void open_key(const Args& a, int32_t j, int64_t c0, int n, float* out) {
    if (j >= a.new_first) {
        const float* s = new_key(a, j, c0);
        for (int d = 0; d < n; ++d) out[d] = s[d];
    } else if (a.k_slot) {
        const auto* row = reinterpret_cast<const BlockQ8_0*>(slot_row(a, j));
        for (int d = 0; d < n; ++d) {
            const BlockQ8_0& b = row[(c0 + d) / 32];
            out[d] = float(b.qs[(c0 + d) % 32]) * fp16_to_fp32(b.d);
        }
    } else {
        for (int d = 0; d < n; ++d)
            out[d] = kv_groups::value(static_cast<const uint8_t*>(a.k), kv_row(a, j), c0 + d, a.kv_width);
    }
}

// The first key a query at key range end (its position + 1) sees: 0, or the window's start.
inline int32_t key_begin(const Args& a, int32_t end) { return a.window > 0 ? std::max(0, end - a.window) : 0; }

// Query tokens per block (the unit of work with the block_* kernels).
constexpr int kBlockTokens = 64;

// Floats of per-thread scratch the kernels need for a longest row of n_kv keys.
inline int64_t scratch_floats(int64_t n_kv, int head_dim, int group) {
    const int64_t rows_kernel = n_kv + 16 + 4 * int64_t(head_dim) + 64;
    const int64_t block_rows = int64_t(kBlockTokens) * group;
    const int64_t block_kernel = block_rows * (2 * int64_t(head_dim) + 2) + 64 * int64_t(head_dim) + 64;
    return rows_kernel > block_kernel ? rows_kernel : block_kernel;
}

// The start of a flash-style block kernel over query tokens [t0, t1) of KV head hk: its R = (t1 - t0) *
// group rows (row r: token t0 + r / group, head hk * group + r % group) get their scaled queries in qs
// [R, head_dim], zero sums in acc [R, head_dim] and l [R], m [R] = -inf; [kb, ke) is the union of the
// rows' key ranges.
inline void start_block(const Args& a, int64_t t0, int64_t t1, int hk, float* qs, float* acc, float* m, float* l,
                        int32_t& kb, int32_t& ke) {
    const int hd = a.head_dim, G = a.group;
    kb = INT32_MAX, ke = 0;
    for (int64_t r = 0; r < (t1 - t0) * G; ++r) {
        const int64_t t = t0 + r / G;
        const float* qv = a.q + (t * a.n_head + int64_t(hk) * G + r % G) * hd;
        for (int d = 0; d < hd; ++d) qs[r * hd + d] = qv[d] * a.scale;
        std::fill(acc + r * hd, acc + (r + 1) * hd, 0.0f);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        const int32_t e = a.pos[t] + 1;
        kb = std::min(kb, key_begin(a, e));
        ke = std::max(ke, e);
    }
}

// Rows r in [r0, r1) with r = t * n_head + h.
void rows_ref(const Args& a, int64_t r0, int64_t r1, float* scratch);
void rows_avx512(const Args& a, int64_t r0, int64_t r1, float* scratch);

// Query tokens [t0, t1) (at most kBlockTokens) of the `group` query heads that read KV head hk.
using BlockFn = void (*)(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch);
// The AVX-512 and AVX2 kernels are flash-style: each key tile (16 keys, 8 for AVX2) is decoded once per
// block and shared by all of its rows, with an online softmax (AVX-512 leaves one-token blocks to its row
// kernel); the reference runs its row kernel over the block's rows.
void block_ref(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch);
void block_avx2(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch);
void block_avx512(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch);

}  // namespace cera::cpu_attention
