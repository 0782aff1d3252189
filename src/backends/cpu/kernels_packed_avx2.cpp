// AVX2 matmul kernels on packed weights (layouts in repack.h): rows in lanes, 8 at a time.
//
// The packed image is laid out for 512-bit registers: a 64-byte line holds 4 code bytes of each of
// 16 rows. AVX2 reads a line as two 256-bit halves, rows 0-7 and rows 8-15, each row one int32
// lane, so a broadcast 4-byte activation chunk advances the dot products of 8 rows per instruction
// and a block's float work (convert, scale, accumulate) is one vector op each for 8 rows instead of
// one per row and token.
// vpdpbusd becomes vpmaddubsw (unsigned codes x signed activation codes, pairs to int16) and
// vpmaddwd (int16 pairs to int32). The int16 pairs of several lines are summed before vpmaddwd as
// far as they cannot overflow (2 * 15 * 127 per 4-bit line: 8 lines; 5 bits: 4; 6 bits: 2), and
// for the K-quants vpmaddwd multiplies by the sub-block's scale as an int16 pair per lane, so the
// scale costs no vpmulld. Signed codes (Q8_0, the IQ4 levels) take the sign trick, |w| x sign(x, w),
// one vpmaddwd per line (|w| x 127 x 2 fills an int16).
// One token (decode) takes a group's two halves in one pass; several tokens (prefill) take each
// half in its own pass (gemm_packed says why).
// Bottleneck: decode reads every weight byte once (~20 vector ops per 288 bytes of Q4_0 for 8 rows
// at one token); prefill shares the unpacked codes among the tile's tokens.
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/repack.h"
#include "core/quant/blocks.h"

namespace cera::cpu {
namespace {

inline __m256i bcast32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
inline __m256i ld(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
// 8 fp16 (one per row) to f32.
inline __m256 h8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 bytes (one per row) widened to int32 lanes.
inline __m256i u8x8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i i8x8(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// int32 lanes a, b (values within int16) -> the int16 pair (a, b) per lane, for vpmaddwd.
inline __m256i pair16(__m256i a, __m256i b) { return _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA); }
inline __m256i mad(__m256i w, __m256i x) { return _mm256_maddubs_epi16(w, x); }
// p, hidden from the optimizer: loads through it stay in the loop that makes them. A tile that reads
// the same lines in several iterations (one bit field each) would otherwise have them hoisted out
// of the loop and, with too few registers, copied to the stack and back.
template <class T>
inline const T* opaque(const T* p) {
    asm("" : "+r"(p));
    return p;
}

// Stores the 8 row values of a half group for one token; nr < 8 in the last group (padding rows).
inline void store8(float* y, __m256 v, int nr) {
    if (nr == 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::memcpy(y, tmp, size_t(nr) * 4);
}

// Stores the 8 NH row values of NH half groups for one token (nr of them real).
template <int NH>
inline void store_rows(float* y, const __m256* v, int nr) {
    store8(y, v[0], nr < 8 ? nr : 8);
    if (NH == 2 && nr > 8) store8(y + 8, v[NH - 1], nr - 8);
}

// kAct32 activation rows: codes, per-32 scales, per-32 code sums.
template <int NT>
struct Act32 {
    const int8_t* q[NT];
    const float* d[NT];
    const int32_t* s[NT];
    Act32(const uint8_t* act, size_t as, int64_t k) {
        for (int t = 0; t < NT; ++t) {
            q[t] = reinterpret_cast<const int8_t*>(act + t * as);
            d[t] = reinterpret_cast<const float*>(q[t] + k);
            s[t] = reinterpret_cast<const int32_t*>(d[t] + k / 32);
        }
    }
};

// ---------------------------------------------------------------- Q4_0 / Q4_1 / Q5_0 / Q5_1 (kAct32)

// Q4_0 is this layout with no min and no H line. 5-bit codes or in H's bit j (4+j), moved to bit 4.
// Offsets (8, 16) are removed with the activation block's code sum; mins add m * dx * that sum.
template <int kOff, bool kMin, bool kHigh, int NT, int NH>
void tile_small32(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    constexpr int kLines = kHigh ? 5 : 4;
    constexpr size_t kHeader = kMin ? 128 : 64;
    constexpr size_t kPair = kHeader + 2 * kLines * 64;
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) acc[t][u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10), one = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < k / 32; ++b) {
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const uint8_t* p = g + size_t(b >> 1) * kPair + 16 * hf;  // this half's 8 fp16 scales
            const int h = int(b & 1);
            const uint8_t* q = g + size_t(b >> 1) * kPair + kHeader + size_t(h) * kLines * 64 + 32 * hf;
            // int16 pair sums: 8 lines of 4-bit codes fit, 4 of 5-bit ones
            __m256i s16[NT][2];
            for (int t = 0; t < NT; ++t) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
            __m256i H = _mm256_setzero_si256();
            if constexpr (kHigh) H = ld(q + 256);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m256i v = ld(q + 64 * j);
                __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if constexpr (kHigh) {
                    wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi16(H, 4 - j), m10));
                    wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_srli_epi16(H, j), m10));
                }
                const int c = kHigh ? j / 2 : 0;
