// Device-side decoding of the weight images described in kernels.h, one traits struct per type.
//
// The unit of work is an *item*: one lane's share of a block, 16 or 32 bytes of quants. A quantized
// item covers two runs of kRun elements (block-relative element offsets ea, eb): kRun = 16 for the
// low and high nibbles of 16 bytes or 32 plain bytes of Q8_0, 32 for the wide Q5_K items (32
// bytes of nibbles, WideTraits). For each item a traits struct gives
//   load_w(q_row, m_row, blk, j)  the weight bytes of item j of block blk (16-byte loads),
//   flip(blk)                     the order of the item's halves (load_xq must load x the same way),
//   dot(w, x, j)                  the item's dot product with the 8-bit activations (X = XQn),
//   dequant(w, j, va, vb)         the item's 2 kRun values (for embeddings and the prefill GEMM).
// Float weights use 8-element items dotted with f32 activations.
#pragma once
#include "backends/cuda/common.cuh"

namespace cera::cuda {

constexpr int kOnes = 0x01010101;

// The activations of one quantized item: two runs of 4N int8 (N = 4: 16 elements, the item of most
// types; N = 8: 32, the wide Q5_K item) with their scales and sums. A run lies in one 32-group.
template <int N>
struct XQn {
    int a[N], b[N];
    float da, db;
    int sa, sb;  // sum of the run's int8 values
};
using XQ = XQn<4>;

__device__ __forceinline__ void set_words(int* dst, const uint4& v) {
    dst[0] = int(v.x), dst[1] = int(v.y), dst[2] = int(v.z), dst[3] = int(v.w);
}

// xq_row, xd_row: one row of quantize_q8 output, in global memory (read through the read-only cache)
// or, with Shared, in shared memory. N = 8: words 4h.. of a run hold its 16 elements 16 (h ^ flip)..,
// in the order the item's weight halves were loaded (Q5kTraits::load_w).
template <bool Shared = false, int N = 4>
__device__ __forceinline__ XQn<N> load_xq(const int8_t* xq_row, const float* xd_row, int ea, int eb, int flip = 0) {
    XQn<N> x;
#pragma unroll
    for (int h = 0; h < N / 4; ++h) {
        const int o = 16 * (h ^ flip);
        if constexpr (Shared) {
            set_words(x.a + 4 * h, *reinterpret_cast<const uint4*>(xq_row + ea + o));
            set_words(x.b + 4 * h, *reinterpret_cast<const uint4*>(xq_row + eb + o));
        } else {
            set_words(x.a + 4 * h, ld_cached16(xq_row + ea + o));
            set_words(x.b + 4 * h, ld_cached16(xq_row + eb + o));
        }
    }
    if constexpr (Shared) {
        x.da = xd_row[ea >> 5], x.db = xd_row[eb >> 5];
    } else {
        x.da = __ldg(xd_row + (ea >> 5)), x.db = __ldg(xd_row + (eb >> 5));
    }
    x.sa = 0, x.sb = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) x.sa = __dp4a(x.a[i], kOnes, x.sa), x.sb = __dp4a(x.b[i], kOnes, x.sb);
    return x;
}

__device__ __forceinline__ int word(const uint4& v, int i) { return int(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w); }
// Bits 0..3 of v to bit 0 of bytes 0..3.
__device__ __forceinline__ int spread4(uint32_t v) { return int(((v & 0xFu) * 0x00204081u) & 0x01010101u); }

