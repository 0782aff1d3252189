// AVX-512 VNNI matmul kernels on packed weights (layouts in repack.h): rows in lanes.
//
// Idea: a 64-byte line of the packed image holds 4 code bytes of each of 16 rows, so one 512-bit
// vpdpbusd against the matching 4 activation codes (one broadcast dword) advances the dot products
// of all 16 rows; a block's row sums end in one int32 lane per row, and the block's float work
// (convert, scale by the 16 rows' scales times the token's scale, accumulate) is 3 vector ops for
// 16 rows instead of 3 per row. Weights are unpacked once per block and reused by up to 8 tokens
// from registers (NT tokens per tile); zero offsets are the accumulators' start values
// (-offset * the activation block's code sum); K-quant sub-block scales multiply the int32 sums.
// Variants: F16 on f32 activations, BF16 on f32 or bfloat16 activations (kernel_table_avx512); Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, IQ4_NL and IQ4_XS on kAct32 activations; Q2_K, Q3_K, Q4_K, Q5_K and Q6_K on Q8_K activations. Bottleneck:
// decode (1 token) reads each weight byte once: ~24 vector ops per 288 bytes of Q4_0, well under what 16.5 GB/s per
// core (half of the ~33 GB/s two-core roofline) needs. Prefill: per block and token 8 vpdpbusd (512 MACs) + 3 float
// ops, plus 12 unpack ops per block shared by the token tile: ~40 MAC/cycle per core on Zen 4 (double-pumped 512-bit)
// vs ~16 for 4x4 row tiles.
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -Wuninitialized in their own reduce/convert helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/repack.h"
#include "core/quant/blocks.h"

namespace cera::cpu {
namespace {

inline __m512i bcast32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// The 16 levels of IQ4_NL / IQ4_XS plus 128, in every 128-bit lane: vpshufb maps a nibble to its
// level as an unsigned byte for vpdpbusd, and the accumulators start at -128 * the activation sum.
inline __m512i iq4_lut() {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    return _mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(char(0x80))));
}

// ---------------------------------------------------------------- Q4_0 / Q8_0 / IQ4_NL (kAct32)

enum class Q32 { kQ4_0, kQ8_0, kIQ4_NL };

template <Q32 kType, int NT>
void tile_q32(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
              __mmask16 rmask) {
    constexpr bool kQ8 = kType == Q32::kQ8_0, kNL = kType == Q32::kIQ4_NL;
    constexpr int kLines = kQ8 ? 8 : 4;
    constexpr size_t kPair = 64 + 2 * kLines * 64;
    constexpr int kOff = kType == Q32::kQ4_0 ? 8 : 128;
    const int8_t* xq[NT];
    const float* xd[NT];
    const int32_t* xs[NT];
    __m512 acc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        xq[t] = reinterpret_cast<const int8_t*>(act + t * as);
        xd[t] = reinterpret_cast<const float*>(xq[t] + k);
        xs[t] = reinterpret_cast<const int32_t*>(xd[t] + nb);
        acc[t] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = kNL ? iq4_lut() : _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b >> 1) * kPair;
        const int h = int(b & 1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * h)));
        const uint8_t* q = p + 64 + size_t(h) * kLines * 64;
        __m512i w[8];
        if constexpr (kQ8) {
#pragma GCC unroll 16
            for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(q + 64 * j);
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_load_si512(q + 64 * j);
                w[j] = _mm512_and_si512(v, m4);
                w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if constexpr (kNL) {
                    w[j] = _mm512_shuffle_epi8(lut, w[j]);
                    w[4 + j] = _mm512_shuffle_epi8(lut, w[4 + j]);
                }
            }
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
            const int8_t* x = xq[t] + 32 * b;
            __m512i s0 = _mm512_set1_epi32(-kOff * xs[t][b]);
            __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int j = 0; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[j], bcast32(x + 4 * j));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], bcast32(x + 4 * j + 4));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(xd[t][b])), acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, acc[t]);
}

// ---------------------------------------------------------------- Q4_1 / Q5_0 / Q5_1 (kAct32)

