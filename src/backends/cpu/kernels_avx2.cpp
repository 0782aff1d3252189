// AVX2 (+FMA, F16C) kernels.
//
// Quantized matmul for the 32-block types (Q4_0, Q5_0, Q8_0) on kAct32 activations: the weight
// codes are unpacked to unsigned bytes and multiplied with the signed activation codes by
// vpmaddubsw (pairs to int16, no saturation for codes below 64) and vpmaddwd (to int32); Q8_0's
// signed codes use the sign trick (|w| x sign(x, w)). The zero offset is removed with the
// activation block sums, as in the AVX-512 kernels. Tiles of 4 rows x 4 tokens.
// Q4_1 / Q5_1 as Q4_0 / Q5_0 plus the mins (times the activation block sums); the K-quants on Q8_K
// activations (Q2_K, Q3_K and Q6_K as the AVX-512 unpacked kernels, with vpmaddubsw + vpmaddwd for
// vpdpbusd); IQ4_NL / IQ4_XS as Q8_0 with the codes looked up in the level table (vpshufb).
// F32/F16/BF16 weights: 8-wide FMAs.
// Bottleneck: as AVX-512 for decode (weight bytes / bandwidth); prefill is ~2x slower per
// instruction than VNNI (two instructions per 16 products).
// Row ops are the plain loops compiled for AVX2 (the compiler vectorizes them).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/kernel_table.h"
#include "core/quant/blocks.h"

namespace cera::cpu {
namespace {

constexpr int kMR = 4;
constexpr int kNC = 4;

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

struct WF32 {
    static __m256 load(const uint8_t* row, int64_t i) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
    }
    static float at(const uint8_t* row, int64_t i) { return reinterpret_cast<const float*>(row)[i]; }
};
struct WF16 {
    static __m256 load(const uint8_t* row, int64_t i) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    }
    static float at(const uint8_t* row, int64_t i) { return h2f(row + 2 * i); }
};
struct WBF16 {
    static __m256 load(const uint8_t* row, int64_t i) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static float at(const uint8_t* row, int64_t i) {
        uint16_t b;
        std::memcpy(&b, row + 2 * i, 2);
        uint32_t u = uint32_t(b) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

template <class W, int MR, int NC>
void tile_float(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    __m256 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 wv[MR];
        for (int r = 0; r < MR; ++r) wv[r] = W::load(w + r * ws, i);
        for (int c = 0; c < NC; ++c) {
            const __m256 xv = _mm256_loadu_ps(reinterpret_cast<const float*>(act + c * as) + i);
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    for (int c = 0; c < NC; ++c) {
        const float* x = reinterpret_cast<const float*>(act + c * as);
        for (int r = 0; r < MR; ++r) {
            float s = hsum(acc[r][c]);
            for (int64_t j = i; j < k; ++j) s += W::at(w + r * ws, j) * x[j];
            y[c * ldy + r] = s;
        }
    }
}

struct WQ4_0 {
    static constexpr size_t kBytes = sizeof(BlockQ4_0);
    static constexpr int kOffset = 8;
    static constexpr bool kMin = false;
    static constexpr bool kSigned = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    }
};
struct WQ5_0 {
    static constexpr size_t kBytes = sizeof(BlockQ5_0);
    static constexpr int kOffset = 16;
    static constexpr bool kMin = false;
    static constexpr bool kSigned = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        // spread the 32 bits to 32 bytes: byte j gets bit j
        const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                              3, 3, 3, 3, 3, 3, 3);
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)), shuf);
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
};
// Q4_1 / Q5_1: x = d * q + m; the min term m * dx * sum(activation codes) is one float FMA per
// block and (row, token), into lane 0 of the accumulator.
struct WQ4_1 {
    static constexpr size_t kBytes = sizeof(BlockQ4_1);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = true;
    static constexpr bool kSigned = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    }
};
struct WQ5_1 {
    static constexpr size_t kBytes = sizeof(BlockQ5_1);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = true;
    static constexpr bool kSigned = false;
    static __m256i codes(const uint8_t* b) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8));
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        uint32_t qh;
        std::memcpy(&qh, b + 4, 4);
        const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                              3, 3, 3, 3, 3, 3, 3);
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)), shuf);
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
};
struct WQ8_0 {
    static constexpr size_t kBytes = sizeof(BlockQ8_0);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = false;
    static constexpr bool kSigned = true;
    static __m256i codes(const uint8_t* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
};

// IQ4_NL / IQ4_XS: the nibbles through the level table to signed bytes (|level| <= 127, so the
// sign trick's pair sums stay below 2 * 127 * 127).
inline __m256i iq4_levels(__m128i q) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(lut, v);
}
struct WIQ4_NL {
    static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
    static constexpr int kOffset = 0;
    static constexpr bool kMin = false;
    static constexpr bool kSigned = true;
    static __m256i codes(const uint8_t* b) {
        return iq4_levels(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    }
};
// IQ4_XS: 32-sub-blocks inside 256-blocks, each with its own scale d * (ls - 32).
struct WIQ4_XS {
    static constexpr int kOffset = 0;
    static constexpr bool kMin = false;
    static constexpr bool kSigned = true;
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
    const __m256i ones = _mm256_set1_epi16(1);
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
        if constexpr (W::kSigned) {
            for (int r = 0; r < MR; ++r) {
                // keep |w| in wq, use the sign of w on x below
                const __m256i a = _mm256_sign_epi8(wq[r], wq[r]);
                for (int c = 0; c < NC; ++c) {
                    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + 32 * b));
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(xv, wq[r])), ones);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(wd[r], _mm256_set1_ps(xd[c][b])),
                                                acc[r][c]);
                }
            }
        } else {
            for (int c = 0; c < NC; ++c) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[c] + 32 * b));
                const __m256i init = _mm256_castsi128_si256(_mm_cvtsi32_si128(-W::kOffset * xs[c][b]));
                const __m256i init0 = _mm256_inserti128_si256(init, _mm_setzero_si128(), 1);
                const __m256 dx = _mm256_set1_ps(xd[c][b]);
                for (int r = 0; r < MR; ++r) {
                    const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xv), ones), init0);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(wd[r], dx), acc[r][c]);
                }
                if constexpr (W::kMin) {
                    const __m256 sx = _mm256_castps128_ps256(_mm_set_ss(xd[c][b] * float(xs[c][b])));
                    const __m256 sx0 = _mm256_insertf128_ps(sx, _mm_setzero_ps(), 1);
                    for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wm[r], sx0, acc[r][c]);
                }
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