// dp4a with unsigned bytes in a and signed bytes in b.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Integer dot of 16 nibble pairs (low -> a[0..3], high -> b[0..3]), accumulated. The high nibbles
// are dotted in place (bytes & 0xF0, unsigned): s_hi16 gets 16 times their dot, so an item needs one
// shift instead of one per word.
__device__ __forceinline__ void dot_nibbles_acc(const uint4& q, const int* a, const int* b, int& s_lo, int& s_hi16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t w = uint32_t(word(q, i));
        s_lo = dp4a_us(w & 0x0F0F0F0Fu, a[i], s_lo);
        s_hi16 = dp4a_us(w & 0xF0F0F0F0u, b[i], s_hi16);
    }
}
__device__ __forceinline__ void dot_nibbles(const uint4& q, const XQ& x, int& s_lo, int& s_hi) {
    s_lo = 0, s_hi = 0;
    dot_nibbles_acc(q, x.a, x.b, s_lo, s_hi);
    s_hi >>= 4;  // exact: a multiple of 16
}

// Where load_w reads the weight bytes from: global memory through the read-only path (GEMV
// kernels), or plain loads (weights staged in shared memory).
struct GlobalLd {
    __device__ static uint4 v16(const void* p) { return ld_stream16(p); }
    __device__ static uint4 v16_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
    __device__ static uint2 v8(const void* p) { return __ldg(static_cast<const uint2*>(p)); }
};
struct PlainLd {
    __device__ static uint4 v16(const void* p) { return *static_cast<const uint4*>(p); }
    __device__ static uint4 v16_cached(const void* p) { return *static_cast<const uint4*>(p); }
    __device__ static uint2 v8(const void* p) { return *static_cast<const uint2*>(p); }
};

template <GgmlType T>
struct QTraits;

// ---------------------------------------------------------------- 32-element blocks
template <>
struct QTraits<GgmlType::kQ4_0> {
    static constexpr int kItems = 1, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W { uint4 q; float d; };
    __device__ static void runs(int, int& ea, int& eb) { ea = 0, eb = 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int) {
        return {Ld::v16(q + blk * 16), half_bits_to_float(reinterpret_cast<const uint16_t*>(m)[blk])};
    }
    __device__ static float dot(const W& w, const XQ& x, int) {
        int lo, hi;
        dot_nibbles(w.q, x, lo, hi);
        return w.d * x.da * float(lo + hi - 8 * (x.sa + x.sb));
    }
    __device__ static void dequant(const W& w, int, float* va, float* vb) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int byte = (word(w.q, i >> 2) >> (8 * (i & 3))) & 0xFF;
            va[i] = w.d * float((byte & 0xF) - 8);
            vb[i] = w.d * float((byte >> 4) - 8);
        }
    }
};

template <>
struct QTraits<GgmlType::kQ4_1> {
    static constexpr int kItems = 1, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W { uint4 q; float d, m; };
    __device__ static void runs(int, int& ea, int& eb) { ea = 0, eb = 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int) {
        const uint32_t dm = reinterpret_cast<const uint32_t*>(m)[blk];
        return {Ld::v16(q + blk * 16), half_bits_to_float(uint16_t(dm)), half_bits_to_float(uint16_t(dm >> 16))};
    }
    __device__ static float dot(const W& w, const XQ& x, int) {
        int lo, hi;
        dot_nibbles(w.q, x, lo, hi);
        return x.da * (w.d * float(lo + hi) + w.m * float(x.sa + x.sb));
    }
    __device__ static void dequant(const W& w, int, float* va, float* vb) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int byte = (word(w.q, i >> 2) >> (8 * (i & 3))) & 0xFF;
            va[i] = w.d * float(byte & 0xF) + w.m;
            vb[i] = w.d * float(byte >> 4) + w.m;
        }
    }
};