// Q4_0's nibble lines, plus for the 5-bit types one line H per block whose bit j (4+j) is the 5th
// bit of line j's low (high) nibbles: shifted into bit 4 and or-ed in by one ternary-logic op.
// Q5_0's offset 16 starts the accumulators as Q4_0's 8 does; the mins of Q4_1 / Q5_1 add
// m * dx * sum(activation codes) per block, one FMA for the 16 rows.
template <int kOff, bool kMin, bool kHigh, int NT>
void tile_small32(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                  __mmask16 rmask) {
    constexpr int kLines = kHigh ? 5 : 4;
    constexpr size_t kHeader = kMin ? 128 : 64;
    constexpr size_t kPair = kHeader + 2 * kLines * 64;
    const int8_t* xq[NT];
    const float* xd[NT];
    const int32_t* xs[NT];
    __m512 acc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        xq[t] = reinterpret_cast<const int8_t*>(act + t * as);
        xd[t] = reinterpret_cast<const float*>(xq[t] + k);
        xs[t] = reinterpret_cast<const int32_t*>(xd[t] + nb);
        acc[t] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = g + size_t(b >> 1) * kPair;
        const int h = int(b & 1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * h)));
        __m512 mw;
        if constexpr (kMin) mw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 + 32 * h)));
        const uint8_t* q = p + kHeader + size_t(h) * kLines * 64;
        __m512i w[8];
        if constexpr (kHigh) {
            const __m512i H = _mm512_load_si512(q + 256);
#pragma GCC unroll 16
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_load_si512(q + 64 * j);
                w[j] = _mm512_ternarylogic_epi32(v, m4, _mm512_and_si512(_mm512_slli_epi16(H, 4 - j), m10), 0xEA);
                w[4 + j] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4,
                                                     _mm512_and_si512(_mm512_srli_epi16(H, j), m10), 0xEA);
            }
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_load_si512(q + 64 * j);
                w[j] = _mm512_and_si512(v, m4);
                w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
            const int8_t* x = xq[t] + 32 * b;
            __m512i s0 = kOff != 0 ? _mm512_set1_epi32(-kOff * xs[t][b]) : _mm512_setzero_si512();
            __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int j = 0; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[j], bcast32(x + 4 * j));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], bcast32(x + 4 * j + 4));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(xd[t][b])), acc[t]);
            if constexpr (kMin) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xd[t][b] * float(xs[t][b])), acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, acc[t]);
}

// ---------------------------------------------------------------- F16 (f32 activations)

// One 32-byte line is element i of the 16 rows: converted to 16 floats (vcvtph2ps), then one FMA
// per token against the broadcast x[i]. The activations stay f32, so the products are those of the
// unpacked kernel. Few tokens leave the FMA latency exposed, so elements are spread over kC
// independent chains there.
template <int NT>
void tile_half(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               __mmask16 rmask) {
    (void)nb;
    constexpr int kC = NT == 1 ? 4 : NT <= 3 ? 2 : 1;
    const float* x[NT];
    __m512 acc[kC][NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        x[t] = reinterpret_cast<const float*>(act + t * as);
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) acc[c][t] = _mm512_setzero_ps();
    }
    auto wline = [&](int64_t i) {
        return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g + 32 * size_t(i))));
    };
    int64_t i = 0;
    for (; i + kC <= k; i += kC) {
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) {
            const __m512 w = wline(i + c);
#pragma GCC unroll 16
            for (int t = 0; t < NT; ++t) acc[c][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[t][i + c]), acc[c][t]);
        }
    }
    for (; i < k; ++i) {
        const __m512 w = wline(i);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[0][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[t][i]), acc[0][t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        __m512 s = acc[0][t];
#pragma GCC unroll 16
        for (int c = 1; c < kC; ++c) s = _mm512_add_ps(s, acc[c][t]);
        _mm512_mask_storeu_ps(y + t * ldy, rmask, s);
    }
}

// ---------------------------------------------------------------- BF16