// Q4_K / Q5_K on Q8_K activations: 8 sub-blocks of 32 per 256; each sub-block's codes (below 32,
// so vpmaddubsw's pair sums stay below 2 * 31 * 128) times the activation codes to int32, times the
// 6-bit sub-scale in int32, to float once per 256; the mins through Q8_K's per-16 code sums.
template <bool kQ5, int MR, int NC>
void tile_q45k(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    const int64_t nsb = k / kQK_K;
    constexpr size_t kBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    __m256 acc[MR][NC], accm[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = accm[r][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), b16 = _mm256_set1_epi8(0x10);
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
                    const __m256i q =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (kQ5 ? 48 : 16) + 32 * g));
                    __m256i q0 = _mm256_and_si256(q, low4);
                    __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    if constexpr (kQ5) {
                        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
                        const __m256i bl = _mm256_set1_epi8(char(1 << (2 * g))),
                                      bh = _mm256_set1_epi8(char(2 << (2 * g)));
                        q0 =
                            _mm256_or_si256(q0, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), b16));
                        q1 =
                            _mm256_or_si256(q1, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), b16));
                    }
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, x0), ones);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, x1), ones);
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

// 32 products of unsigned codes below 64 and signed activation codes, summed in fours to int32 (the
// pairs vpmaddubsw forms stay below 2 * 63 * 127, no saturation).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "backends/cpu/kernels_k16.h"  // tile_q23k, tile_q6k

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
template <bool kQ5>
struct Q45KTile {
    template <int MR, int NC>
    struct T {
        static void run(const uint8_t* w, size_t ws, const uint8_t* a, size_t as, int64_t k, float* y, int64_t ldy) {
            tile_q45k<kQ5, MR, NC>(w, ws, a, as, k, y, ldy);
        }
    };
};