// Q5_0 / Q5_1: the nibbles plus a 5th bit from qh (bit j = element j).
template <bool kMin>
struct Q5Traits {
    static constexpr int kItems = 1, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W { uint4 q; uint32_t qh; float d, m; };
    __device__ static void runs(int, int& ea, int& eb) { ea = 0, eb = 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int) {
        const uint2 meta = reinterpret_cast<const uint2*>(m)[blk];
        return {Ld::v16(q + blk * 16), meta.y, half_bits_to_float(uint16_t(meta.x)),
                kMin ? half_bits_to_float(uint16_t(meta.x >> 16)) : 0.0f};
    }
    __device__ static float dot(const W& w, const XQ& x, int) {
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = word(w.q, i);
            lo = __dp4a((v & 0x0F0F0F0F) | (spread4(w.qh >> (4 * i)) << 4), x.a[i], lo);
            hi = __dp4a(((v >> 4) & 0x0F0F0F0F) | (spread4(w.qh >> (16 + 4 * i)) << 4), x.b[i], hi);
        }
        if (kMin) return x.da * (w.d * float(lo + hi) + w.m * float(x.sa + x.sb));
        return w.d * x.da * float(lo + hi - 16 * (x.sa + x.sb));
    }
    __device__ static void dequant(const W& w, int, float* va, float* vb) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int byte = (word(w.q, i >> 2) >> (8 * (i & 3))) & 0xFF;
            const int qa = (byte & 0xF) | (((w.qh >> i) & 1) << 4);
            const int qb = (byte >> 4) | (((w.qh >> (i + 16)) & 1) << 4);
            va[i] = kMin ? w.d * float(qa) + w.m : w.d * float(qa - 16);
            vb[i] = kMin ? w.d * float(qb) + w.m : w.d * float(qb - 16);
        }
    }
};
template <>
struct QTraits<GgmlType::kQ5_0> : Q5Traits<false> {};
template <>
struct QTraits<GgmlType::kQ5_1> : Q5Traits<true> {};

template <>
struct QTraits<GgmlType::kQ8_0> {
    static constexpr int kItems = 1, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W { uint4 q0, q1; float d; };
    __device__ static void runs(int, int& ea, int& eb) { ea = 0, eb = 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int) {
        return {Ld::v16(q + blk * 32), Ld::v16(q + blk * 32 + 16),
                half_bits_to_float(reinterpret_cast<const uint16_t*>(m)[blk])};
    }
    __device__ static float dot(const W& w, const XQ& x, int) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) s = __dp4a(word(w.q1, i), x.b[i], __dp4a(word(w.q0, i), x.a[i], s));
        return w.d * x.da * float(s);
    }
    __device__ static void dequant(const W& w, int, float* va, float* vb) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            va[i] = w.d * float(int8_t(word(w.q0, i >> 2) >> (8 * (i & 3))));
            vb[i] = w.d * float(int8_t(word(w.q1, i >> 2) >> (8 * (i & 3))));
        }
    }
};

// ---------------------------------------------------------------- K-quants (256-element blocks)
// Q5_K: 64-element group g = 32 bytes of qs, byte l (0..31)'s low nibble = element 64g + l (sub-block
// 2g, run a), high = 64g + 32 + l (sub-block 2g+1, run b); the 5th bits are bits 2g / 2g+1 of qh[l].
// The image stores a block's qs as halves (weight_image.cpp): bytes 64h + 16g.. hold l = 16h..16h+15
// of group g, so 16-byte items are lane-contiguous, and the lanes of a warp taking 32-byte items (4
// per block) read 64 contiguous bytes of each block per load. Odd blocks load their second half first
// (flip), so that 8 neighbouring lanes cover distinct shared-memory banks.
__device__ __forceinline__ int byte_of(uint32_t w, int i) { return int((w >> (8 * i)) & 0xFF); }
// The scales and mins of 64-element group g (sub-blocks 2g, 2g+1) from the image's scale stream
// (meta.y, .z, .w: weight_image.cpp k_scale_stream).
__device__ __forceinline__ void k_group_scales(const uint4& meta, int g, int& sc0, int& m0, int& sc1, int& m1) {
    const uint32_t sh = 8u * uint32_t(g), a = meta.y >> sh, b = meta.z >> sh, c = meta.w >> sh;
    sc0 = int(a & 63u), sc1 = int(b & 63u);
    m0 = int((c & 15u) | ((a >> 2) & 48u));
    m1 = int(((c >> 4) & 15u) | ((b >> 2) & 48u));
}

