// AMX products for F16 and BF16 weights on f32 activations (kernel_table.h: kernel_table_amx), on the
// packed layouts of repack.h.
//
// Idea: a tile product (tdpbf16ps) multiplies a 16 x 32 bfloat16 block of activations (tokens x k) by
// a 32 x 16 block of weights (k x output rows, stored as 16 rows of k-pairs) into 16 x 16 f32 sums:
// 8,192 multiply-adds an instruction, 16 times the f32 FMA rate of a core. bfloat16 keeps 8
// significant bits, so each operand goes in as a sum of two bfloat16 values, x = xh + xl (xl the
// rounded rest, 16 bits together) and w = wh + wl, and a product as xh wh + xl wh + xh wl: the
// missing xl wl term and xl's rounding are ~2^-17 of |x w|, near f32 arithmetic, where a single
// bfloat16 product would be off by ~2^-8. An F16 weight (11 bits) is exactly wh + wl; a BF16 weight
// is wh alone, so its products take two passes instead of three.
//
// Blocking: a call gets one thread's row groups and up to kTokens tokens. The activations are split
// into hi and lo planes once per call ([tokens padded to 32][k padded to 32] bfloat16 each). For each
// pair of row groups (32 output rows) the weights are split into hi and lo panels in the tiles' pair
// layout ([k / 2][16 rows][2]; a BF16 packed group already is that layout), then every block of 32
// tokens runs the whole k with its 2 x 2 output tiles held in tile registers (tiles 0-3), two
// activation tiles (4, 5) and two weight tiles (6, 7) loaded per 32 elements of k.
// Bottleneck: the tile products (16 cycles each); a tile load per product feeds them from L1 / L2.
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -Wuninitialized in their own convert helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/repack.h"

namespace cera::cpu {
namespace {

// Tokens a call: the activation planes of a call stay in L2 for k up to ~2,000.
constexpr int64_t kTokens = 128;

PackedFn g_f16_fma = nullptr, g_bf16_fma = nullptr;  // the table's own kernels, for few tokens

struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Every tile used is 16 rows of 64 bytes: C 16 x 16 f32, A 16 tokens x 32 bfloat16, B 16 k-pairs x
// 16 rows x 2 bfloat16.
void configure_tiles() {
    TileConfig c;
    for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
}

inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// hi = bf16(v), lo = bf16(v - hi) (0 where v is not finite, so that infinities keep their sign).
inline void split16(__m512 v, __m256i& hi, __m256i& lo) {
    hi = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __mmask16 finite = ~_mm512_fpclass_ps_mask(v, 0x99);  // QNaN, SNaN, +inf, -inf
    lo = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, v, bf16_to_f32(hi))));
}

struct Scratch {
    std::vector<uint16_t> a;  // activation planes: hi [mp][kp], lo [mp][kp]
    std::vector<uint16_t> b;  // weight panels: hi [2][kp * 16], lo [2][kp * 16]
};
thread_local Scratch t_amx;

// Tokens [0, n) of act (f32 rows, stride as bytes) into hi and lo planes of mp rows of kp elements,
// zero past n tokens and k elements.
void split_activations(const uint8_t* act, size_t as, int64_t n, int64_t k, int64_t kp, int64_t mp, uint16_t* hi,
                       uint16_t* lo) {
    for (int64_t t = 0; t < mp; ++t) {
        uint16_t* h = hi + t * kp;
        uint16_t* l = lo + t * kp;
        if (t >= n) {
            std::memset(h, 0, size_t(kp) * 2), std::memset(l, 0, size_t(kp) * 2);
            continue;
        }
        const float* x = reinterpret_cast<const float*>(act + size_t(t) * as);
        for (int64_t i = 0; i < kp; i += 16) {
            const __mmask16 m = i + 16 <= k ? __mmask16(0xffff) : i < k ? __mmask16((1u << (k - i)) - 1) : 0;
            __m256i vh, vl;
            split16(_mm512_maskz_loadu_ps(m, x + i), vh, vl);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), vh);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + i), vl);
        }
    }
}

// One packed F16 group (element i of the 16 rows at 32 i) into hi and lo panels [kp / 2][16][2].
void split_f16_group(const uint8_t* g, int64_t k, int64_t kp, uint16_t* hi, uint16_t* lo) {
    // Pairs of lines interleaved: lane 2r = row r of element 2p, lane 2r + 1 = row r of element 2p + 1.
    alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kIdx);
    auto line = [&](int64_t i) {
        return i < k ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g + 32 * size_t(i))))
                     : _mm512_setzero_ps();
    };
    for (int64_t p = 0; p < kp / 2; ++p) {
        __m256i h0, l0, h1, l1;
        split16(line(2 * p), h0, l0);
        split16(line(2 * p + 1), h1, l1);
        const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        _mm512_store_si512(hi + 32 * p, _mm512_permutexvar_epi16(idx, h));
        _mm512_store_si512(lo + 32 * p, _mm512_permutexvar_epi16(idx, l));
    }
}

// One packed BF16 group (64-byte lines of k-pairs: the tiles' layout) into a panel [kp / 2][16][2],
// zero past the group's ceil(k / 2) lines.
void copy_bf16_group(const uint8_t* g, int64_t k, int64_t kp, uint16_t* hi) {
    const int64_t lines = (k + 1) / 2;
    std::memcpy(hi, g, size_t(lines) * 64);
    std::memset(hi + 32 * lines, 0, size_t(kp / 2 - lines) * 64);
}