#pragma GCC unroll 8
                for (int t = 0; t < NT; ++t) {
                    const int8_t* xq = x.q[t] + 32 * b;
                    s16[t][c] = _mm256_add_epi16(
                        s16[t][c], _mm256_add_epi16(mad(wl, bcast32(xq + 4 * j)), mad(wh, bcast32(xq + 16 + 4 * j))));
                }
            }
            const __m256 dw = h8(p + 32 * h);
            __m256 mw = _mm256_setzero_ps();
            if constexpr (kMin) mw = h8(p + 64 + 32 * h);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t) {
                __m256i si = _mm256_madd_epi16(s16[t][0], one);
                if constexpr (kHigh) si = _mm256_add_epi32(si, _mm256_madd_epi16(s16[t][1], one));
                if constexpr (kOff != 0) si = _mm256_sub_epi32(si, _mm256_set1_epi32(kOff * x.s[t][b]));
                const float xd = x.d[t][b];
                acc[t][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(xd)), acc[t][u]);
                if constexpr (kMin) acc[t][u] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xd * float(x.s[t][b])), acc[t][u]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, acc[t], nr);
}

// ---------------------------------------------------------------- Q8_0 / IQ4_NL / IQ4_XS (kAct32)

// The dot of 4 signed codes per row (w) with 4 activation codes (xv), added to s in int32.
inline __m256i dot_signed(__m256i s, __m256i w, __m256i xv) {
    const __m256i prod = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
    return _mm256_add_epi32(s, _mm256_madd_epi16(prod, _mm256_set1_epi16(1)));
}

inline __m256i iq4_levels() {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
}

// Signed codes: Q8_0's stored codes + 128 flipped back to int8, IQ4_NL's nibbles through the
// level table (vpshufb). One vpmaddubsw per line and token, widened at once.
template <bool kNL, int NT, int NH>
void tile_signed32(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    constexpr int kLines = kNL ? 4 : 8;
    constexpr size_t kPair = 64 + 2 * kLines * 64;
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) acc[t][u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m80 = _mm256_set1_epi8(char(0x80)), lut = iq4_levels();
    for (int64_t b = 0; b < k / 32; ++b) {
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const int h = int(b & 1);
            const uint8_t* p = g + size_t(b >> 1) * kPair;
            const uint8_t* q = p + 64 + size_t(h) * kLines * 64 + 32 * hf;
            __m256i si[NT];
            for (int t = 0; t < NT; ++t) si[t] = _mm256_setzero_si256();
            auto line = [&](__m256i w, int e) {  // w: signed codes of elements e..e+3
#pragma GCC unroll 8
                for (int t = 0; t < NT; ++t) si[t] = dot_signed(si[t], w, bcast32(x.q[t] + 32 * b + e));
            };
            if constexpr (kNL) {
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    const __m256i v = ld(q + 64 * j);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)), 4 * j);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)), 16 + 4 * j);
                }
            } else {
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) line(_mm256_xor_si256(ld(q + 64 * j), m80), 4 * j);
            }
            const __m256 dw = h8(p + 32 * h + 16 * hf);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t)
                acc[t][u] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])), acc[t][u]);
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, acc[t], nr);
}

