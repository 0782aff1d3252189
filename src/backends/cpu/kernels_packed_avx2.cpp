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
// A tile reads a group's rows 0-7, then rows 8-15 of the same lines, from L1 the second time.
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
inline __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
// int32 lanes a, b (values within int16) -> the int16 pair (a, b) per lane, for vpmaddwd.
inline __m256i pair16(__m256i a, __m256i b) { return _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA); }
inline __m256i mad(__m256i w, __m256i x) { return _mm256_maddubs_epi16(w, x); }

// Stores the 16 row values of a group for one token; nr < 16 in the last group (padding rows).
inline void store16(float* y, __m256 lo, __m256 hi, int nr) {
    if (nr == kPackRows) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, lo);
    _mm256_store_ps(tmp + 8, hi);
    std::memcpy(y, tmp, size_t(nr) * 4);
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
template <int kOff, bool kMin, bool kHigh, int NT>
void tile_small32(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                  int nr) {
    constexpr int kLines = kHigh ? 5 : 4;
    constexpr size_t kHeader = kMin ? 128 : 64;
    constexpr size_t kPair = kHeader + 2 * kLines * 64;
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10), one = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b >> 1) * kPair;
        const int h = int(b & 1);
        const uint8_t* q = p + kHeader + size_t(h) * kLines * 64;
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            // int16 pair sums: 8 lines of 4-bit codes fit, 4 of 5-bit ones
            __m256i s16[NT][2];
            for (int t = 0; t < NT; ++t) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
            __m256i H = _mm256_setzero_si256();
            if constexpr (kHigh) H = ld(q + 256 + 32 * hf);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m256i v = ld(q + 64 * j + 32 * hf);
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
            const __m256 dw = h8(p + 32 * h + 16 * hf);
            __m256 mw = _mm256_setzero_ps();
            if constexpr (kMin) mw = h8(p + 64 + 32 * h + 16 * hf);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t) {
                __m256i si = _mm256_madd_epi16(s16[t][0], one);
                if constexpr (kHigh) si = _mm256_add_epi32(si, _mm256_madd_epi16(s16[t][1], one));
                if constexpr (kOff != 0) si = _mm256_sub_epi32(si, _mm256_set1_epi32(kOff * x.s[t][b]));
                const float xd = x.d[t][b];
                acc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(xd)), acc[t][hf]);
                if constexpr (kMin) acc[t][hf] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xd * float(x.s[t][b])), acc[t][hf]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, acc[t][0], acc[t][1], nr);
}

// ---------------------------------------------------------------- Q8_0 / IQ4_NL (kAct32)

// Signed codes: Q8_0's stored codes + 128 flipped back to int8, IQ4_NL's nibbles through the
// level table (vpshufb). One vpmaddubsw per line and token, widened at once.
template <bool kNL, int NT>
void tile_signed32(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                   int nr) {
    constexpr int kLines = kNL ? 4 : 8;
    constexpr size_t kPair = 64 + 2 * kLines * 64;
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m80 = _mm256_set1_epi8(char(0x80)), one = _mm256_set1_epi16(1);
    const __m256i lut =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b >> 1) * kPair;
        const int h = int(b & 1);
        const uint8_t* q = p + 64 + size_t(h) * kLines * 64;
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            __m256i si[NT];
            for (int t = 0; t < NT; ++t) si[t] = _mm256_setzero_si256();
            auto line = [&](__m256i w, int e) {  // w: signed codes of elements e..e+3
                const __m256i a = _mm256_abs_epi8(w);
#pragma GCC unroll 8
                for (int t = 0; t < NT; ++t) {
                    const __m256i xv = bcast32(x.q[t] + 32 * b + e);
                    si[t] = _mm256_add_epi32(si[t], _mm256_madd_epi16(mad(a, _mm256_sign_epi8(xv, w)), one));
                }
            };
            if constexpr (kNL) {
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    const __m256i v = ld(q + 64 * j + 32 * hf);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)), 4 * j);
                    line(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)), 16 + 4 * j);
                }
            } else {
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) line(_mm256_xor_si256(ld(q + 64 * j + 32 * hf), m80), 4 * j);
            }
            const __m256 dw = h8(p + 32 * h + 16 * hf);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t)
                acc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])),
                                             acc[t][hf]);
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, acc[t][0], acc[t][1], nr);
}

// ---------------------------------------------------------------- IQ4_XS (kAct32)

