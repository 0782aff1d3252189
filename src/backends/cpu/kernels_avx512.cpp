// AVX-512 (+VNNI) kernels.
//
// Quantized matmul: weights stay in their GGUF blocks and are unpacked in registers to unsigned
// 8-bit codes; activations were quantized to signed 8 bits per 32 (kAct32) or per 256 (Q8_K) by
// the driver. Each 32 products go through one vpdpbusd (u8 x s8 -> 8 int32 lanes); a weight type's
// zero offset (8 for Q4_0, 16 for Q5_0, 128 for Q8_0 whose codes are biased by 128 to make them
// unsigned) is removed by starting the accumulation at -offset * sum(activation codes), a number
// the activation quantizer stored. A 32-block is then scaled in float: acc += cvt(dot) * dw * dx.
// K-quants multiply the int32 sub-block dots by their 6/8-bit sub-scales in integers and go to
// float once per 256; the mins (Q2_K, Q4_K, Q5_K) and the offsets of Q3_K and Q6_K use Q8_K's
// per-16 code sums.
// Tiles of 4 weight rows x 4 tokens: each unpacked weight block is reused by 4 tokens and each
// activation block by 4 rows from registers.
// Bottleneck: decode (1 token) streams the weights once: bytes/bandwidth, ~33 GB/s on 2 cores
// (Q4_0 4.5 bits/weight -> 1024x4608 in ~80 us). Prefill is bound by the integer dot rate:
// one 256-bit vpdpbusd = 32 MACs plus ~3 float ops per 32-block and (row, token) pair.
// F32/F16/BF16 weights: 16-wide FMAs on f32 activations (F16 via vcvtph2ps, BF16 by a shift).
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -Wuninitialized in their own reduce/convert helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>
#include <cstring>

#include "backends/cpu/kernel_table.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/quant/blocks.h"

namespace cera::cpu {
namespace {

constexpr int kMR = 4;  // weight rows per tile
constexpr int kNC = 4;  // tokens per tile

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// ---------------------------------------------------------------- float weights

struct WF32 {
    static __m512 load(const uint8_t* row, int64_t i) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
    }
    static __m512 load_tail(const uint8_t* row, int64_t i, __mmask16 m) {
        return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
    }
};
struct WF16 {
    static __m512 load(const uint8_t* row, int64_t i) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
    }
    static __m512 load_tail(const uint8_t* row, int64_t i, __mmask16 m) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    }
};
// A bfloat16 is the top half of its f32.
struct WBF16 {
    static __m512 load(const uint8_t* row, int64_t i) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static __m512 load_tail(const uint8_t* row, int64_t i, __mmask16 m) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
};
template <class W, int MR, int NC>
void tile_float(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    __m512 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 wv[MR];
        for (int r = 0; r < MR; ++r) wv[r] = W::load(w + r * ws, i);
        for (int c = 0; c < NC; ++c) {
            const __m512 xv = _mm512_loadu_ps(reinterpret_cast<const float*>(act + c * as) + i);
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (i < k) {
        const __mmask16 m = __mmask16((1u << (k - i)) - 1);
        __m512 wv[MR];
        for (int r = 0; r < MR; ++r) wv[r] = W::load_tail(w + r * ws, i, m);
        for (int c = 0; c < NC; ++c) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act + c * as) + i);
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

// ---------------------------------------------------------------- 32-blocks (kAct32 activations)

// Each weight type: block bytes, zero offset, and its 32 codes as unsigned bytes in element order.
struct WQ4_0 {
    static constexpr size_t kBytes = sizeof(BlockQ4_0);
    static constexpr int kOffset = 8;
    static constexpr bool kMin = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
        return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    }
};
struct WQ5_0 {
    static constexpr size_t kBytes = sizeof(BlockQ5_0);
    static constexpr int kOffset = 16;
    static constexpr bool kMin = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        return _mm256_or_si256(v, _mm256_maskz_mov_epi8(__mmask32(qh), _mm256_set1_epi8(0x10)));
    }
};
// Q4_1 / Q5_1: x = d * q + m; the min term m * dx * sum(activation codes) is one float FMA per
// block and (row, token), into lane 0 of the accumulator.
struct WQ4_1 {
    static constexpr size_t kBytes = sizeof(BlockQ4_1);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = true;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
        const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
        return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    }
};
struct WQ5_1 {
    static constexpr size_t kBytes = sizeof(BlockQ5_1);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = true;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8));
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        uint32_t qh;
        std::memcpy(&qh, b + 4, 4);
        return _mm256_or_si256(v, _mm256_maskz_mov_epi8(__mmask32(qh), _mm256_set1_epi8(0x10)));
    }
};
struct WQ8_0 {
    static constexpr size_t kBytes = sizeof(BlockQ8_0);
    static constexpr int kOffset = 128;  // codes + 128 as unsigned
    static constexpr bool kMin = false;
    static __m256i codes(const uint8_t* b) {
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)),
                                _mm256_set1_epi8(char(0x80)));
    }
};

