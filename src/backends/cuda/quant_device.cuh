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
#include <type_traits>

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

// X(T) for every quantized type with traits (T a GgmlType enumerator): the launchers' type switches.
#define CERA_QUANT_TYPES(X) \
    X(kQ4_0) X(kQ4_1) X(kQ5_0) X(kQ5_1) X(kQ8_0) X(kQ2_K) X(kQ3_K) X(kQ4_K) X(kQ5_K) X(kQ6_K) X(kIQ4_NL) X(kIQ4_XS)

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
// Q2_K and Q3_K: half h (128 elements) of a block is 32 bytes of qs, byte 16 s + l (s = 0, 1; l < 16)
// holding element 128h + 32i + 16s + l in bits 2i..2i+1 (i = 0..3); Q3_K adds the third bit, bit 4h + i
// of hmask byte 16s + l. Item j (0..7) = (h, s, p) = (j >> 2, (j >> 1) & 1, j & 1): 16 bytes of qs
// and its runs i = 2p, 2p + 1 (32 elements apart), so neighbouring lanes share a load. The image
// (weight_image.cpp): q = qs (then Q3_K's hmask); m = a word with d (and Q2_K's dmin) as f16, then the
// 16 sub-block scales as bytes (Q2_K's as in the GGUF block, Q3_K's unpacked, signed): run i of
// (h, s) has scale byte 8h + 2i + s, so an item's two scales are bytes s and s + 2 of word 2h + p.
template <bool kHigh>
struct LowBitKTraits {
    static constexpr int kItems = 8, kRun = 16;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    // The item's scales (and Q2_K's mins), made when it is loaded, as QTraits<kQ4_K>::W.
    struct W {
        uint4 q, hm;
        float s0, s1, n0, n1;
    };
    __device__ static void runs(int j, int& ea, int& eb) {
        ea = 128 * (j >> 2) + 64 * (j & 1) + 16 * ((j >> 1) & 1);
        eb = ea + 32;
    }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int j) {
        const int h = j >> 2, s = (j >> 1) & 1;
        const uint8_t* mb = m + blk * 20;
        const uint32_t dm = *reinterpret_cast<const uint32_t*>(mb);
        const uint32_t sw = reinterpret_cast<const uint32_t*>(mb + 4)[2 * h + (j & 1)];
        const float d = half_bits_to_float(uint16_t(dm));
        const int c0 = byte_of(sw, s), c1 = byte_of(sw, s + 2);
        W w;
        w.q = Ld::v16(q + blk * (kHigh ? 96 : 64) + 32 * h + 16 * s);
        if constexpr (kHigh) {
            w.hm = Ld::v16(q + blk * 96 + 64 + 16 * s);
            w.s0 = d * float(int8_t(c0)), w.s1 = d * float(int8_t(c1)), w.n0 = w.n1 = 0.0f;
        } else {
            const float dmin = half_bits_to_float(uint16_t(dm >> 16));
            w.hm = make_uint4(0, 0, 0, 0);
            w.s0 = d * float(c0 & 15), w.s1 = d * float(c1 & 15);
            w.n0 = dmin * float(c0 >> 4), w.n1 = dmin * float(c1 >> 4);
        }
        return w;
    }
    // Word i (0..3) of the item: the codes of its two runs, 4 bytes each (Q3_K: 0..7, 4 over the value).
    __device__ static void item_q(const W& w, int j, int i, int& lo, int& hi) {
        const int sh = 4 * (j & 1), v = word(w.q, i);
        lo = (v >> sh) & 0x03030303, hi = (v >> (sh + 2)) & 0x03030303;
        if constexpr (kHigh) {
            const int hb = 4 * (j >> 2) + 2 * (j & 1), m = word(w.hm, i);
            lo |= ((m >> hb) & 0x01010101) << 2;
            hi |= ((m >> (hb + 1)) & 0x01010101) << 2;
        }
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
        if constexpr (kHigh) return w.s0 * x.da * float(lo - 4 * x.sa) + w.s1 * x.db * float(hi - 4 * x.sb);
        return x.da * (w.s0 * float(lo) - w.n0 * float(x.sa)) + x.db * (w.s1 * float(hi) - w.n1 * float(x.sb));
    }
    __device__ static void dequant(const W& w, int j, float* va, float* vb) {
        constexpr int kOff = kHigh ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int ql, qh;
            item_q(w, j, i, ql, qh);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                va[4 * i + b] = w.s0 * float(byte_of(uint32_t(ql), b) - kOff) - w.n0;
                vb[4 * i + b] = w.s1 * float(byte_of(uint32_t(qh), b) - kOff) - w.n1;
            }
        }
    }
};
template <>
struct QTraits<GgmlType::kQ2_K> : LowBitKTraits<false> {};
template <>
struct QTraits<GgmlType::kQ3_K> : LowBitKTraits<true> {};