// IQ4_XS: per 32-sub-block as IQ4_NL; the sub-block scale d * (ls - 32) is one multiply for 8 rows.
template <int NT, int NH>
void tile_iq4xs(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) acc[t][u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), lut = iq4_levels();
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const uint8_t* p = g + size_t(sb) * 2240;
            const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf);
            for (int s = 0; s < 8; ++s) {
                const int64_t b = 8 * sb + s;
                __m256i si[NT];
                for (int t = 0; t < NT; ++t) si[t] = _mm256_setzero_si256();
                auto line = [&](__m256i w, int e) {
#pragma GCC unroll 8
                    for (int t = 0; t < NT; ++t) si[t] = dot_signed(si[t], w, bcast32(x.q[t] + 32 * b + e));
                };
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    const __m256i v = ld(p + 192 + 64 * (4 * s + j) + 32 * hf);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)), 4 * j);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)), 16 + 4 * j);
                }
                const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(p + 64 + 16 * s + 8 * hf)));
#pragma GCC unroll 8
                for (int t = 0; t < NT; ++t)
                    acc[t][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]),
                                                _mm256_mul_ps(dsc, _mm256_set1_ps(x.d[t][b])), acc[t][u]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, acc[t], nr);
}

// ---------------------------------------------------------------- F16 / BF16 (f32 activations)

// F16: a 32-byte line is element i of the 16 rows, one vcvtph2ps and one FMA per token for 8.
// BF16: a 64-byte line is elements 2i, 2i+1 of the 16 rows; a bfloat16 is the top half of its f32,
// so the even element is the lane shifted up and the odd one the lane masked. These tiles take all
// 16 rows at once (hf unused): the FMA chains of both halves hide each other's latency, and few
// tokens spread the elements over kC chains more.
template <bool kBF, int NT>
void tile_float16(const uint8_t* g, int hf, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    (void)hf;
    constexpr int kC = NT == 1 ? 4 : NT <= 2 ? 2 : 1;
    const float* x[NT];
    __m256 acc[kC][NT][2];
    for (int t = 0; t < NT; ++t) {
        x[t] = reinterpret_cast<const float*>(act + t * as);
        for (int c = 0; c < kC; ++c) acc[c][t][0] = acc[c][t][1] = _mm256_setzero_ps();
    }
    const __m256i hi16 = _mm256_set1_epi32(int(0xFFFF0000u));
    // step s: F16 element s; BF16 element pair s (pair false: element 2s alone, the last of an odd k)
    auto step = [&](int c, int64_t s, bool pair) {
        __m256 w0[2], w1[2];
        for (int h = 0; h < 2; ++h) {
            if constexpr (kBF) {
                const __m256i v = ld(g + 64 * size_t(s) + 32 * h);
                w0[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                w1[h] = _mm256_castsi256_ps(_mm256_and_si256(v, hi16));
            } else {
                w0[h] = h8(g + 32 * size_t(s) + 16 * h);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            const int64_t e = kBF ? 2 * s : s;
            const __m256 x0 = _mm256_set1_ps(x[t][e]);
            for (int h = 0; h < 2; ++h) acc[c][t][h] = _mm256_fmadd_ps(w0[h], x0, acc[c][t][h]);
            if (kBF && pair) {
                const __m256 x1 = _mm256_set1_ps(x[t][e + 1]);
                for (int h = 0; h < 2; ++h) acc[c][t][h] = _mm256_fmadd_ps(w1[h], x1, acc[c][t][h]);
            }
        }
    };
    const int64_t n = kBF ? k / 2 : k;
    int64_t s = 0;
    for (; s + kC <= n; s += kC)
#pragma GCC unroll 4
        for (int c = 0; c < kC; ++c) step(c, s + c, true);
    for (; s < n; ++s) step(0, s, true);
    if (kBF && k % 2 == 1) step(0, n, false);
    for (int t = 0; t < NT; ++t) {
        for (int c = 1; c < kC; ++c)
            for (int h = 0; h < 2; ++h) acc[0][t][h] = _mm256_add_ps(acc[0][t][h], acc[c][t][h]);
        store_rows<2>(y + t * ldy, acc[0][t], nr);
    }
}

// ---------------------------------------------------------------- K-quants (Q8_K activations)

template <int NT>
struct ActQ8K {
    const BlockQ8_K* b[NT];
    ActQ8K(const uint8_t* act, size_t as, int64_t sb) {
        for (int t = 0; t < NT; ++t) b[t] = reinterpret_cast<const BlockQ8_K*>(act + t * as) + sb;
    }
};

// Q4_K / Q5_K: 8 sub-blocks of 32, one per nibble of a group of 8 lines; Q5_K ors in the 5th bits
// from its 8 H lines (bit 2gg / 2gg+1 of line j for the low / high nibbles of line 8gg + j). The
// mins: m_s * (the activations' sum over s) as int16 pairs of sub-blocks, vpmaddwd.
template <bool kQ5, int NT, int NH>
void tile_q45k(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    __m256 facc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) facc[t][u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const uint8_t* p = g + size_t(sb) * (kQ5 ? 2880 : 2368);
            const uint8_t* sc = p + 64 + 8 * hf;  // scales u8 [8][16], then mins
            const ActQ8K<NT> xb(act, as, sb);
            __m256i isum[NT], ms[NT];
            for (int t = 0; t < NT; ++t) isum[t] = ms[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int pp = 0; pp < 4; ++pp) {
                const __m256i mp = pair16(u8x8(sc + 128 + 32 * pp), u8x8(sc + 128 + 32 * pp + 16));
                for (int t = 0; t < NT; ++t) {
                    // the activations' sums over sub-blocks 2pp, 2pp+1 as an int16 pair
                    const int16_t* bs = xb.b[t]->bsums + 4 * pp;
                    const int32_t pair =
                        int32_t(uint16_t(bs[0] + bs[1])) | int32_t(uint32_t(uint16_t(bs[2] + bs[3])) << 16);
                    ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(mp, _mm256_set1_epi32(pair)));
                }
            }
#pragma GCC unroll 1
            for (int gg = 0; gg < 4; ++gg) {
                // int16 pair sums per sub-block: 8 lines of 4-bit codes fit, 4 of 5-bit ones
                constexpr int kS = kQ5 ? 2 : 1;
                const __m128i hshift = _mm_cvtsi32_si128(2 * gg);
                __m256i lo[kS][NT], hi[kS][NT];
                for (int c = 0; c < kS; ++c)
                    for (int t = 0; t < NT; ++t) lo[c][t] = hi[c][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    const __m256i v = ld(p + 320 + 64 * (8 * gg + j) + 32 * hf);
                    __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if constexpr (kQ5) {
                        // bits 2gg, 2gg+1 of H to bit 0, 1, then to bit 4 of the low / high nibble's code
                        const __m256i H = _mm256_srl_epi16(ld(p + 2368 + 64 * j + 32 * hf), hshift);
                        wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi16(H, 4), m10));
                        wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_slli_epi16(H, 3), m10));
                    }
                    const int c = kQ5 ? j / 4 : 0;