// IQ4_NL: the nibbles through the level table, plus 128 as unsigned (the offset).
inline __m256i iq4_levels(__m128i q) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_xor_si128(levels, _mm_set1_epi8(char(0x80))));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(lut, v);
}
struct WIQ4_NL {
    static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
    static constexpr int kOffset = 128;
    static constexpr bool kMin = false;
    static __m256i codes(const uint8_t* b) {
        return iq4_levels(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    }
};
// IQ4_XS: 32-sub-blocks inside 256-blocks, each with its own scale d * (ls - 32).
struct WIQ4_XS {
    static constexpr int kOffset = 128;
    static constexpr bool kMin = false;
    static constexpr bool kSuperBlocked = true;
    static const BlockIQ4_XS& block(const uint8_t* row, int64_t b) {
        return reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8];
    }
    static __m256i codes_at(const uint8_t* row, int64_t b) {
        return iq4_levels(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block(row, b).qs + 16 * (b % 8))));
    }
    static float scale_at(const uint8_t* row, int64_t b) {
        const BlockIQ4_XS& x = block(row, b);
        return _cvtsh_ss(x.d) * float(iq4_xs_scale(x, int(b % 8)) - 32);
    }
};

template <class W, int MR, int NC>
void tile_q32(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    const int64_t nb = k / 32;
    const int8_t* xq[NC];
    const float* xd[NC];
    const int32_t* xs[NC];
    for (int c = 0; c < NC; ++c) {
        xq[c] = reinterpret_cast<const int8_t*>(act + c * as);
        xd[c] = reinterpret_cast<const float*>(xq[c] + k);
        xs[c] = reinterpret_cast<const int32_t*>(xd[c] + nb);
    }
    __m256 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i wq[MR];
        __m256 wd[MR], wm[MR];
        for (int r = 0; r < MR; ++r) {
            if constexpr (requires { W::kSuperBlocked; }) {
                wq[r] = W::codes_at(w + r * ws, b);
                wd[r] = _mm256_set1_ps(W::scale_at(w + r * ws, b));
            } else {
                const uint8_t* blk = w + r * ws + b * W::kBytes;
                wq[r] = W::codes(blk);
                wd[r] = _mm256_set1_ps(h2f(blk));
                if constexpr (W::kMin) wm[r] = _mm256_set1_ps(h2f(blk + 2));
            }
        }
        for (int c = 0; c < NC; ++c) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + 32 * b));
            const __m256i init = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-W::kOffset * xs[c][b]));
            const __m256 dx = _mm256_set1_ps(xd[c][b]);
            for (int r = 0; r < MR; ++r) {
                const __m256i dot = _mm256_dpbusd_epi32(init, wq[r], xv);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(wd[r], dx), acc[r][c]);
            }
            if constexpr (W::kMin) {
                const __m256 sx = _mm256_zextps128_ps256(_mm_set_ss(xd[c][b] * float(xs[c][b])));
                for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wm[r], sx, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

// ---------------------------------------------------------------- K-quants (Q8_K activations)

// Q4_K / Q5_K: 8 sub-blocks of 32; the dots times 6-bit scales in int32, the mins through bsums.
template <bool kQ5, int MR, int NC>
void tile_q45k(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    const int64_t nsb = k / kQK_K;
    constexpr size_t kBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    __m256 acc[MR][NC], accm[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = accm[r][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t sb = 0; sb < nsb; ++sb) {
        float d[MR], dmin[MR];
        __m256i sc[MR][8];
        __m256i mins16[MR];  // int16 [m0 m0 m1 m1 ... m7 m7]: pairs with Q8_K's 16 bsums
        for (int r = 0; r < MR; ++r) {
            const uint8_t* blk = w + r * ws + sb * kBytes;
            d[r] = h2f(blk);
            dmin[r] = h2f(blk + 2);
            alignas(32) int16_t m16[16];
            for (int s = 0; s < 8; ++s) {
                uint8_t scv, mv;
                get_scale_min_k4(s, blk + 4, &scv, &mv);
                sc[r][s] = _mm256_set1_epi32(scv);
                m16[2 * s] = m16[2 * s + 1] = int16_t(mv);
            }
            mins16[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(m16));
        }
        for (int c = 0; c < NC; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_K*>(act + c * as) + sb;
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->bsums));
            __m256i isum[MR];
            for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
            for (int g = 0; g < 4; ++g) {
                const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 64 * g));
                const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 64 * g + 32));
                for (int r = 0; r < MR; ++r) {
                    const uint8_t* blk = w + r * ws + sb * kBytes;
                    const uint8_t* qs = blk + (kQ5 ? 48 : 16) + 32 * g;
                    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
                    __m256i q0 = _mm256_and_si256(q, low4);
                    __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    if constexpr (kQ5) {
                        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
                        const __m256i b16 = _mm256_set1_epi8(16);
                        q0 = _mm256_mask_add_epi8(q0, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << (2 * g)))),
                                                  q0, b16);
                        q1 = _mm256_mask_add_epi8(q1, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(2 << (2 * g)))),
                                                  q1, b16);
                    }
                    const __m256i p0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q0, x0);
                    const __m256i p1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q1, x1);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(p0, sc[r][2 * g]));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(p1, sc[r][2 * g + 1]));
                }
            }
            for (int r = 0; r < MR; ++r) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d[r] * xb->d), acc[r][c]);
                const __m256i mprod = _mm256_madd_epi16(bs, mins16[r]);
                accm[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mprod), _mm256_set1_ps(dmin[r] * xb->d), accm[r][c]);
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]) - hsum(accm[r][c]);
}