// One 64-byte line is elements 2s, 2s+1 of the 16 rows. A bfloat16 is the top half of its f32, so the
// even element is the lane shifted up and the odd one the lane masked: two f32 FMAs per token, as
// F16's two lines take, on the exact f32 activations. Each element of the pair has its own
// accumulators, so that the two FMAs of a step do not wait on each other.
template <int NT>
void tile_bf16(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               __mmask16 rmask) {
    (void)nb;
    constexpr int kC = NT == 1 ? 2 : 1;
    const float* x[NT];
    __m512 acc[kC][NT][2];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        x[t] = reinterpret_cast<const float*>(act + t * as);
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) acc[c][t][0] = acc[c][t][1] = _mm512_setzero_ps();
    }
    const __m512i hi16 = _mm512_set1_epi32(int(0xFFFF0000u));
    // pair false: element 2s alone, the last of an odd k
    auto step = [&](int c, int64_t s, bool pair) {
        const __m512i v = _mm512_load_si512(g + 64 * size_t(s));
        const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(v, hi16));
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
            acc[c][t][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[t][2 * s]), acc[c][t][0]);
            if (pair) acc[c][t][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[t][2 * s + 1]), acc[c][t][1]);
        }
    };
    const int64_t n = k / 2;
    int64_t s = 0;
    for (; s + kC <= n; s += kC)
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) step(c, s + c, true);
    for (; s < n; ++s) step(0, s, true);
    if (k % 2 == 1) step(0, n, false);
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        __m512 sum = _mm512_add_ps(acc[0][t][0], acc[0][t][1]);
#pragma GCC unroll 16
        for (int c = 1; c < kC; ++c) sum = _mm512_add_ps(sum, _mm512_add_ps(acc[c][t][0], acc[c][t][1]));
        _mm512_mask_storeu_ps(y + t * ldy, rmask, sum);
    }
}

// On bfloat16 activations (the AVX512_BF16 path, kernel_table.h): one vdpbf16ps per line and token
// against the broadcast activation pair, 32 products an instruction.
template <int NT>
void tile_bf16_dot(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                   __mmask16 rmask) {
    (void)nb;
    constexpr int kC = NT == 1 ? 4 : NT <= 3 ? 2 : 1;
    const uint8_t* x[NT];
    __m512 acc[kC][NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        x[t] = act + t * as;
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) acc[c][t] = _mm512_setzero_ps();
    }
    const int64_t np = (k + 1) / 2;
    auto step = [&](int c, int64_t i) {
        const __m512bh w = reinterpret_cast<__m512bh>(_mm512_load_si512(g + 64 * size_t(i)));
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
            acc[c][t] = _mm512_dpbf16_ps(acc[c][t], w, reinterpret_cast<__m512bh>(bcast32(x[t] + 4 * i)));
    };
    int64_t i = 0;
    for (; i + kC <= np; i += kC)
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) step(c, i + c);
    for (; i < np; ++i) step(0, i);
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        __m512 s = acc[0][t];
#pragma GCC unroll 16
        for (int c = 1; c < kC; ++c) s = _mm512_add_ps(s, acc[c][t]);
        _mm512_mask_storeu_ps(y + t * ldy, rmask, s);
    }
}

// ---------------------------------------------------------------- Q4_K / Q5_K (Q8_K activations)

// Bit `bit` (0..7) of every byte of h, moved to bit 4 (other bits: garbage to be masked off).
inline __m512i to_bit4(__m512i h, int bit) {
    return bit <= 4 ? _mm512_slli_epi16(h, unsigned(4 - bit)) : _mm512_srli_epi16(h, unsigned(bit - 4));
}

// Q5_K: Q4_K's kernel with the 5th bits of each code line (8 H lines per super-block) shifted to
// bit 4 and or-ed in.

template <bool kQ5, int NT>
void tile_q45k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               __mmask16 rmask) {
    const int64_t nsb = k / kQK_K;
    (void)nb;
    __m512 facc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) facc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i b16 = _mm512_set1_epi8(16);
    for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* p = g + size_t(sb) * (kQ5 ? 2880 : 2368);
        const BlockQ8_K* xb[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) xb[t] = reinterpret_cast<const BlockQ8_K*>(act + t * as) + sb;
        // header first (d, dmin, scales, mins: the lines before the codes), so reads go forward
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)));
        const __m512i sc_raw[2] = {_mm512_load_si512(p + 64), _mm512_load_si512(p + 128)};
        __m512i mpair[4];  // int16 pairs (m[2pp], m[2pp+1]) per row, for vpmaddwd with the code sums
#pragma GCC unroll 4
        for (int pp = 0; pp < 4; ++pp) {
            const __m512i a = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 192 + 32 * pp)));
            const __m512i b =
                _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 192 + 32 * pp + 16)));
            mpair[pp] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
            // per-32 code sums of the activations as int16 pairs (sub-blocks 2pp, 2pp+1)
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[t]->bsums));
            const __m128i s16 = _mm256_cvtepi32_epi16(_mm256_madd_epi16(bs, _mm256_set1_epi16(1)));
            alignas(16) int32_t pw[4];
            _mm_store_si128(reinterpret_cast<__m128i*>(pw), s16);
            __m512i ms = _mm512_madd_epi16(mpair[0], _mm512_set1_epi32(pw[0]));