// kWide = false: 16-byte items j (0..7) = image chunk j, half j / 4 of group j % 4 (runs of 16);
// true: 32-byte items j (0..3) = group j, both halves (runs of 32; one scale decode per 32 bytes).
template <bool kWide = false>
struct Q5kTraits {
    static constexpr int kH = kWide ? 2 : 1;  // 16-byte halves per item
    static constexpr int kItems = 8 / kH, kRun = 16 * kH;
    using X = XQn<4 * kH>;
    // q[h], qh[h]: elements l = 16 (h ^ flip).. of the group (the order of load_xq's words).
    struct W { uint4 q[kH], qh[kH], meta; int flip; };
    __device__ static int flip(int64_t blk) { return kWide ? int(blk & 1) : 0; }
    __device__ static int group(int j) { return kWide ? j : j & 3; }
    __device__ static void runs(int j, int& ea, int& eb) {
        ea = kWide ? 64 * j : 64 * (j & 3) + 16 * (j >> 2);
        eb = ea + 32;
    }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int j) {
        W w;
        const uint8_t* b = q + blk * 160;
        w.flip = flip(blk);
#pragma unroll
        for (int h = 0; h < kH; ++h) {
            const int half = kWide ? h ^ w.flip : j >> 2;
            w.q[h] = Ld::v16(b + 64 * half + 16 * group(j));
            w.qh[h] = Ld::v16(b + 128 + 16 * half);
        }
        w.meta = Ld::v16_cached(m + 16 * blk);
        return w;
    }
    // Word i (0..4 kH - 1) of the item: 4 low quants and the 4 high ones 32 elements later.
    __device__ static void item_q(const W& w, int j, int i, int& lo, int& hi) {
        const int v = word(w.q[i >> 2], i & 3);
        const int h = word(w.qh[i >> 2], i & 3), g = group(j);
        lo = (v & 0x0F0F0F0F) | ((h >> (2 * g)) & 0x01010101) << 4;
        hi = ((v >> 4) & 0x0F0F0F0F) | ((h >> (2 * g + 1)) & 0x01010101) << 4;
    }
    __device__ static float dot(const W& w, const X& x, int j) {
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4 * kH; ++i) {
            int ql, qh;
            item_q(w, j, i, ql, qh);
            lo = __dp4a(ql, x.a[i], lo);
            hi = __dp4a(qh, x.b[i], hi);
        }
        int sc0, m0, sc1, m1;
        k_group_scales(w.meta, group(j), sc0, m0, sc1, m1);
        const float d = half_bits_to_float(uint16_t(w.meta.x)), dmin = half_bits_to_float(uint16_t(w.meta.x >> 16));
        return d * (x.da * float(sc0 * lo) + x.db * float(sc1 * hi)) -
               dmin * (x.da * float(m0 * x.sa) + x.db * float(m1 * x.sb));
    }
    __device__ static void dequant(const W& w, int j, float* va, float* vb) {
        int sc0, m0, sc1, m1;
        k_group_scales(w.meta, group(j), sc0, m0, sc1, m1);
        const float d = half_bits_to_float(uint16_t(w.meta.x)), dmin = half_bits_to_float(uint16_t(w.meta.x >> 16));
        const float d0 = d * float(sc0), d1 = d * float(sc1), n0 = dmin * float(m0), n1 = dmin * float(m1);
#pragma unroll
        for (int i = 0; i < 4 * kH; ++i) {
            int ql, qh;
            item_q(w, j, i, ql, qh);
            const int e = 16 * ((i >> 2) ^ w.flip) + 4 * (i & 3);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                va[e + b] = d0 * float(byte_of(uint32_t(ql), b)) - n0;
                vb[e + b] = d1 * float(byte_of(uint32_t(qh), b)) - n1;
            }
        }
    }
};
template <>
struct QTraits<GgmlType::kQ5_K> : Q5kTraits<> {};