// 32 products of unsigned and signed bytes, summed in fours to int32: one vpdpbusd.
inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

#include "backends/cpu/kernels_k16.h"  // tile_q23k, tile_q6k

// ---------------------------------------------------------------- tiling driver

using TileFn = void (*)(const uint8_t*, size_t, const uint8_t*, size_t, int64_t, float*, int64_t);

template <template <int, int> class T>
struct TileSet {
    static constexpr TileFn fns[kMR][kNC] = {
        {T<1, 1>::run, T<1, 2>::run, T<1, 3>::run, T<1, 4>::run},
        {T<2, 1>::run, T<2, 2>::run, T<2, 3>::run, T<2, 4>::run},
        {T<3, 1>::run, T<3, 2>::run, T<3, 3>::run, T<3, 4>::run},
        {T<4, 1>::run, T<4, 2>::run, T<4, 3>::run, T<4, 4>::run},
    };
};

template <template <int, int> class T>
void gemm(const uint8_t* w, size_t ws, int64_t r0, int64_t r1, const uint8_t* act, size_t as, int64_t t0, int64_t t1,
          int64_t k, float* y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r += kMR) {
        const int nr = int(r1 - r < kMR ? r1 - r : kMR);
        for (int64_t t = t0; t < t1; t += kNC) {
            const int nc = int(t1 - t < kNC ? t1 - t : kNC);
            TileSet<T>::fns[nr - 1][nc - 1](w + size_t(r) * ws, ws, act + size_t(t) * as, as, k, y + t * ldy + r, ldy);
        }
    }
}