#pragma GCC unroll 16
            for (int pp = 1; pp < 4; ++pp)
                ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mpair[pp], _mm512_set1_epi32(pw[pp])));
            facc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, _mm512_set1_ps(xb[t]->d)), facc[t]);
        }
        __m512i isum[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int gg = 0; gg < 4; ++gg) {
            // two chains per sub-block when the tile has few tokens (latency of dependent vpdpbusd)
            constexpr int kC = NT <= 2 ? 2 : 1;
            __m512i lo[kC][NT], hi[kC][NT];
#pragma GCC unroll 16
            for (int c = 0; c < kC; ++c)
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) lo[c][t] = hi[c][t] = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int j = 0; j < 8; ++j) {
                const __m512i v = _mm512_load_si512(p + 320 + 64 * (8 * gg + j));
                __m512i wl, wh;
                if constexpr (kQ5) {
                    // bit 2gg (2gg+1) of H moved to bit 4 and or-ed into the low (high) nibble
                    const __m512i H = _mm512_load_si512(p + 2368 + 64 * j);
                    wl = _mm512_ternarylogic_epi32(v, m4, _mm512_and_si512(to_bit4(H, 2 * gg), b16), 0xEA);
                    wh = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4,
                                                   _mm512_and_si512(to_bit4(H, 2 * gg + 1), b16), 0xEA);
                } else {
                    // High nibbles stay in place (16x their value): their sums shift down once a sub-block.
                    wl = _mm512_and_si512(v, m4);
                    wh = _mm512_andnot_si512(m4, v);
                }
                const int c = j % kC;
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) {
                    const int8_t* x = xb[t]->qs + 64 * gg;
                    lo[c][t] = _mm512_dpbusd_epi32(lo[c][t], wl, bcast32(x + 4 * j));
                    hi[c][t] = _mm512_dpbusd_epi32(hi[c][t], wh, bcast32(x + 32 + 4 * j));
                }
            }
            if constexpr (kC == 2) {
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) {
                    lo[0][t] = _mm512_add_epi32(lo[0][t], lo[1][t]);
                    hi[0][t] = _mm512_add_epi32(hi[0][t], hi[1][t]);
                }
            }
            if constexpr (!kQ5) {
                // Exact: every product is a multiple of 16, and |sum| <= 32 * 240 * 128 fits.
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) hi[0][t] = _mm512_srai_epi32(hi[0][t], 4);
            }
            const __m512i sl = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(sc_raw[gg / 2], 2 * (gg % 2)));
            const __m512i sh = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(sc_raw[gg / 2], 2 * (gg % 2) + 1));
#pragma GCC unroll 16
            for (int t = 0; t < NT; ++t)
                isum[t] = _mm512_add_epi32(
                    isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[0][t], sl), _mm512_mullo_epi32(hi[0][t], sh)));
        }
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, _mm512_set1_ps(xb[t]->d)), facc[t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, facc[t]);
}

// ---------------------------------------------------------------- Q6_K (Q8_K activations)

template <int NT>
void tile_q6k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
              __mmask16 rmask) {
    const int64_t nsb = k / kQK_K;
    (void)nb;
    __m512 facc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) facc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* p = g + size_t(sb) * 3392;
        const BlockQ8_K* xb[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) xb[t] = reinterpret_cast<const BlockQ8_K*>(act + t * as) + sb;
        __m512i isum[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int a = 0; a < 4; ++a) {
            // sub-blocks 4i + a, i = 0..3; codes are q + 32: start at -32 * the sub-block's code sum
            __m512i acc[NT][4];
#pragma GCC unroll 16
            for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
                for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_set1_epi32(-32 * int32_t(xb[t]->bsums[4 * i + a]));
#pragma GCC unroll 16
            for (int hh = 0; hh < 4; ++hh) {
                const int h = 4 * a + hh;
                const __m512i L0 = _mm512_load_si512(p + 320 + 192 * h);
                const __m512i L1 = _mm512_load_si512(p + 320 + 192 * h + 64);
                const __m512i H = _mm512_load_si512(p + 320 + 192 * h + 128);
                __m512i w[4];
                w[0] = _mm512_ternarylogic_epi32(L0, m4, _mm512_and_si512(_mm512_slli_epi16(H, 4), m30), 0xEA);
                w[1] = _mm512_ternarylogic_epi32(L1, m4, _mm512_and_si512(_mm512_slli_epi16(H, 2), m30), 0xEA);
                w[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L0, 4), m4, _mm512_and_si512(H, m30), 0xEA);
                w[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L1, 4), m4,
                                                 _mm512_and_si512(_mm512_srli_epi16(H, 2), m30), 0xEA);
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t)
#pragma GCC unroll 16
                    for (int i = 0; i < 4; ++i)
                        acc[t][i] = _mm512_dpbusd_epi32(acc[t][i], w[i], bcast32(xb[t]->qs + 4 * (h + 16 * i)));
            }