#pragma GCC unroll 8
                    for (int t = 0; t < NT; ++t) {
                        const int8_t* xq = xb.b[t]->qs + 64 * gg;
                        lo[c][t] = _mm256_add_epi16(lo[c][t], mad(wl, bcast32(xq + 4 * j)));
                        hi[c][t] = _mm256_add_epi16(hi[c][t], mad(wh, bcast32(xq + 32 + 4 * j)));
                    }
                }
                const __m256i s0 = u8x8(sc + 16 * (2 * gg)), s1 = u8x8(sc + 16 * (2 * gg + 1));
                const __m256i sl = pair16(s0, s0), sh = pair16(s1, s1);
                for (int c = 0; c < kS; ++c)
                    for (int t = 0; t < NT; ++t)
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(lo[c][t], sl),
                                                                             _mm256_madd_epi16(hi[c][t], sh)));
            }
            const __m256 d = h8(p + 16 * hf), dmin = h8(p + 32 + 16 * hf);
            for (int t = 0; t < NT; ++t) {
                const __m256 xd = _mm256_set1_ps(xb.b[t]->d);
                facc[t][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, xd), facc[t][u]);
                facc[t][u] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]), _mm256_mul_ps(dmin, xd), facc[t][u]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, facc[t], nr);
}

// Q6_K: codes q + 32 in 0..63 (two lines per int16 sum); the offset is -32 * sum_s sc_s * (the
// activations' sum over sub-block s), sub-block pairs against Q8_K's int16 sums by vpmaddwd.
template <int NT, int NH>
void tile_q6k(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    __m256 facc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) facc[t][u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const uint8_t* p = g + size_t(sb) * 3392;
            const uint8_t* sc = p + 64 + 8 * hf;  // scales i8 [16][16]
            const ActQ8K<NT> xb(act, as, sb);
            __m256i isum[NT];
            for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
            for (int s = 0; s < 16; s += 2) {
                const __m256i ab = pair16(i8x8(sc + 16 * s), i8x8(sc + 16 * (s + 1)));
                for (int t = 0; t < NT; ++t)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(ab, bcast32(xb.b[t]->bsums + s)));
            }
            for (int t = 0; t < NT; ++t)
                isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(isum[t], 5));