// Q4_K in 32-element items (weight_image.cpp k4_items): item j of a block is sub-block j, 16 bytes with
// element l in the low nibble of byte l and element l + 16 in its high nibble (the Q4_0 order); the
// scale stream holds d, dmin (f16), then each sub-block's 6-bit scale and min as two bytes. An item
// is one 32-group of the activations, dotted as Q4_1's with scale d * sc and min dmin * m:
// 6 registers an item instead of 9, so the kernels take Q4_0's rows a warp.
template <>
struct QTraits<GgmlType::kQ4_K> {
    static constexpr int kItems = 8, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    // The item's scale d * sc and min dmin * m, made when the item is loaded (before a GEMV's PDL wait,
    // see settle_w), so that the dot after the wait is Q4_0's length.
    struct W { uint4 q; float s, n; };
    __device__ static void runs(int j, int& ea, int& eb) { ea = 32 * j, eb = 32 * j + 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int j) {
        const uint8_t* mb = m + blk * 20;
        const uint32_t dm = *reinterpret_cast<const uint32_t*>(mb);
        const uint32_t sm = reinterpret_cast<const uint16_t*>(mb + 4)[j];
        return {Ld::v16(q + blk * 128 + 16 * j), half_bits_to_float(uint16_t(dm)) * float(sm & 0xFFu),
                half_bits_to_float(uint16_t(dm >> 16)) * float(sm >> 8)};
    }
    __device__ static float dot(const W& w, const XQ& x, int) {
        int lo, hi;
        dot_nibbles(w.q, x, lo, hi);
        return x.da * (w.s * float(lo + hi) - w.n * float(x.sa + x.sb));
    }
    __device__ static void dequant(const W& w, int, float* va, float* vb) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int byte = (word(w.q, i >> 2) >> (8 * (i & 3))) & 0xFF;
            va[i] = w.s * float(byte & 0xF) - w.n;
            vb[i] = w.s * float(byte >> 4) - w.n;
        }
    }
};
// settle_w(w): the item's values are made here, before a GEMV's PDL wait, not where the dot first
// uses them after it (an empty volatile statement, kept in order with the wait), so that their
// loads and arithmetic overlap the wait instead of following it.
template <class W>
__device__ __forceinline__ void settle_w(const W&) {}
__device__ __forceinline__ void settle_w(const QTraits<GgmlType::kQ4_K>::W& w) {
    asm volatile("" ::"f"(w.s), "f"(w.n));
}
// The traits a kernel takes with wide = true: 32-byte items for Q5_K, else QTraits<T>.
template <GgmlType T, bool kWide>
struct WideTraits : QTraits<T> {};
template <>
struct WideTraits<GgmlType::kQ5_K, true> : Q5kTraits<true> {};