// The int8 codes of 32 int32 in order (packs work within 128-bit lanes; the permute puts them back).
inline __m256i pack32_i8(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline int32_t hsum_i32(__m256i v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}

inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// Activation quantization, byte for byte as quantize_act_row: kAct32 (d = amax / 127, codes rounded to
// nearest even, per-32 code sums) and Q8_K (scale from the first largest magnitude, -127 at it, per-16
// code sums); BF16 through the scalar row.
void quantize_act_avx2(ActFormat f, const float* x, int64_t k, void* out) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    if (f == ActFormat::kAct32) {
        const int64_t nb = k / 32;
        auto* qs = static_cast<int8_t*>(out);
        auto* d = reinterpret_cast<float*>(qs + k);
        auto* sum = reinterpret_cast<int32_t*>(d + nb);
        for (int64_t b = 0; b < nb; ++b) {
            const float* xb = x + 32 * b;
            __m256 v[4], m = _mm256_setzero_ps();
            // max(|x|, m): a NaN |x| leaves m, as std::fmax does.
            for (int j = 0; j < 4; ++j)
                v[j] = _mm256_loadu_ps(xb + 8 * j), m = _mm256_max_ps(_mm256_and_ps(v[j], abs_mask), m);
            const float db = hmax_ps(m) / 127.0f;
            const __m256 id = _mm256_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
            __m256i q[4];
            for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), pack32_i8(q[0], q[1], q[2], q[3]));
            d[b] = db;
            sum[b] = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        }
        return;
    }
    if (f == ActFormat::kActQ8K) {
        auto* y = static_cast<BlockQ8_K*>(out);
        for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
            __m256 m = _mm256_setzero_ps();
            for (int j = 0; j < kQK_K; j += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), m);
            const float amax = hmax_ps(m);
            if (amax == 0.0f) {
                std::memset(&y[i], 0, sizeof(BlockQ8_K));
                continue;
            }
            int first = 0;
            while (std::fabs(x[first]) != amax) ++first;
            const float iscale = -127.f / x[first];
            const __m256 iv = _mm256_set1_ps(iscale);
            const __m256i top = _mm256_set1_epi32(127);
            for (int j = 0; j < kQK_K; j += 32) {
                __m256i q[4];
                for (int u = 0; u < 4; ++u)
                    q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(iv, _mm256_loadu_ps(x + j + 8 * u))), top);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j), pack32_i8(q[0], q[1], q[2], q[3]));
                y[i].bsums[j / 16] = int16_t(hsum_i32(_mm256_add_epi32(q[0], q[1])));
                y[i].bsums[j / 16 + 1] = int16_t(hsum_i32(_mm256_add_epi32(q[2], q[3])));
            }
            y[i].d = 1 / iscale;
        }
        return;
    }
    quantize_act_row(f, x, k, out);
}

void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
    if (w != nullptr)
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
}
void add_avx2(const float* a, const float* b, float scale, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + scale * b[i];
}
// LoRA up products (y += t B, B's r rows F16): four 8-column chunks of y in registers while the r rows
// of B stream past, one F16C conversion and FMA per 8 values.
void axpy_rows_f16_avx2(const uint16_t* b, int64_t ld, const float* t, int64_t r, float* y, int64_t n) {
    auto row8 = [](const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        __m256 y0 = _mm256_loadu_ps(y + c), y1 = _mm256_loadu_ps(y + c + 8);
        __m256 y2 = _mm256_loadu_ps(y + c + 16), y3 = _mm256_loadu_ps(y + c + 24);
        for (int64_t j = 0; j < r; ++j) {
            const __m256 tj = _mm256_set1_ps(t[j]);
            const uint16_t* bj = b + j * ld + c;
            y0 = _mm256_fmadd_ps(tj, row8(bj), y0);
            y1 = _mm256_fmadd_ps(tj, row8(bj + 8), y1);
            y2 = _mm256_fmadd_ps(tj, row8(bj + 16), y2);
            y3 = _mm256_fmadd_ps(tj, row8(bj + 24), y3);
        }
        _mm256_storeu_ps(y + c, y0), _mm256_storeu_ps(y + c + 8, y1);
        _mm256_storeu_ps(y + c + 16, y2), _mm256_storeu_ps(y + c + 24, y3);
    }
    for (; c + 8 <= n; c += 8) {
        __m256 acc = _mm256_loadu_ps(y + c);
        for (int64_t j = 0; j < r; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(t[j]), row8(b + j * ld + c), acc);
        _mm256_storeu_ps(y + c, acc);
    }
    if (c < n) axpy_rows_f16_ref(b + c, ld, t, r, y + c, n - c);
}
float dot_f32_avx2(const float* a, const float* b, int64_t n) {
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    float r = hsum(s);
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}
// GELU, tanh form, as x / (1 + exp(-2 y)) in double lanes, as gelu_tanh_avx512 (kernels_avx512.cpp) does and
// for the same reason; AVX2 has no scalef, so 2^n is built in the exponent field: n + 1023 lands in the
// low bits of a double with 2^52 + 2^51 added, and a shift by 52 keeps them.
void gelu_tanh_avx2(const float* x, float* y, int64_t n) {
    const __m256d k = _mm256_set1_pd(0.79788456080286535588), c = _mm256_set1_pd(0.044715);
    const __m256d lo = _mm256_set1_pd(-708.0), hi = _mm256_set1_pd(708.0), one = _mm256_set1_pd(1.0);
    const __m256d log2e = _mm256_set1_pd(1.4426950408889634074), ln2 = _mm256_set1_pd(0.69314718055994530942);
    const __m256d bias = _mm256_set1_pd(6755399441055744.0 + 1023.0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        const __m256d v3 = _mm256_mul_pd(_mm256_mul_pd(v, v), v);
        __m256d w = _mm256_mul_pd(_mm256_set1_pd(-2.0), _mm256_mul_pd(k, _mm256_fmadd_pd(c, v3, v)));
        w = _mm256_min_pd(_mm256_max_pd(w, lo), hi);
        const __m256d e2 = _mm256_round_pd(_mm256_mul_pd(w, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256d r = _mm256_fnmadd_pd(e2, ln2, w);
        __m256d p = _mm256_set1_pd(1.0 / 5040);
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 720));
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 120));
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24));
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6));
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
        p = _mm256_fmadd_pd(p, r, one);
        p = _mm256_fmadd_pd(p, r, one);
        const __m256i bits = _mm256_slli_epi64(_mm256_castpd_si256(_mm256_add_pd(e2, bias)), 52);
        const __m256d e = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
        _mm_storeu_ps(y + i, _mm256_cvtpd_ps(_mm256_div_pd(v, _mm256_add_pd(one, e))));
    }
    if (i < n) gelu_tanh_ref(x + i, y + i, n - i);
}