// ---------------------------------------------------------------- IQ4: 4-bit codes into a 16-level table
// The levels (kIQ4NLValues, core/quant/blocks.h) as the bytes of four words.
constexpr uint32_t kIq4Levels[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};

// A byte permute (prmt.b32, the low 16 bits of s) with selector nibbles below 8: __byte_perm masks
// every runtime selector with 0x7777 first, one more instruction per call.
__device__ __forceinline__ uint32_t permute_bytes(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

// The levels of the 8 codes of v (nibble k of v): a permute from each half of the table by the code's
// low 3 bits, and one that takes, per byte, the half its bit 3 names. r0 = the levels of nibbles 0..3,
// r1 of nibbles 4..7: for a word i of an item, whose byte b holds elements 4i + b (low nibble) and
// 16 + 4i + b (high), r0 = elements 4i, 16 + 4i, 4i + 1, 16 + 4i + 1 and r1 the next two pairs
// (pair_words puts the activations in this order).
__device__ __forceinline__ void iq4_levels(uint32_t v, int& r0, int& r1) {
    const uint32_t low3 = v & 0x77777777u;
    const uint32_t half = ((v >> 1) & 0x44444444u) | 0x32103210u;
    const uint32_t lo0 = permute_bytes(kIq4Levels[0], kIq4Levels[1], low3);
    const uint32_t hi0 = permute_bytes(kIq4Levels[2], kIq4Levels[3], low3);
    const uint32_t lo1 = permute_bytes(kIq4Levels[0], kIq4Levels[1], low3 >> 16);
    const uint32_t hi1 = permute_bytes(kIq4Levels[2], kIq4Levels[3], low3 >> 16);
    r0 = int(permute_bytes(lo0, hi0, half));
    r1 = int(permute_bytes(lo1, hi1, half >> 16));
}

// An IQ4 item: 16 bytes of codes, element l in the low nibble of byte l and l + 16 in the high one
// (IQ4_NL's block, or sub-block j of IQ4_XS), with one scale: x = s * level. The activations come
// paired (kPairX).
__device__ __forceinline__ float iq4_dot(const uint4& q, float s, const XQ& x) {
    int acc = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r0, r1;
        iq4_levels(uint32_t(word(q, i)), r0, r1);
        acc = __dp4a(r1, x.b[i], __dp4a(r0, x.a[i], acc));
    }
    return s * x.da * float(acc);  // both runs lie in one 32-group
}
__device__ __forceinline__ void iq4_dequant(const uint4& q, float s, float* va, float* vb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r0, r1;
        iq4_levels(uint32_t(word(q, i)), r0, r1);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            va[4 * i + b] = s * float(int8_t(byte_of(uint32_t(r0), 2 * b)));
            vb[4 * i + b] = s * float(int8_t(byte_of(uint32_t(r0), 2 * b + 1)));
            va[4 * i + 2 + b] = s * float(int8_t(byte_of(uint32_t(r1), 2 * b)));
            vb[4 * i + 2 + b] = s * float(int8_t(byte_of(uint32_t(r1), 2 * b + 1)));
        }
    }
}

// IQ4_NL: Q4_0's layout (q = qs, m = d).
template <>
struct QTraits<GgmlType::kIQ4_NL> {
    static constexpr int kItems = 1, kRun = 16;
    static constexpr bool kPairX = true;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W {
        uint4 q;
        float d;
    };
    __device__ static void runs(int, int& ea, int& eb) { ea = 0, eb = 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int) {
        return {Ld::v16(q + blk * 16), half_bits_to_float(reinterpret_cast<const uint16_t*>(m)[blk])};
    }
    __device__ static float dot(const W& w, const XQ& x, int) { return iq4_dot(w.q, w.d, x); }
    __device__ static void dequant(const W& w, int, float* va, float* vb) { iq4_dequant(w.q, w.d, va, vb); }
};