// Q6_K: block image = ql[128] qh[64] scales[16], then d in the scale stream. Item j (0..7): half
// n = j/4 (128 elements), jj = j%4: 16 bytes ql[64n + 16jj], 16 bytes qh[32n + 16(jj%2)].
// Low nibbles: elements 128n + 16(jj%2) + 32(jj/2) + i with scale 8n + jj; high: +64, scale 8n + jj + 4.
template <>
struct QTraits<GgmlType::kQ6_K> {
    static constexpr int kItems = 8, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W { uint4 ql, qh; uint2 sc; float d; };
    __device__ static void runs(int j, int& ea, int& eb) {
        const int jj = j & 3;
        ea = 128 * (j >> 2) + 16 * (jj & 1) + 32 * (jj >> 1);
        eb = ea + 64;
    }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int j) {
        W w;
        const uint8_t* b = q + blk * 208;
        const int n = j >> 2, jj = j & 3;
        w.ql = Ld::v16(b + 64 * n + 16 * jj);
        w.qh = Ld::v16(b + 128 + 32 * n + 16 * (jj & 1));
        w.sc = Ld::v8(b + 192 + 8 * n);
        w.d = half_bits_to_float(reinterpret_cast<const uint16_t*>(m)[blk]);
        return w;
    }
    __device__ static void item_q(const W& w, int j, int i, int& lo, int& hi) {
        const int sh = 2 * ((j & 3) >> 1);
        const int v = word(w.ql, i), h = word(w.qh, i);
        lo = (v & 0x0F0F0F0F) | (((h >> sh) & 0x03030303) << 4);
        hi = ((v >> 4) & 0x0F0F0F0F) | (((h >> (sh + 4)) & 0x03030303) << 4);
    }
    __device__ static void scales(const W& w, int j, float& s_lo, float& s_hi) {
        const int jj = j & 3;
        s_lo = float(int8_t(byte_of(w.sc.x, jj)));
        s_hi = float(int8_t(byte_of(w.sc.y, jj)));
    }
    __device__ static float dot(const W& w, const XQ& x, int j) {
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int ql, qh;
            item_q(w, j, i, ql, qh);
            lo = __dp4a(ql, x.a[i], lo);
            hi = __dp4a(qh, x.b[i], hi);
        }
        float s_lo, s_hi;
        scales(w, j, s_lo, s_hi);
        return w.d * (s_lo * x.da * float(lo - 32 * x.sa) + s_hi * x.db * float(hi - 32 * x.sb));
    }
    __device__ static void dequant(const W& w, int j, float* va, float* vb) {
        float s_lo, s_hi;
        scales(w, j, s_lo, s_hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int ql, qh;
            item_q(w, j, i, ql, qh);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                va[4 * i + b] = w.d * s_lo * float(byte_of(uint32_t(ql), b) - 32);
                vb[4 * i + b] = w.d * s_hi * float(byte_of(uint32_t(qh), b) - 32);
            }
        }
    }
};

// ---------------------------------------------------------------- float weights: 8-element items
template <GgmlType T>
struct FTraits;
template <>
struct FTraits<GgmlType::kF32> {
    __device__ static void load(const void* row, int64_t item, float* v) {
        const uint4 a = ld_stream16(static_cast<const float*>(row) + 8 * item);
        const uint4 b = ld_stream16(static_cast<const float*>(row) + 8 * item + 4);
        v[0] = __uint_as_float(a.x), v[1] = __uint_as_float(a.y), v[2] = __uint_as_float(a.z), v[3] = __uint_as_float(a.w);
        v[4] = __uint_as_float(b.x), v[5] = __uint_as_float(b.y), v[6] = __uint_as_float(b.z), v[7] = __uint_as_float(b.w);
    }
    __device__ static float one(const void* row, int64_t i) { return static_cast<const float*>(row)[i]; }
};
template <>
struct FTraits<GgmlType::kF16> {
    __device__ static void load(const void* row, int64_t item, float* v) {
        const uint4 a = ld_stream16(static_cast<const uint16_t*>(row) + 8 * item);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(__halves2half2(__ushort_as_half(uint16_t(word(a, i))),
                                                           __ushort_as_half(uint16_t(uint32_t(word(a, i)) >> 16))));
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    }
    __device__ static float one(const void* row, int64_t i) {
        return half_bits_to_float(static_cast<const uint16_t*>(row)[i]);
    }
};
template <>
struct FTraits<GgmlType::kBF16> {
    __device__ static void load(const void* row, int64_t item, float* v) {
        const uint4 a = ld_stream16(static_cast<const uint16_t*>(row) + 8 * item);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t w = uint32_t(word(a, i));
            v[2 * i] = __uint_as_float(w << 16), v[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
        }
    }
    __device__ static float one(const void* row, int64_t i) {
        return bf16_bits_to_float(static_cast<const uint16_t*>(row)[i]);
    }
};

// Bytes of one element of a float type.
CERA_HD constexpr int float_type_bytes(GgmlType t) { return t == GgmlType::kF32 ? 4 : 2; }

}  // namespace cera::cuda