// The 32 tokens x (16 NG) rows of one block over the whole k: the passes (activation plane, weight
// panel of each group) summed into tiles 0-3, stored to c [32][32] (row stride 128 bytes).
template <int NG, int NP>
void block(const uint16_t* const (&a)[NP], const uint16_t* const (&b)[NP][2], int64_t kp, float* c, size_t ldc) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const size_t as = size_t(kp) * 2;
    for (int p = 0; p < NP; ++p) {
        const uint16_t* a0 = a[p];
        const uint16_t* a1 = a[p] + 16 * kp;
        for (int64_t kk = 0; kk < kp; kk += 32) {
            _tile_loadd(4, a0 + kk, as);
            _tile_loadd(5, a1 + kk, as);
            _tile_loadd(6, b[p][0] + 16 * kk, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (NG == 2) {
                _tile_loadd(7, b[p][1] + 16 * kk, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
    }
    _tile_stored(0, c, ldc);
    _tile_stored(2, c + ldc / 4 * 16, ldc);
    if constexpr (NG == 2) {
        _tile_stored(1, c + 16, ldc);
        _tile_stored(3, c + ldc / 4 * 16 + 16, ldc);
    }
}

template <bool kF16>
void gemm_amx(const uint8_t* packed, size_t gs, int64_t g0, int64_t g1, int64_t rows, const uint8_t* act, size_t as,
              int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    const int64_t n = t1 - t0;
    if (n < kAmxMinTokens) return (kF16 ? g_f16_fma : g_bf16_fma)(packed, gs, g0, g1, rows, act, as, t0, t1, k, y, ldy);
    const int64_t kp = (k + 31) / 32 * 32, mp = (n + 31) / 32 * 32;
    Scratch& s = t_amx;
    if (s.a.size() < size_t(2 * mp * kp)) s.a.resize(size_t(2 * mp * kp));
    if (s.b.size() < size_t(4 * 16 * kp) + 32) s.b.resize(size_t(4 * 16 * kp) + 32);
    uint16_t* ah = s.a.data();
    uint16_t* al = ah + mp * kp;
    // 64-byte aligned panels (the packed groups are, and the stores above want it)
    uint16_t* b0 = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(s.b.data()) + 63) & ~uintptr_t(63));
    uint16_t* bh[2] = {b0, b0 + 16 * kp};
    uint16_t* bl[2] = {b0 + 32 * kp, b0 + 48 * kp};
    split_activations(act + size_t(t0) * as, as, n, k, kp, mp, ah, al);
    configure_tiles();
    alignas(64) float c[32 * 32];
    for (int64_t g = g0; g < g1; g += 2) {
        const int ng = g + 1 < g1 ? 2 : 1;
        for (int j = 0; j < ng; ++j) {
            const uint8_t* grp = packed + size_t(g + j) * gs;
            if constexpr (kF16)
                split_f16_group(grp, k, kp, bh[j], bl[j]);
            else
                copy_bf16_group(grp, k, kp, bh[j]);
        }
        const int64_t r0 = g * kPackRows;
        const int64_t nr = rows - r0 < 16 * ng ? rows - r0 : 16 * ng;  // output rows of the pair
        for (int64_t m = 0; m < n; m += 32) {
            const int64_t nt = n - m < 32 ? n - m : 32;
            float* out = y + (t0 + m) * ldy + r0;
            // Whole blocks go straight to y; partial ones through c.
            const bool direct = nt == 32 && nr == 16 * ng;
            float* dst = direct ? out : c;
            const size_t ldc = direct ? size_t(ldy) * 4 : 128;
            const uint16_t* am = ah + m * kp;
            const uint16_t* lm = al + m * kp;
            if constexpr (kF16) {
                const uint16_t* const pa[3] = {am, lm, am};
                const uint16_t* const pb[3][2] = {{bh[0], bh[1]}, {bh[0], bh[1]}, {bl[0], bl[1]}};
                ng == 2 ? block<2, 3>(pa, pb, kp, dst, ldc) : block<1, 3>(pa, pb, kp, dst, ldc);
            } else {
                const uint16_t* const pa[2] = {am, lm};
                const uint16_t* const pb[2][2] = {{bh[0], bh[1]}, {bh[0], bh[1]}};
                ng == 2 ? block<2, 2>(pa, pb, kp, dst, ldc) : block<1, 2>(pa, pb, kp, dst, ldc);
            }
            if (!direct) {
                const __mmask16 m0 = __mmask16(nr >= 16 ? 0xffff : (1u << nr) - 1);
                const __mmask16 m1 = __mmask16(nr <= 16 ? 0 : nr >= 32 ? 0xffff : (1u << (nr - 16)) - 1);
                for (int64_t t = 0; t < nt; ++t) {
                    _mm512_mask_storeu_ps(out + t * ldy, m0, _mm512_load_ps(c + 32 * t));
                    if (m1) _mm512_mask_storeu_ps(out + t * ldy + 16, m1, _mm512_load_ps(c + 32 * t + 16));
                }
            }
        }
    }
    _tile_release();
}

}  // namespace

void add_amx_kernels(KernelTable& t) {
    g_f16_fma = t.packed[int(GgmlType::kF16)].fn;
    g_bf16_fma = t.packed[int(GgmlType::kBF16)].fn;
    t.packed[int(GgmlType::kF16)] = PackedKernel{gemm_amx<true>, ActFormat::kF32, kTokens};
    t.packed[int(GgmlType::kBF16)] = PackedKernel{gemm_amx<false>, ActFormat::kF32, kTokens};
}

}  // namespace cera::cpu