// IQ4_XS in 32-element items, item j = sub-block j: q = the GGUF qs; m = d, scales_h, scales_l (8 bytes).
template <>
struct QTraits<GgmlType::kIQ4_XS> {
    static constexpr int kItems = 8, kRun = 16;
    static constexpr bool kPairX = true;
    using X = XQ;
    __device__ static int flip(int64_t) { return 0; }
    struct W {
        uint4 q;
        float s;
    };  // s: the sub-block's scale d * (ls - 32), made at the load
    __device__ static void runs(int j, int& ea, int& eb) { ea = 32 * j, eb = 32 * j + 16; }
    template <class Ld = GlobalLd>
    __device__ static W load_w(const uint8_t* q, const uint8_t* m, int64_t blk, int j) {
        const uint2 meta = Ld::v8(m + 8 * blk);
        const int ls = int((meta.y >> (4 * j)) & 15u) | int((meta.x >> (16 + 2 * j)) & 3u) << 4;
        return {Ld::v16(q + blk * 128 + 16 * j), half_bits_to_float(uint16_t(meta.x)) * float(ls - 32)};
    }
    __device__ static float dot(const W& w, const XQ& x, int) { return iq4_dot(w.q, w.s, x); }
    __device__ static void dequant(const W& w, int, float* va, float* vb) { iq4_dequant(w.q, w.s, va, vb); }
};

// settle_w(w): the item's values are made here, before a GEMV's PDL wait, not where the dot first
// uses them after it (an empty volatile statement, kept in order with the wait), so that their
// loads and arithmetic overlap the wait instead of following it.
template <class W>
__device__ __forceinline__ void settle_w(const W&) {}
__device__ __forceinline__ void settle_w(const QTraits<GgmlType::kQ4_K>::W& w) {
    asm volatile("" ::"f"(w.s), "f"(w.n));
}
__device__ __forceinline__ void settle_w(const LowBitKTraits<false>::W& w) {
    asm volatile("" ::"f"(w.s0), "f"(w.s1), "f"(w.n0), "f"(w.n1));
}
__device__ __forceinline__ void settle_w(const LowBitKTraits<true>::W& w) { asm volatile("" ::"f"(w.s0), "f"(w.s1)); }
__device__ __forceinline__ void settle_w(const QTraits<GgmlType::kIQ4_XS>::W& w) { asm volatile("" ::"f"(w.s)); }
// The traits a kernel takes with wide = true: 32-byte items for Q5_K, else QTraits<T>.
template <GgmlType T, bool kWide>
struct WideTraits : QTraits<T> {};
template <>
struct WideTraits<GgmlType::kQ5_K, true> : Q5kTraits<true> {};

// Traits with kPairX = true dot their words against the activations of the two runs interleaved byte
// by byte (pair_words): a[i] = bytes 0, 1 of the runs' words i, b[i] = bytes 2, 3.
template <class Tr, class = void>
struct PairX : std::false_type {};
template <class Tr>
struct PairX<Tr, std::void_t<decltype(Tr::kPairX)>> : std::bool_constant<Tr::kPairX> {};
__device__ __forceinline__ void pair_words(XQ& x) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t a = uint32_t(x.a[i]), b = uint32_t(x.b[i]);
        x.a[i] = int(permute_bytes(a, b, 0x5140u)), x.b[i] = int(permute_bytes(a, b, 0x7362u));
    }
}

// The activations of item j of block blk (Tr::runs, Tr::flip) from a row of block_elems-element
// blocks, as Tr::dot takes them.
template <class Tr, bool Shared = false>
__device__ __forceinline__ typename Tr::X load_item_x(const int8_t* xq_row, const float* xd_row, int64_t blk, int j,
                                                      int block_elems) {
    int ea, eb;
    Tr::runs(j, ea, eb);
    const int base = int(blk) * block_elems;
    auto x = load_xq<Shared, Tr::kRun / 4>(xq_row, xd_row, base + ea, base + eb, Tr::flip(blk));
    if constexpr (PairX<Tr>::value) pair_words(x);
    return x;
}

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