#pragma GCC unroll 16
            for (int i = 0; i < 4; ++i) {
                const __m512i sc =
                    _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * (4 * i + a))));
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc[t][i], sc));
            }
        }
        const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(p));
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, _mm512_set1_ps(xb[t]->d)), facc[t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, facc[t]);
}

// ---------------------------------------------------------------- Q2_K / Q3_K (Q8_K activations)

// 16 sub-blocks of 16. A code line holds 4 bytes of 4 2-bit fields per row: field j of line 8n+m is
// elements 128n + 32j + 4m + i, so the 4 lines m = 4q..4q+3 at one field are sub-block 8n + 2j + q,
// one vpdpbusd chain each. Q3_K ors its 3rd bit in from the H line m at bit 4n+j and offsets the
// codes by 4 (the chains start at -4 * the sub-block's activation sum); Q2_K's mins go through
// Q8_K's per-16 sums as int16 pairs (vpmaddwd). The sub-block scales multiply the chains in int32.
template <bool kQ3, int NT>
void tile_q23k(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
               __mmask16 rmask) {
    (void)nb;
    __m512 facc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) facc[t] = _mm512_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4), m15 = _mm512_set1_epi32(15);
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * (kQ3 ? 1856 : 1344);
        const BlockQ8_K* xb[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) xb[t] = reinterpret_cast<const BlockQ8_K*>(act + t * as) + sb;
        auto scale_bytes = [&](int s) {
            const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * s));
            return kQ3 ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
        };
        if constexpr (!kQ3) {
            // the mins: sum over sub-blocks of m_s * (the activations' sum over s), as int16 pairs
            __m512i mpair[8];
#pragma GCC unroll 8
            for (int pp = 0; pp < 8; ++pp)
                mpair[pp] = _mm512_or_si512(_mm512_srli_epi32(scale_bytes(2 * pp), 4),
                                            _mm512_slli_epi32(_mm512_srli_epi32(scale_bytes(2 * pp + 1), 4), 16));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)));
#pragma GCC unroll 16
            for (int t = 0; t < NT; ++t) {
                __m512i ms = _mm512_madd_epi16(mpair[0], bcast32(xb[t]->bsums));
#pragma GCC unroll 8
                for (int pp = 1; pp < 8; ++pp)
                    ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mpair[pp], bcast32(xb[t]->bsums + 2 * pp)));
                facc[t] =
                    _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmin, _mm512_set1_ps(xb[t]->d)), facc[t]);
            }
        }
        __m512i isum[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int n = 0; n < 2; ++n) {
            __m512i V[8];
#pragma GCC unroll 8
            for (int m = 0; m < 8; ++m) V[m] = _mm512_load_si512(p + 320 + 64 * (8 * n + m));
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                __m512i w[8];
#pragma GCC unroll 8
                for (int m = 0; m < 8; ++m) {
                    const __m512i lo = _mm512_srli_epi16(V[m], unsigned(2 * j));
                    if constexpr (kQ3) {
                        const __m512i H = _mm512_load_si512(p + 1344 + 64 * m);
                        const int bit = 4 * n + j;
                        const __m512i hb = bit >= 2 ? _mm512_srli_epi16(H, unsigned(bit - 2))
                                                    : _mm512_slli_epi16(H, unsigned(2 - bit));
                        w[m] = _mm512_ternarylogic_epi32(lo, m3, _mm512_and_si512(hb, m4), 0xEA);
                    } else {
                        w[m] = _mm512_and_si512(lo, m3);
                    }
                }
                const int s = 8 * n + 2 * j;
                __m512i sc0 = scale_bytes(s), sc1 = scale_bytes(s + 1);
                if constexpr (!kQ3) sc0 = _mm512_and_si512(sc0, m15), sc1 = _mm512_and_si512(sc1, m15);
#pragma GCC unroll 16
                for (int t = 0; t < NT; ++t) {
                    const int8_t* x = xb[t]->qs + 128 * n + 32 * j;
                    __m512i a0 = kQ3 ? _mm512_set1_epi32(-4 * xb[t]->bsums[s]) : _mm512_setzero_si512();
                    __m512i a1 = kQ3 ? _mm512_set1_epi32(-4 * xb[t]->bsums[s + 1]) : _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int m = 0; m < 4; ++m) {
                        a0 = _mm512_dpbusd_epi32(a0, w[m], bcast32(x + 4 * m));
                        a1 = _mm512_dpbusd_epi32(a1, w[4 + m], bcast32(x + 16 + 4 * m));
                    }
                    isum[t] = _mm512_add_epi32(
                        isum[t], _mm512_add_epi32(_mm512_mullo_epi32(a0, sc0), _mm512_mullo_epi32(a1, sc1)));
                }
            }
        }
        const __m512 d = kQ3 ? _mm512_load_ps(reinterpret_cast<const float*>(p))
                             : _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t)
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, _mm512_set1_ps(xb[t]->d)), facc[t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, facc[t]);
}