// Per 32-sub-block as IQ4_NL; the sub-block scale d * (ls - 32) is one multiply for 8 rows.
template <int NT>
void tile_iq4xs(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                int nr) {
    (void)nb;
    const Act32<NT> x(act, as, k);
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi16(1);
    const __m256i lut =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * 2240;
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf);
            for (int s = 0; s < 8; ++s) {
                const int64_t b = 8 * sb + s;
                __m256i si[NT];
                for (int t = 0; t < NT; ++t) si[t] = _mm256_setzero_si256();
                auto line = [&](__m256i w, int e) {
                    const __m256i a = _mm256_abs_epi8(w);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; ++t) {
                        const __m256i xv = bcast32(x.q[t] + 32 * b + e);
                        si[t] = _mm256_add_epi32(si[t], _mm256_madd_epi16(mad(a, _mm256_sign_epi8(xv, w)), one));
                    }
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
                    acc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[t]),
                                                 _mm256_mul_ps(dsc, _mm256_set1_ps(x.d[t][b])), acc[t][hf]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, acc[t][0], acc[t][1], nr);
}

// ---------------------------------------------------------------- F16 / BF16 (f32 activations)

// F16: a 32-byte line is element i of the 16 rows, two vcvtph2ps and one FMA per half and token.
// BF16: a 64-byte line is elements 2i, 2i+1 of the 16 rows; a bfloat16 is the top half of its f32,
// so the even element is the lane shifted up and the odd one the lane masked. Few tokens leave the
// FMA latency exposed, so elements are spread over kC independent chains there.
template <bool kBF, int NT>
void tile_float16(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                  int nr) {
    (void)nb;
    constexpr int kC = NT == 1 ? 4 : NT <= 2 ? 2 : 1;
    const float* x[NT];
    __m256 acc[kC][NT][2];
    for (int t = 0; t < NT; ++t) {
        x[t] = reinterpret_cast<const float*>(act + t * as);
        for (int c = 0; c < kC; ++c) acc[c][t][0] = acc[c][t][1] = _mm256_setzero_ps();
    }
    const __m256i hi16 = _mm256_set1_epi32(int(0xFFFF0000u));
    // step s: F16 element s; BF16 element pair s (odd: element 2s alone, the last of an odd k)
    auto step = [&](int c, int64_t s, bool pair) {
        __m256 w0[2], w1[2];
        if constexpr (kBF) {
            for (int hf = 0; hf < 2; ++hf) {
                const __m256i v = ld(g + 64 * size_t(s) + 32 * hf);
                w0[hf] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                w1[hf] = _mm256_castsi256_ps(_mm256_and_si256(v, hi16));
            }
        } else {
            w0[0] = h8(g + 32 * size_t(s));
            w0[1] = h8(g + 32 * size_t(s) + 16);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            const int64_t e = kBF ? 2 * s : s;
            const __m256 x0 = _mm256_set1_ps(x[t][e]);
            for (int hf = 0; hf < 2; ++hf) acc[c][t][hf] = _mm256_fmadd_ps(w0[hf], x0, acc[c][t][hf]);
            if (kBF && pair) {
                const __m256 x1 = _mm256_set1_ps(x[t][e + 1]);
                for (int hf = 0; hf < 2; ++hf) acc[c][t][hf] = _mm256_fmadd_ps(w1[hf], x1, acc[c][t][hf]);
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
            for (int hf = 0; hf < 2; ++hf) acc[0][t][hf] = _mm256_add_ps(acc[0][t][hf], acc[c][t][hf]);
        store16(y + t * ldy, acc[0][t][0], acc[0][t][1], nr);
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

// Bit `bit` (0..7) of every byte of h, moved to bit 4 (other bits: garbage to be masked off).
inline __m256i to_bit4(__m256i h, int bit) {
    return bit <= 4 ? _mm256_slli_epi16(h, 4 - bit) : _mm256_srli_epi16(h, bit - 4);
}

// Q4_K / Q5_K: 8 sub-blocks of 32, one per nibble of a group of 8 lines; Q5_K ors in the 5th bits
// from its 8 H lines (bit 2gg / 2gg+1 of line j for the low / high nibbles of line 8gg + j). The
// mins: m_s * (the activations' sum over s) as int16 pairs of sub-blocks, vpmaddwd.
template <bool kQ5, int NT>
void tile_q45k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               int nr) {
    (void)nb;
    __m256 facc[NT][2];
    for (int t = 0; t < NT; ++t) facc[t][0] = facc[t][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * (kQ5 ? 2880 : 2368);
        const ActQ8K<NT> xb(act, as, sb);
        int32_t sums[NT][4];  // the activations' sums over sub-blocks (2pp, 2pp+1), as int16 pairs
        for (int t = 0; t < NT; ++t)
            for (int pp = 0; pp < 4; ++pp) {
                const int16_t* bs = xb.b[t]->bsums + 4 * pp;
                sums[t][pp] = int32_t(uint16_t(bs[0] + bs[1])) | int32_t(uint32_t(uint16_t(bs[2] + bs[3])) << 16);
            }
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            const uint8_t* sc = p + 64 + 8 * hf;  // scales u8 [8][16], then mins
            __m256i isum[NT], ms[NT];
            for (int t = 0; t < NT; ++t) isum[t] = ms[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int pp = 0; pp < 4; ++pp) {
                const __m256i mp = pair16(u8x8(sc + 128 + 32 * pp), u8x8(sc + 128 + 32 * pp + 16));
                for (int t = 0; t < NT; ++t)
                    ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(mp, _mm256_set1_epi32(sums[t][pp])));
            }
#pragma GCC unroll 4
            for (int gg = 0; gg < 4; ++gg) {
                // int16 pair sums per sub-block: 8 lines of 4-bit codes fit, 4 of 5-bit ones
                constexpr int kS = kQ5 ? 2 : 1;
                __m256i lo[kS][NT], hi[kS][NT];
                for (int c = 0; c < kS; ++c)
                    for (int t = 0; t < NT; ++t) lo[c][t] = hi[c][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    const __m256i v = ld(p + 320 + 64 * (8 * gg + j) + 32 * hf);
                    __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if constexpr (kQ5) {
                        const __m256i H = ld(p + 2368 + 64 * j + 32 * hf);
                        wl = _mm256_or_si256(wl, _mm256_and_si256(to_bit4(H, 2 * gg), m10));
                        wh = _mm256_or_si256(wh, _mm256_and_si256(to_bit4(H, 2 * gg + 1), m10));
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
                        isum[t] = _mm256_add_epi32(
                            isum[t], _mm256_add_epi32(_mm256_madd_epi16(lo[c][t], sl), _mm256_madd_epi16(hi[c][t], sh)));
            }
            const __m256 d = h8(p + 16 * hf), dmin = h8(p + 32 + 16 * hf);
            for (int t = 0; t < NT; ++t) {
                const __m256 xd = _mm256_set1_ps(xb.b[t]->d);
                facc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, xd), facc[t][hf]);
                facc[t][hf] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]), _mm256_mul_ps(dmin, xd), facc[t][hf]);
            }
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, facc[t][0], facc[t][1], nr);
}