#pragma GCC unroll 1
            for (int a = 0; a < 4; ++a) {
#pragma GCC unroll 2
                for (int hp = 0; hp < 2; ++hp) {
                    __m256i s16[NT][4];  // sub-blocks 4i + a over lines h = 4a + 2hp, +1
                    for (int t = 0; t < NT; ++t)
                        for (int i = 0; i < 4; ++i) s16[t][i] = _mm256_setzero_si256();
#pragma GCC unroll 2
                    for (int hh = 2 * hp; hh < 2 * hp + 2; ++hh) {
                        const int h = 4 * a + hh;
                        const uint8_t* l = p + 320 + 192 * h + 32 * hf;
                        const __m256i L0 = ld(l), L1 = ld(l + 64), H = ld(l + 128);
                        __m256i w[4];
                        w[0] =
                            _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                        w[1] =
                            _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                        w[2] =
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30));
                        w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
#pragma GCC unroll 8
                        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
                            for (int i = 0; i < 4; ++i)
                                s16[t][i] =
                                    _mm256_add_epi16(s16[t][i], mad(w[i], bcast32(xb.b[t]->qs + 4 * (h + 16 * i))));
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) {
                        const __m256i s = i8x8(sc + 16 * (4 * i + a));
                        const __m256i sp = pair16(s, s);
                        for (int t = 0; t < NT; ++t)
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t][i], sp));
                    }
                }
            }
            const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf);
            for (int t = 0; t < NT; ++t)
                facc[t][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(xb.b[t]->d)),
                                             facc[t][u]);
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, facc[t], nr);
}

// Q2_K / Q3_K: 16 sub-blocks of 16. Field j of code line 8n+m is elements 128n + 32j + 4m + i, so
// lines m = 0..3 (4..7) at field j are sub-block 8n + 2j (+1). Q3_K ors its 3rd bit in from H line
// m at bit 4n+j and offsets its codes by 4 (-4 * sum_s sc_s * the activations' sum over s); Q2_K's
// 4-bit scales are the low nibbles of its scale bytes and its mins the high ones (times the
// activations' sums over the sub-blocks, as int16 pairs).
template <bool kQ3, int NT, int NH>
void tile_q23k(const uint8_t* g, int hf0, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy, int nr) {
    __m256 facc[NT][NH];
    for (int t = 0; t < NT; ++t)
        for (int u = 0; u < NH; ++u) facc[t][u] = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), m15 = _mm256_set1_epi32(15);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * (kQ3 ? 1856 : 1344);
        const ActQ8K<NT> xb(act, as, sb);
        auto scale = [&](int s, int u) {
            const uint8_t* q = p + 64 + 16 * s + 8 * (hf0 + u);
            return kQ3 ? i8x8(q) : u8x8(q);
        };
        __m256i isum[NT][NH];
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            // Q3_K's offset (-4 sum_s sc_s * the activations' sum over s) starts the integer sums;
            // Q2_K's mins (the high nibbles) go into the float sums at once.
            __m256i ms[NT];
            for (int t = 0; t < NT; ++t) ms[t] = _mm256_setzero_si256();
            for (int s = 0; s < 16; s += 2) {
                __m256i a = scale(s, u), b = scale(s + 1, u);
                if constexpr (!kQ3) a = _mm256_srli_epi32(a, 4), b = _mm256_srli_epi32(b, 4);
                const __m256i ab = pair16(a, b);
                for (int t = 0; t < NT; ++t)
                    ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(ab, bcast32(xb.b[t]->bsums + s)));
            }
            const int hf = hf0 + u;
            for (int t = 0; t < NT; ++t) {
                if constexpr (kQ3) {
                    isum[t][u] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(ms[t], 2));
                } else {
                    isum[t][u] = _mm256_setzero_si256();
                    const __m256 dmin = h8(p + 32 + 16 * hf);
                    facc[t][u] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]),
                                                  _mm256_mul_ps(dmin, _mm256_set1_ps(xb.b[t]->d)), facc[t][u]);
                }
            }
        }