// ---------------------------------------------------------------- IQ4_XS (kAct32)

// Per 32-sub-block as IQ4_NL: the 4 code lines through the level table, dots started at -128 * the
// activation block's code sum; the sub-block's scale d * (ls - 32) is one multiply for the 16 rows,
// shared by the tile's tokens.
template <int NT>
void tile_iq4xs(const uint8_t* g, int64_t nb, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy,
                __mmask16 rmask) {
    const int8_t* xq[NT];
    const float* xd[NT];
    const int32_t* xs[NT];
    __m512 acc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
        xq[t] = reinterpret_cast<const int8_t*>(act + t * as);
        xd[t] = reinterpret_cast<const float*>(xq[t] + k);
        xs[t] = reinterpret_cast<const int32_t*>(xd[t] + nb);
        acc[t] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = iq4_lut();
    for (int64_t sb = 0; sb < k / kQK_K; ++sb) {
        const uint8_t* p = g + size_t(sb) * 2240;
        const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(p));
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            const int64_t b = 8 * sb + s;
            __m512i w[8];
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_load_si512(p + 192 + 64 * (4 * s + j));
                w[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
                w[4 + j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            }
            const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(
                                                    reinterpret_cast<const __m128i*>(p + 64 + 16 * s)))));
#pragma GCC unroll 16
            for (int t = 0; t < NT; ++t) {
                const int8_t* x = xq[t] + 32 * b;
                __m512i s0 = _mm512_set1_epi32(-128 * xs[t][b]);
                __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    s0 = _mm512_dpbusd_epi32(s0, w[j], bcast32(x + 4 * j));
                    s1 = _mm512_dpbusd_epi32(s1, w[4 + j], bcast32(x + 16 + 4 * j));
                }
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                         _mm512_mul_ps(dsc, _mm512_set1_ps(xd[t][b])), acc[t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ldy, rmask, acc[t]);
}

// ---------------------------------------------------------------- drivers

using TileFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t, __mmask16);

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
        const int64_t nr = rows - r0 < kPackRows ? rows - r0 : kPackRows;
        const __mmask16 m = __mmask16((1u << nr) - 1);
        for (int64_t t = t0; t < t1; t += T::kMax) {
            const int nt = int(t1 - t < T::kMax ? t1 - t : T::kMax);
            T::fns[nt - 1](packed + size_t(g) * gs, nb, act + size_t(t) * as, as, k, y + t * ldy + r0, ldy, m);
        }
    }
}

template <Q32 kType>
using Q32Tiles = Tiles<tile_q32<kType, 1>, tile_q32<kType, 2>, tile_q32<kType, 3>, tile_q32<kType, 4>,
                       tile_q32<kType, 5>, tile_q32<kType, 6>, tile_q32<kType, 7>, tile_q32<kType, 8>>;