// Q6_K: codes q + 32 in 0..63 (two lines per int16 sum); the offset is -32 * sum_s sc_s * (the
// activations' sum over sub-block s), sub-block pairs against Q8_K's int16 sums by vpmaddwd.
template <int NT>
void tile_q6k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
              int nr) {
    (void)nb;
    __m256 facc[NT][2];
    for (int t = 0; t < NT; ++t) facc[t][0] = facc[t][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * 3392;
        const ActQ8K<NT> xb(act, as, sb);
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            __m256i scp[16];  // sub-block s's scale as the int16 pair (sc, sc) per lane
            __m256i isum[NT];
            for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
            for (int s = 0; s < 16; s += 2) {
                const __m256i a = i8x8(p + 64 + 16 * s + 8 * hf), b = i8x8(p + 64 + 16 * (s + 1) + 8 * hf);
                scp[s] = pair16(a, a);
                scp[s + 1] = pair16(b, b);
                const __m256i ab = pair16(a, b);
                for (int t = 0; t < NT; ++t)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(ab, bcast32(xb.b[t]->bsums + s)));
            }
            for (int t = 0; t < NT; ++t) isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(isum[t], 5));
#pragma GCC unroll 4
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
                        w[0] = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                        w[1] = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                        w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30));
                        w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
#pragma GCC unroll 8
                        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
                            for (int i = 0; i < 4; ++i)
                                s16[t][i] = _mm256_add_epi16(s16[t][i], mad(w[i], bcast32(xb.b[t]->qs + 4 * (h + 16 * i))));
                    }
                    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
                        for (int i = 0; i < 4; ++i)
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t][i], scp[4 * i + a]));
                }
            }
            const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf);
            for (int t = 0; t < NT; ++t)
                facc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(xb.b[t]->d)),
                                              facc[t][hf]);
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, facc[t][0], facc[t][1], nr);
}