// BF16 weights on bfloat16 activations (kernel_table_avx512(true)): vdpbf16ps takes 16 pairs of weights and activations
// per instruction (the products are exact in f32; the sums round as the FMAs of tile_float do).
template <int MR, int NC>
void tile_bf16(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    __m512 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 32) {
        const __mmask32 m = k - i >= 32 ? ~__mmask32(0) : __mmask32((1u << (k - i)) - 1);
        __m512i wv[MR];
        for (int r = 0; r < MR; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, w + r * ws + 2 * i);
        for (int c = 0; c < NC; ++c) {
            const __m512i xv = _mm512_maskz_loadu_epi16(m, act + c * as + 2 * i);
            for (int r = 0; r < MR; ++r)
                acc[r][c] =
                    _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(wv[r]), reinterpret_cast<__m512bh>(xv));
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}
template <int MR, int NC>
struct BF16Tile {
    static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
        tile_bf16<MR, NC>(w, ws, a, as, k, y, ldy);
    }
};

template <class W>
struct FloatTile {
    template <int MR, int NC>
    struct T {
        static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
            tile_float<W, MR, NC>(w, ws, a, as, k, y, ldy);
        }
    };
};
template <class W>
struct Q32Tile {
    template <int MR, int NC>
    struct T {
        static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
            tile_q32<W, MR, NC>(w, ws, a, as, k, y, ldy);
        }
    };
};
template <bool kQ5>
struct Q45KTile {
    template <int MR, int NC>
    struct T {
        static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
            tile_q45k<kQ5, MR, NC>(w, ws, a, as, k, y, ldy);
        }
    };
};
template <bool kQ3>
struct Q23KTile {
    template <int MR, int NC>
    struct T {
        static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
            tile_q23k<kQ3, MR, NC>(w, ws, a, as, k, y, ldy);
        }
    };
};
template <int MR, int NC>
struct Q6KTile {
    static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
        tile_q6k<MR, NC>(w, ws, a, as, k, y, ldy);
    }
};

// ---------------------------------------------------------------- row ops

// exp(x) for x in [-88, 88]: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], degree-6 polynomial
// (relative error ~2e-7); lanes below -87.3 give 0, above 88.7 give +inf.
inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.7f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 res = _mm512_scalef_ps(p, n);
    return _mm512_mask_blend_ps(over, _mm512_mask_blend_ps(under, res, _mm512_setzero_ps()), _mm512_set1_ps(INFINITY));
}

// GELU, tanh form, as x / (1 + exp(-2 y)) with y = sqrt(2/pi) (x + 0.044715 x^3), eight lanes in double:
// for negative x a float y's rounding would be multiplied by |2 y| in the result (tens of ulps at
// x = -4), so y, the exponential's range reduction and the division stay in double, and the
// polynomial (degree 7 on |r| <= ln2 / 2, 6e-9 relative) is far inside a float's rounding. -2 y is
// clamped to [-708, 708], where exp is a normal double and the result is x, or 0 with x's sign.
void gelu_tanh_avx512(const float* x, float* y, int64_t n) {
    const __m512d k = _mm512_set1_pd(0.79788456080286535588), c = _mm512_set1_pd(0.044715);
    const __m512d lo = _mm512_set1_pd(-708.0), hi = _mm512_set1_pd(708.0), one = _mm512_set1_pd(1.0);
    const __m512d log2e = _mm512_set1_pd(1.4426950408889634074), ln2 = _mm512_set1_pd(0.69314718055994530942);
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 m = n - i >= 8 ? __mmask8(0xFF) : __mmask8((1u << (n - i)) - 1);
        const __m512d v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        const __m512d v3 = _mm512_mul_pd(_mm512_mul_pd(v, v), v);
        __m512d w = _mm512_mul_pd(_mm512_set1_pd(-2.0), _mm512_mul_pd(k, _mm512_fmadd_pd(c, v3, v)));
        w = _mm512_min_pd(_mm512_max_pd(w, lo), hi);
        const __m512d e2 = _mm512_roundscale_pd(_mm512_mul_pd(w, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512d r = _mm512_fnmadd_pd(e2, ln2, w);
        __m512d p = _mm512_set1_pd(1.0 / 5040);
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720));
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120));
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24));
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6));
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
        p = _mm512_fmadd_pd(p, r, one);
        p = _mm512_fmadd_pd(p, r, one);
        const __m512d e = _mm512_scalef_pd(p, e2);
        _mm256_mask_storeu_ps(y + i, m, _mm512_cvtpd_ps(_mm512_div_pd(v, _mm512_add_pd(one, e))));
    }
}