#pragma GCC unroll 1
        for (int n = 0; n < 2; ++n) {
#pragma GCC unroll 1
            for (int j = 0; j < 4; ++j) {
                __m256i s16[NT][NH][2];
                for (int t = 0; t < NT; ++t)
                    for (int u = 0; u < NH; ++u) s16[t][u][0] = s16[t][u][1] = _mm256_setzero_si256();
                const __m128i lshift = _mm_cvtsi32_si128(2 * j), hshift = _mm_cvtsi32_si128(4 * n + j);
                const uint8_t* pl = opaque(p);
#pragma GCC unroll 8
                for (int m = 0; m < 8; ++m) {
                    __m256i xv[NT];
                    for (int t = 0; t < NT; ++t)
                        xv[t] = bcast32(xb.b[t]->qs + 128 * n + 32 * j + 16 * (m / 4) + 4 * (m % 4));
#pragma GCC unroll 2
                    for (int u = 0; u < NH; ++u) {
                        const int hf = hf0 + u;
                        const __m256i lo = _mm256_srl_epi16(ld(pl + 320 + 64 * (8 * n + m) + 32 * hf), lshift);
                        __m256i w;
                        if constexpr (kQ3) {
                            // bit 4n+j of H to bit 0, then to bit 2 of the code
                            const __m256i hb = _mm256_srl_epi16(ld(pl + 1344 + 64 * m + 32 * hf), hshift);
                            w = _mm256_or_si256(_mm256_and_si256(lo, m3),
                                                _mm256_and_si256(_mm256_slli_epi16(hb, 2), m4));
                        } else {
                            w = _mm256_and_si256(lo, m3);
                        }
                        for (int t = 0; t < NT; ++t)
                            s16[t][u][m / 4] = _mm256_add_epi16(s16[t][u][m / 4], mad(w, xv[t]));
                    }
                }
                const int s = 8 * n + 2 * j;
#pragma GCC unroll 2
                for (int u = 0; u < NH; ++u) {
                    __m256i a = scale(s, u), b = scale(s + 1, u);
                    if constexpr (!kQ3) a = _mm256_and_si256(a, m15), b = _mm256_and_si256(b, m15);
                    const __m256i sa = pair16(a, a), sbp = pair16(b, b);
                    for (int t = 0; t < NT; ++t)
                        isum[t][u] =
                            _mm256_add_epi32(isum[t][u], _mm256_add_epi32(_mm256_madd_epi16(s16[t][u][0], sa),
                                                                          _mm256_madd_epi16(s16[t][u][1], sbp)));
                }
            }
        }
#pragma GCC unroll 2
        for (int u = 0; u < NH; ++u) {
            const int hf = hf0 + u;
            const __m256 d = kQ3 ? _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf) : h8(p + 16 * hf);
            for (int t = 0; t < NT; ++t)
                facc[t][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][u]),
                                             _mm256_mul_ps(d, _mm256_set1_ps(xb.b[t]->d)), facc[t][u]);
        }
    }
    for (int t = 0; t < NT; ++t) store_rows<NH>(y + t * ldy, facc[t], nr);
}

// ---------------------------------------------------------------- drivers

// A tile computes NT tokens of rows 8 hf .. 8 hf + 7 of the group at g, or with NH = 2 (hf 0) of
// all 16 rows; nr of them are real.
using TileFn = void (*)(const uint8_t* g, int hf, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                        int nr);

// fns[nt - 1]: the tile of nt tokens.
template <TileFn... Fs>
struct Tiles {
    static constexpr int kMax = sizeof...(Fs);
    static constexpr TileFn fns[kMax] = {Fs...};
};