// Q2_K / Q3_K: 16 sub-blocks of 16. Field j of code line 8n+m is elements 128n + 32j + 4m + i, so
// lines m = 0..3 (4..7) at field j are sub-block 8n + 2j (+1). Q3_K ors its 3rd bit in from H line
// m at bit 4n+j and offsets its codes by 4 (-4 * sum_s sc_s * the activations' sum over s); Q2_K's
// 4-bit scales are the low nibbles of its scale bytes and its mins the high ones (times the
// activations' sums over the sub-blocks, as int16 pairs).
template <bool kQ3, int NT>
void tile_q23k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               int nr) {
    (void)nb;
    __m256 facc[NT][2];
    for (int t = 0; t < NT; ++t) facc[t][0] = facc[t][1] = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4), m15 = _mm256_set1_epi32(15);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * (kQ3 ? 1856 : 1344);
        const ActQ8K<NT> xb(act, as, sb);
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; ++hf) {
            auto scale = [&](int s) { return kQ3 ? i8x8(p + 64 + 16 * s + 8 * hf) : u8x8(p + 64 + 16 * s + 8 * hf); };
            __m256i isum[NT], ms[NT];  // ms: Q3_K's offset or Q2_K's mins, per sub-block pair
            for (int t = 0; t < NT; ++t) isum[t] = ms[t] = _mm256_setzero_si256();
            for (int s = 0; s < 16; s += 2) {
                __m256i a = scale(s), b = scale(s + 1);
                if constexpr (!kQ3) a = _mm256_srli_epi32(a, 4), b = _mm256_srli_epi32(b, 4);
                const __m256i ab = pair16(a, b);
                for (int t = 0; t < NT; ++t)
                    ms[t] = _mm256_add_epi32(ms[t], _mm256_madd_epi16(ab, bcast32(xb.b[t]->bsums + s)));
            }
#pragma GCC unroll 2
            for (int n = 0; n < 2; ++n) {
                __m256i V[8];
                for (int m = 0; m < 8; ++m) V[m] = ld(p + 320 + 64 * (8 * n + m) + 32 * hf);
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    __m256i s16[NT][2];
                    for (int t = 0; t < NT; ++t) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int m = 0; m < 8; ++m) {
                        const __m256i lo = _mm256_srli_epi16(V[m], 2 * j);
                        __m256i w;
                        if constexpr (kQ3) {
                            const __m256i H = ld(p + 1344 + 64 * m + 32 * hf);
                            const int bit = 4 * n + j;
                            const __m256i hb = bit >= 2 ? _mm256_srli_epi16(H, bit - 2) : _mm256_slli_epi16(H, 2 - bit);
                            w = _mm256_or_si256(_mm256_and_si256(lo, m3), _mm256_and_si256(hb, m4));
                        } else {
                            w = _mm256_and_si256(lo, m3);
                        }
#pragma GCC unroll 8
                        for (int t = 0; t < NT; ++t) {
                            const int8_t* xq = xb.b[t]->qs + 128 * n + 32 * j;
                            s16[t][m / 4] = _mm256_add_epi16(s16[t][m / 4], mad(w, bcast32(xq + 16 * (m / 4) + 4 * (m % 4))));
                        }
                    }
                    const int s = 8 * n + 2 * j;
                    __m256i a = scale(s), b = scale(s + 1);
                    if constexpr (!kQ3) a = _mm256_and_si256(a, m15), b = _mm256_and_si256(b, m15);
                    const __m256i sa = pair16(a, a), sbp = pair16(b, b);
                    for (int t = 0; t < NT; ++t)
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(s16[t][0], sa),
                                                                             _mm256_madd_epi16(s16[t][1], sbp)));
                }
            }
            if constexpr (kQ3) {
                const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(p) + 8 * hf);
                for (int t = 0; t < NT; ++t) {
                    const __m256i v = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(ms[t], 2));
                    facc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(d, _mm256_set1_ps(xb.b[t]->d)),
                                                  facc[t][hf]);
                }
            } else {
                const __m256 d = h8(p + 16 * hf), dmin = h8(p + 32 + 16 * hf);
                for (int t = 0; t < NT; ++t) {
                    const __m256 xd = _mm256_set1_ps(xb.b[t]->d);
                    facc[t][hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, xd), facc[t][hf]);
                    facc[t][hf] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms[t]), _mm256_mul_ps(dmin, xd), facc[t][hf]);
                }
            }
        }
    }
    for (int t = 0; t < NT; ++t) store16(y + t * ldy, facc[t][0], facc[t][1], nr);
}