void softmax_avx2(float* x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

KernelTable make_table() {
    KernelTable t{};
    t.axpy_rows_f16 = axpy_rows_f16_avx2;
    t.isa = Isa::kAvx2;
    auto set = [&](GgmlType type, GemmFn fn, ActFormat act) { t.matmul[int(type)] = MatmulKernel{fn, act}; };
    set(GgmlType::kF32, gemm<FloatTile<WF32>::T>, ActFormat::kF32);
    set(GgmlType::kF16, gemm<FloatTile<WF16>::T>, ActFormat::kF32);
    set(GgmlType::kBF16, gemm<FloatTile<WBF16>::T>, ActFormat::kF32);
    set(GgmlType::kQ4_0, gemm<Q32Tile<WQ4_0>::T>, ActFormat::kAct32);
    set(GgmlType::kQ4_1, gemm<Q32Tile<WQ4_1>::T>, ActFormat::kAct32);
    set(GgmlType::kQ5_0, gemm<Q32Tile<WQ5_0>::T>, ActFormat::kAct32);
    set(GgmlType::kQ5_1, gemm<Q32Tile<WQ5_1>::T>, ActFormat::kAct32);
    set(GgmlType::kQ4_K, gemm<Q45KTile<false>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ5_K, gemm<Q45KTile<true>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ8_0, gemm<Q32Tile<WQ8_0>::T>, ActFormat::kAct32);
    set(GgmlType::kQ2_K, gemm<Q23KTile<false>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ3_K, gemm<Q23KTile<true>::T>, ActFormat::kActQ8K);
    set(GgmlType::kQ6_K, gemm<Q6KTile>, ActFormat::kActQ8K);
    set(GgmlType::kIQ4_NL, gemm<Q32Tile<WIQ4_NL>::T>, ActFormat::kAct32);
    set(GgmlType::kIQ4_XS, gemm<Q32Tile<WIQ4_XS>::T>, ActFormat::kAct32);
    t.rms_norm = rms_norm_avx2;
    t.silu_mul = silu_mul_ref;  // std::exp does not vectorize: the scalar loop is as fast
    t.add = add_avx2;
    t.dot_f32 = dot_f32_avx2;
    t.softmax = softmax_avx2;
    t.gelu_tanh = gelu_tanh_avx2;
    t.quantize_act = quantize_act_avx2;
    t.attention = cpu_attention::block_avx2;
    add_packed_kernels_avx2(t);
    return t;
}

}  // namespace

const KernelTable& kernel_table_avx2() {
    static const KernelTable t = make_table();
    return t;
}

}  // namespace cera::cpu