void rms_norm_avx512(const float* x, const float* w, float* y, int64_t n, float eps) {
    __m512 ss = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    if (i < n) {
        const __m512 v = _mm512_maskz_loadu_ps(__mmask16((1u << (n - i)) - 1), x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const float scale = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / float(n) + eps);
    const __m512 sv = _mm512_set1_ps(scale);
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv);
        if (w != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

void silu_mul_avx512(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(s, uv));
    }
}

void add_avx512(const float* a, const float* b, float scale, float* y, int64_t n) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, b + i), sv, _mm512_maskz_loadu_ps(m, a + i)));
    }
}

// Four 16-column chunks of y in registers while the r rows of b stream past (one f16 load, conversion
// and FMA per 16 values).
void axpy_rows_f16_avx512(const uint16_t* b, int64_t ld, const float* t, int64_t r, float* y, int64_t n) {
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m512 y0 = _mm512_loadu_ps(y + c), y1 = _mm512_loadu_ps(y + c + 16);
        __m512 y2 = _mm512_loadu_ps(y + c + 32), y3 = _mm512_loadu_ps(y + c + 48);
        for (int64_t j = 0; j < r; ++j) {
            const __m512 tj = _mm512_set1_ps(t[j]);
            const uint16_t* bj = b + j * ld + c;
            y0 = _mm512_fmadd_ps(tj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)bj)), y0);
            y1 = _mm512_fmadd_ps(tj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(bj + 16))), y1);
            y2 = _mm512_fmadd_ps(tj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(bj + 32))), y2);
            y3 = _mm512_fmadd_ps(tj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(bj + 48))), y3);
        }
        _mm512_storeu_ps(y + c, y0), _mm512_storeu_ps(y + c + 16, y1);
        _mm512_storeu_ps(y + c + 32, y2), _mm512_storeu_ps(y + c + 48, y3);
    }
    for (; c < n; c += 16) {
        const __mmask16 m = n - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - c)) - 1);
        __m512 acc = _mm512_maskz_loadu_ps(m, y + c);
        for (int64_t j = 0; j < r; ++j)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(t[j]), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, b + j * ld + c)),
                                  acc);
        _mm512_mask_storeu_ps(y + c, m, acc);
    }
}

float dot_f32_avx512(const float* a, const float* b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void softmax_avx512(float* x, int64_t n) {
    if (n <= 0) return;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
    }
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv));
        _mm512_mask_storeu_ps(x + i, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

// Activation quantization, byte for byte as quantize_act_row: kAct32 (d = amax / 127, codes
// rounded to nearest even, per-32 code sums) and Q8_K (scale from the first largest magnitude,
// -127 at it, per-16 code sums).
void quantize_act_avx512(ActFormat f, const float* x, int64_t k, void* out) {
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    if (f == ActFormat::kAct32) {
        const int64_t nb = k / 32;
        auto* qs = static_cast<int8_t*>(out);
        auto* d = reinterpret_cast<float*>(qs + k);
        auto* sum = reinterpret_cast<int32_t*>(d + nb);
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            const __m512 iv = _mm512_set1_ps(id);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
            d[b] = db;
            sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
        return;
    }
    if (f == ActFormat::kBF16) {
        auto* h = static_cast<uint16_t*>(out);
        int64_t i = 0;
        for (; i + 32 <= k; i += 32) {
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
            _mm512_storeu_si512(h + i, reinterpret_cast<__m512i>(v));
        }
        for (; i < k; ++i) h[i] = bf16_act(x[i]);
        if (k % 2 != 0) h[k] = 0;
        return;
    }
    if (f == ActFormat::kActQ8K) {
        auto* y = static_cast<BlockQ8_K*>(out);
        for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
            __m512 m = _mm512_setzero_ps();
            for (int j = 0; j < kQK_K; j += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(x + j), sign));
            const float amax = _mm512_reduce_max_ps(m);
            if (amax == 0.0f) {
                std::memset(&y[i], 0, sizeof(BlockQ8_K));
                continue;
            }
            int first = 0;
            while (std::fabs(x[first]) != amax) ++first;
            const float iscale = -127.f / x[first];
            const __m512 iv = _mm512_set1_ps(iscale);
            for (int j = 0; j < kQK_K; j += 16) {
                __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(iv, _mm512_loadu_ps(x + j)));
                q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + j), _mm512_cvtsepi32_epi8(q));
                y[i].bsums[j / 16] = int16_t(_mm512_reduce_add_epi32(q));
            }
            y[i].d = 1 / iscale;
        }
        return;
    }
    quantize_act_row(f, x, k, out);
}