// ---------------------------------------------------------------- drivers

using TileFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t, int);

template <TileFn... Fs>
struct Tiles {
    static constexpr int kMax = sizeof...(Fs);
    static constexpr TileFn fns[kMax] = {Fs...};
};

template <class T>
void gemm_packed(const uint8_t* packed, size_t gs, int64_t g0, int64_t g1, int64_t rows, const uint8_t* act, size_t as,
                 int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    const int64_t nb = k / 32;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * kPackRows;
        const int nr = int(rows - r0 < kPackRows ? rows - r0 : kPackRows);
        for (int64_t t = t0; t < t1; t += T::kMax) {
            const int nt = int(t1 - t < T::kMax ? t1 - t : T::kMax);
            T::fns[nt - 1](packed + size_t(g) * gs, nb, act + size_t(t) * as, as, k, y + t * ldy + r0, ldy, nr);
        }
    }
}

template <template <int> class F>
using Tiles4 = Tiles<F<1>::fn, F<2>::fn, F<3>::fn, F<4>::fn>;

template <int kOff, bool kMin, bool kHigh>
struct Small32 {
    template <int NT>
    struct F {
        static constexpr TileFn fn = tile_small32<kOff, kMin, kHigh, NT>;
    };
};
template <bool kNL>
struct Signed32 {
    template <int NT>
    struct F {
        static constexpr TileFn fn = tile_signed32<kNL, NT>;
    };
};
template <int NT>
struct IQ4XS {
    static constexpr TileFn fn = tile_iq4xs<NT>;
};
template <bool kBF>
struct Float16 {
    template <int NT>
    struct F {
        static constexpr TileFn fn = tile_float16<kBF, NT>;
    };
};
template <bool kQ5>
struct Q45K {
    template <int NT>
    struct F {
        static constexpr TileFn fn = tile_q45k<kQ5, NT>;
    };
};
template <int NT>
struct Q6K {
    static constexpr TileFn fn = tile_q6k<NT>;
};
template <bool kQ3>
struct Q23K {
    template <int NT>
    struct F {
        static constexpr TileFn fn = tile_q23k<kQ3, NT>;
    };
};

}  // namespace

void add_packed_kernels_avx2(KernelTable& t) {
    auto set = [&](GgmlType type, PackedFn fn, ActFormat act) { t.packed[int(type)] = PackedKernel{fn, act}; };
    set(GgmlType::kQ4_0, gemm_packed<Tiles4<Small32<8, false, false>::F>>, ActFormat::kAct32);
    set(GgmlType::kQ4_1, gemm_packed<Tiles4<Small32<0, true, false>::F>>, ActFormat::kAct32);
    set(GgmlType::kQ5_0, gemm_packed<Tiles4<Small32<16, false, true>::F>>, ActFormat::kAct32);
    set(GgmlType::kQ5_1, gemm_packed<Tiles4<Small32<0, true, true>::F>>, ActFormat::kAct32);
    set(GgmlType::kQ8_0, gemm_packed<Tiles4<Signed32<false>::F>>, ActFormat::kAct32);
    set(GgmlType::kIQ4_NL, gemm_packed<Tiles4<Signed32<true>::F>>, ActFormat::kAct32);
    set(GgmlType::kIQ4_XS, gemm_packed<Tiles4<IQ4XS>>, ActFormat::kAct32);
    set(GgmlType::kF16, gemm_packed<Tiles4<Float16<false>::F>>, ActFormat::kF32);
    set(GgmlType::kBF16, gemm_packed<Tiles4<Float16<true>::F>>, ActFormat::kF32);
    set(GgmlType::kQ4_K, gemm_packed<Tiles4<Q45K<false>::F>>, ActFormat::kActQ8K);
    set(GgmlType::kQ5_K, gemm_packed<Tiles4<Q45K<true>::F>>, ActFormat::kActQ8K);
    set(GgmlType::kQ6_K, gemm_packed<Tiles4<Q6K>>, ActFormat::kActQ8K);
    set(GgmlType::kQ2_K, gemm_packed<Tiles4<Q23K<false>::F>>, ActFormat::kActQ8K);
    set(GgmlType::kQ3_K, gemm_packed<Tiles4<Q23K<true>::F>>, ActFormat::kActQ8K);
}

}  // namespace cera::cpu