template <int kOff, bool kMin, bool kHigh>
using Small32Tiles =
    Tiles<tile_small32<kOff, kMin, kHigh, 1>, tile_small32<kOff, kMin, kHigh, 2>, tile_small32<kOff, kMin, kHigh, 3>,
          tile_small32<kOff, kMin, kHigh, 4>, tile_small32<kOff, kMin, kHigh, 5>, tile_small32<kOff, kMin, kHigh, 6>,
          tile_small32<kOff, kMin, kHigh, 7>, tile_small32<kOff, kMin, kHigh, 8>>;
using HalfTiles = Tiles<tile_half<1>, tile_half<2>, tile_half<3>, tile_half<4>, tile_half<5>, tile_half<6>,
                        tile_half<7>, tile_half<8>>;
using BF16Tiles = Tiles<tile_bf16<1>, tile_bf16<2>, tile_bf16<3>, tile_bf16<4>, tile_bf16<5>, tile_bf16<6>,
                        tile_bf16<7>, tile_bf16<8>>;
using BF16DotTiles = Tiles<tile_bf16_dot<1>, tile_bf16_dot<2>, tile_bf16_dot<3>, tile_bf16_dot<4>, tile_bf16_dot<5>,
                           tile_bf16_dot<6>, tile_bf16_dot<7>, tile_bf16_dot<8>>;
using Q4KTiles = Tiles<tile_q45k<false, 1>, tile_q45k<false, 2>, tile_q45k<false, 3>, tile_q45k<false, 4>>;
using Q5KTiles = Tiles<tile_q45k<true, 1>, tile_q45k<true, 2>, tile_q45k<true, 3>, tile_q45k<true, 4>>;
using Q6KTiles = Tiles<tile_q6k<1>, tile_q6k<2>, tile_q6k<3>>;
template <bool kQ3>
using Q23KTiles = Tiles<tile_q23k<kQ3, 1>, tile_q23k<kQ3, 2>, tile_q23k<kQ3, 3>, tile_q23k<kQ3, 4>>;
using IQ4XSTiles = Tiles<tile_iq4xs<1>, tile_iq4xs<2>, tile_iq4xs<3>, tile_iq4xs<4>, tile_iq4xs<5>, tile_iq4xs<6>,
                         tile_iq4xs<7>, tile_iq4xs<8>>;

}  // namespace

void add_packed_kernels_avx512(KernelTable& t, bool bf16_dot) {
    t.packed[int(GgmlType::kQ4_0)] = PackedKernel{gemm_packed<Q32Tiles<Q32::kQ4_0>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kQ8_0)] = PackedKernel{gemm_packed<Q32Tiles<Q32::kQ8_0>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kIQ4_NL)] = PackedKernel{gemm_packed<Q32Tiles<Q32::kIQ4_NL>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kQ4_1)] = PackedKernel{gemm_packed<Small32Tiles<0, true, false>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kQ5_0)] = PackedKernel{gemm_packed<Small32Tiles<16, false, true>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kQ5_1)] = PackedKernel{gemm_packed<Small32Tiles<0, true, true>>, ActFormat::kAct32};
    t.packed[int(GgmlType::kF16)] = PackedKernel{gemm_packed<HalfTiles>, ActFormat::kF32};
    t.packed[int(GgmlType::kBF16)] = bf16_dot ? PackedKernel{gemm_packed<BF16DotTiles>, ActFormat::kBF16}
                                              : PackedKernel{gemm_packed<BF16Tiles>, ActFormat::kF32};
    t.packed[int(GgmlType::kQ4_K)] = PackedKernel{gemm_packed<Q4KTiles>, ActFormat::kActQ8K};
    t.packed[int(GgmlType::kQ5_K)] = PackedKernel{gemm_packed<Q5KTiles>, ActFormat::kActQ8K};
    t.packed[int(GgmlType::kQ6_K)] = PackedKernel{gemm_packed<Q6KTiles>, ActFormat::kActQ8K};
    t.packed[int(GgmlType::kQ2_K)] = PackedKernel{gemm_packed<Q23KTiles<false>>, ActFormat::kActQ8K};
    t.packed[int(GgmlType::kQ3_K)] = PackedKernel{gemm_packed<Q23KTiles<true>>, ActFormat::kActQ8K};
    t.packed[int(GgmlType::kIQ4_XS)] = PackedKernel{gemm_packed<IQ4XSTiles>, ActFormat::kAct32};
}

}  // namespace cera::cpu