KernelTable make_table(bool bf16_dot) {
    KernelTable t{};
    t.isa = Isa::kAvx512;
    auto set = [&](GgmlType type, GemmFn fn, ActFormat act) { t.matmul[int(type)] = MatmulKernel{fn, act}; };
    set(GgmlType::kF32, gemm<FloatTile<WF32>::T>, ActFormat::kF32);
    set(GgmlType::kF16, gemm<FloatTile<WF16>::T>, ActFormat::kF32);
    if (bf16_dot)
        set(GgmlType::kBF16, gemm<BF16Tile>, ActFormat::kBF16);
    else
        set(GgmlType::kBF16, gemm<FloatTile<WBF16>::T>, ActFormat::kF32);
    set(GgmlType::kQ4_0, gemm<Q32Tile<WQ4_0>::T>, ActFormat::kAct32);
    set(GgmlType::kQ4_1, gemm<Q32Tile<WQ4_1>::T>, ActFormat::kAct32);
    set(GgmlType::kQ5_0, gemm<Q32Tile<WQ5_0>::T>, ActFormat::kAct32);
    set(GgmlType::kQ5_1, gemm<Q32Tile<WQ5_1>::T>, ActFormat::kAct32);
    set(GgmlType::kQ8_0, gemm<Q32Tile<WQ8_0>::T>, ActFormat::kAct32);
    set(GgmlType::kIQ4_NL, gemm<Q32Tile<WIQ4_NL>::T>, ActFormat::kAct32);
    set(GgmlType::kIQ4_XS, gemm<Q32Tile<WIQ4_XS>::T>, ActFormat::kAct32);
    set(GgmlType::kQ4_K, gemm<Q45KTile<false>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ5_K, gemm<Q45KTile<true>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ6_K, gemm<Q6KTile>, ActFormat::kActQ8K);
    set(GgmlType::kQ2_K, gemm<Q23KTile<false>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ3_K, gemm<Q23KTile<true>::T>, ActFormat::kActQ8K);
    add_packed_kernels_avx512(t, bf16_dot);
    t.rms_norm = rms_norm_avx512;
    t.silu_mul = silu_mul_avx512;
    t.add = add_avx512;
    t.axpy_rows_f16 = axpy_rows_f16_avx512;
    t.dot_f32 = dot_f32_avx512;
    t.softmax = softmax_avx512;
    t.gelu_tanh = gelu_tanh_avx512;
    t.quantize_act = quantize_act_avx512;
    t.attention = cpu_attention::block_avx512;
    return t;
}

}  // namespace

const KernelTable& kernel_table_avx512(bool bf16_dot) {
    CERA_CHECK(!bf16_dot || cpu_features().avx512bf16, "kernel_table_avx512: this CPU has no AVX512_BF16");
    static const KernelTable dot = make_table(true), fma = make_table(false);
    return bf16_dot ? dot : fma;
}

const KernelTable& kernel_table_avx512() {
    const CpuFeatures& f = cpu_features();
    static const KernelTable& t = kernel_table_avx512(f.avx512bf16 && f.amd);
    return t;
}

const KernelTable& kernel_table_amx() {
    CERA_CHECK(cpu_features().amx_bf16, "kernel_table_amx: this CPU or OS gives no AMX-BF16");
    static const KernelTable t = [] {
        KernelTable a = make_table(false);
        a.isa = Isa::kAmx;
        add_amx_kernels(a);
        return a;
    }();
    return t;
}

}  // namespace cera::cpu