// Tiles of up to kWholeUpTo tokens take both halves of a group in one pass (the integer tiles for
// one token, decode: each activation broadcast serves 16 rows and the loads of a line go together;
// the float tiles always). Larger integer tiles take each half in a separate pass: with both, the
// compiler hoists the tokens' broadcasts out of the halves' loop and spills them (the K-quant
// tiles ran at half speed).
template <class T, int kWholeUpTo>
void gemm_packed(const uint8_t* packed, size_t gs, int64_t g0, int64_t g1, int64_t rows, const uint8_t* act, size_t as,
                 int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * kPackRows;
        const int nr = int(rows - r0 < kPackRows ? rows - r0 : kPackRows);
        for (int64_t t = t0; t < t1; t += T::kMax) {
            const int nt = int(t1 - t < T::kMax ? t1 - t : T::kMax);
            const uint8_t* a = act + size_t(t) * as;
            float* yt = y + t * ldy + r0;
            if (nt <= kWholeUpTo) {
                T::fns[nt - 1](packed + size_t(g) * gs, 0, a, as, k, yt, ldy, nr);
                continue;
            }
            for (int hf = 0; hf < 2 && 8 * hf < nr; ++hf)
                T::fns[nt - 1](packed + size_t(g) * gs, hf, a, as, k, yt + 8 * hf, ldy,
                               nr - 8 * hf < 8 ? nr - 8 * hf : 8);
        }
    }
}

// The integer tiles: both halves for one token, one half for more. A family F names its tile of
// NT tokens and NH halves as F::fn<NT, NH>.
template <class F>
using IntTiles = Tiles<F::template fn<1, 2>, F::template fn<2, 1>, F::template fn<3, 1>, F::template fn<4, 1>>;

template <int kOff, bool kMin, bool kHigh>
struct Small32 {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_small32<kOff, kMin, kHigh, NT, NH>;
};
template <bool kNL>
struct Signed32 {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_signed32<kNL, NT, NH>;
};
struct IQ4XS {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_iq4xs<NT, NH>;
};
template <bool kQ5>
struct Q45K {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_q45k<kQ5, NT, NH>;
};
struct Q6K {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_q6k<NT, NH>;
};
template <bool kQ3>
struct Q23K {
    template <int NT, int NH>
    static constexpr TileFn fn = tile_q23k<kQ3, NT, NH>;
};
template <bool kBF>
using FloatTiles = Tiles<tile_float16<kBF, 1>, tile_float16<kBF, 2>, tile_float16<kBF, 3>, tile_float16<kBF, 4>>;

}  // namespace

void add_packed_kernels_avx2(KernelTable& t) {
    auto set = [&](GgmlType type, PackedFn fn, ActFormat act) { t.packed[int(type)] = PackedKernel{fn, act}; };
    set(GgmlType::kQ4_0, gemm_packed<IntTiles<Small32<8, false, false>>, 1>, ActFormat::kAct32);
    set(GgmlType::kQ4_1, gemm_packed<IntTiles<Small32<0, true, false>>, 1>, ActFormat::kAct32);
    set(GgmlType::kQ5_0, gemm_packed<IntTiles<Small32<16, false, true>>, 1>, ActFormat::kAct32);
    set(GgmlType::kQ5_1, gemm_packed<IntTiles<Small32<0, true, true>>, 1>, ActFormat::kAct32);
    set(GgmlType::kQ8_0, gemm_packed<IntTiles<Signed32<false>>, 1>, ActFormat::kAct32);
    set(GgmlType::kIQ4_NL, gemm_packed<IntTiles<Signed32<true>>, 1>, ActFormat::kAct32);
    set(GgmlType::kIQ4_XS, gemm_packed<IntTiles<IQ4XS>, 1>, ActFormat::kAct32);
    set(GgmlType::kQ4_K, gemm_packed<IntTiles<Q45K<false>>, 1>, ActFormat::kActQ8K);
    set(GgmlType::kQ5_K, gemm_packed<IntTiles<Q45K<true>>, 1>, ActFormat::kActQ8K);
    set(GgmlType::kQ6_K, gemm_packed<IntTiles<Q6K>, 1>, ActFormat::kActQ8K);
    set(GgmlType::kQ2_K, gemm_packed<IntTiles<Q23K<false>>, 1>, ActFormat::kActQ8K);
    set(GgmlType::kQ3_K, gemm_packed<IntTiles<Q23K<true>>, 1>, ActFormat::kActQ8K);
    set(GgmlType::kF16, gemm_packed<FloatTiles<false>, 4>, ActFormat::kF32);
    set(GgmlType::kBF16, gemm_packed<FloatTiles<true>, 4>, ActFormat::kF32);
}

}  // namespace cera::cpu
