// AMX products for F16 and BF16 weights (on the packed layouts of repack.h) and plain F32 weights, on f32
// activations (kernel_table.h: kernel_table_amx, KernelTable::tiles_packed and tiles_plain).
//
// Idea: a tile product (tdpbf16ps) multiplies a 16 x 32 bfloat16 block of activations (tokens x k) by
// a 32 x 16 block of weights (k x output rows, stored as 16 rows of k-pairs) into 16 x 16 f32 sums:
// 8,192 multiply-adds an instruction, 16 times the f32 FMA rate of a core. bfloat16 keeps 8
// significant bits, so each operand goes in as a sum of two bfloat16 values, x = xh + xl (xl the
// rounded rest, 16 bits together) and w = wh + wl, and a product as xh wh + xl wh + xh wl: the
// missing xl wl term and xl's rounding are ~2^-16 of |x w| each, near f32 arithmetic, where a single
// bfloat16 product would be off by ~2^-8. An F16 weight (11 bits) is exactly wh + wl; a BF16 weight
// is wh alone, so its products take two passes instead of three.
//
// Blocking: a call gets one thread's row groups and up to kTokens tokens. The activations are split
// into hi and lo planes once per call, laid out tile after tile. For each pair of row groups (32
// output rows) and chunk of kChunk elements of k, the weights are split into hi and lo panels in the
// tiles' pair layout ([k / 2][16 rows][2]; a BF16 packed group already is that layout), then every
// block of 32 tokens runs the chunk with its 2 x 2 output tiles in tile registers 0-3 (from and to
// the call's sums between chunks), two activation tiles (4, 5) and two weight tiles (6, 7).
// Bottleneck: the tile loads. A product takes 16 cycles when its tiles come from L1, ~2.5 times that
// when one of them streams from L2, and the 2 x 2 blocking loads about a tile per product; a block's
// activations and a pair's panels outgrow L1, so the products run well below their peak (bench/NOTES.md).
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

// Tokens a call (activation planes of 4 k bytes a token): the more tokens, the more of them share each
// split of the weights.
constexpr int64_t kTokens = 512;
// Elements of k a weight panel holds. Chunks small enough to keep the panels in L1 cost more than the L2
// reads they save: each adds a round trip of the output tiles and a split of the panels.
constexpr int64_t kChunk = 1024;

// The table's own kernels, for few tokens.
PackedFn g_f16_fma = nullptr, g_bf16_fma = nullptr;
GemmFn g_f32_fma = nullptr;

struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// GCC 12 does not see ldtilecfg read its operand and may drop the stores that fill it: the empty asm
// with a memory clobber keeps them.
inline void load_config(const TileConfig& c) {
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

// Every tile used is 16 rows of 64 bytes: C 16 x 16 f32, A 16 tokens x 32 bfloat16, B 16 k-pairs x
// 16 rows x 2 bfloat16.
void configure_tiles() {
    TileConfig c;
    for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
    load_config(c);
}

inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// hi = bf16(v), lo = bf16(v - hi) (0 where v is not finite, so that infinities keep their sign).
inline void split16(__m512 v, __m256i& hi, __m256i& lo) {
    hi = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __mmask16 finite = ~_mm512_fpclass_ps_mask(v, 0x99);  // QNaN, SNaN, +inf, -inf
    lo = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, v, bf16_to_f32(hi))));
}

struct Scratch {
    std::vector<uint16_t> a;  // activation planes: hi, lo [mp * kp] (split_activations)
    std::vector<uint16_t> b;  // weight panels of a chunk: hi [2][kChunk * 16], lo [2][kChunk * 16]
    std::vector<float> c;     // the sums of the blocks of 32 tokens: [mp][32]
};
thread_local Scratch t_amx;

// Tokens [0, n) of act (f32 rows, stride as bytes) into hi and lo planes of mp rows of kp elements, zero
// past n tokens and k elements, laid out tile by tile: the 16 x 32 tile of rows 16 b.. and elements
// 32 j.. at element (b * kp / 32 + j) * 512, row-major (so that a pass reads its tiles in sequence).
void split_activations(const uint8_t* act, size_t as, int64_t n, int64_t k, int64_t kp, int64_t mp, uint16_t* hi,
                       uint16_t* lo) {
    const int64_t tiles = kp / 32;
    for (int64_t t = 0; t < mp; ++t) {
        const float* x = reinterpret_cast<const float*>(act + size_t(t) * as);
        for (int64_t j = 0; j < tiles; ++j) {
            const int64_t off = ((t / 16) * tiles + j) * 512 + (t % 16) * 32;
            for (int h = 0; h < 2; ++h) {
                const int64_t i = 32 * j + 16 * h;
                const __mmask16 m = t >= n        ? 0
                                    : i + 16 <= k ? __mmask16(0xffff)
                                    : i < k       ? __mmask16((1u << (k - i)) - 1)
                                                  : 0;
                __m256i vh, vl;
                split16(_mm512_maskz_loadu_ps(m, x + i), vh, vl);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + off + 16 * h), vh);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + off + 16 * h), vl);
            }
        }
    }
}

// Elements [k0, k0 + kc) of one packed F16 group (element i of the 16 rows at 32 i) into hi and lo
// panels [kc / 2][16][2], zero past k.
void split_f16_group(const uint8_t* g, int64_t k, int64_t k0, int64_t kc, uint16_t* hi, uint16_t* lo) {
    // Pairs of lines interleaved: lane 2r = row r of element 2p, lane 2r + 1 = row r of element 2p + 1.
    alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kIdx);
    auto line = [&](int64_t i) {
        return i < k ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g + 32 * size_t(i))))
                     : _mm512_setzero_ps();
    };
    for (int64_t p = 0; p < kc / 2; ++p) {
        __m256i h0, l0, h1, l1;
        split16(line(k0 + 2 * p), h0, l0);
        split16(line(k0 + 2 * p + 1), h1, l1);
        const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        _mm512_store_si512(hi + 32 * p, _mm512_permutexvar_epi16(idx, h));
        _mm512_store_si512(lo + 32 * p, _mm512_permutexvar_epi16(idx, l));
    }
}

// Elements [k0, k0 + kc) of one packed BF16 group (64-byte lines of k-pairs: the tiles' layout) into a
// panel [kc / 2][16][2], zero past the group's ceil(k / 2) lines.
void copy_bf16_group(const uint8_t* g, int64_t k, int64_t k0, int64_t kc, uint16_t* hi) {
    const int64_t p0 = k0 / 2, lines = (k + 1) / 2;
    const int64_t n = lines - p0 < kc / 2 ? lines - p0 : kc / 2;
    std::memcpy(hi, g + 64 * p0, size_t(n) * 64);
    std::memset(hi + 32 * n, 0, size_t(kc / 2 - n) * 64);
}

// Elements [k0, k0 + kc) of nr <= 16 rows of a row-major f32 matrix (row stride `stride` floats) into
// hi and lo panels [kc / 2][16][2], zero past k and past nr rows: each row's 16 pairs of 32 elements
// are scattered to their places in the panel, a row apart.
void split_f32_rows(const float* w, size_t stride, int nr, int64_t k, int64_t k0, int64_t kc, uint16_t* hi,
                    uint16_t* lo) {
    const __m512i lane16 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(16));
    auto* h32 = reinterpret_cast<int*>(hi);
    auto* l32 = reinterpret_cast<int*>(lo);
    for (int64_t q = 0; q < kc / 32; ++q) {
        const int64_t i0 = k0 + 32 * q;
        const __mmask16 m0 = i0 + 16 <= k ? __mmask16(0xffff) : i0 < k ? __mmask16((1u << (k - i0)) - 1) : 0;
        const __mmask16 m1 = i0 + 32 <= k ? __mmask16(0xffff) : i0 + 16 < k ? __mmask16((1u << (k - i0 - 16)) - 1) : 0;
        for (int r = 0; r < 16; ++r) {
            const float* row = w + size_t(r) * stride + i0;
            __m256i h0, l0, h1, l1;
            split16(_mm512_maskz_loadu_ps(r < nr ? m0 : 0, row), h0, l0);
            split16(_mm512_maskz_loadu_ps(r < nr ? m1 : 0, row + 16), h1, l1);
            _mm512_i32scatter_epi32(h32 + q * 256 + r, lane16, _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1),
                                    4);
            _mm512_i32scatter_epi32(l32 + q * 256 + r, lane16, _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1),
                                    4);
        }
    }
}

// The weights of a product, as 16-row groups whose panels the tile kernel asks for (kLo: weights with
// a lo half, three products a pair of halves; else two).
template <bool kF16>
struct PackedGroups {  // packed F16 (its lo halves split off) or BF16 (the tiles' layout already)
    static constexpr bool kLo = kF16;
    const uint8_t* packed;
    size_t gs;
    int64_t rows, k;
    int64_t row(int64_t g) const { return g * kPackRows; }
    void panel(int64_t g, int64_t k0, int64_t kc, uint16_t* hi, uint16_t* lo) const {
        if constexpr (kF16)
            split_f16_group(packed + size_t(g) * gs, k, k0, kc, hi, lo);
        else
            copy_bf16_group(packed + size_t(g) * gs, k, k0, kc, hi);
    }
};
struct F32Rows {  // rows [r0, rows) of a row-major f32 matrix, group g from row r0 + 16 g
    static constexpr bool kLo = true;
    const float* w;
    size_t stride;
    int64_t r0, rows, k;
    int64_t row(int64_t g) const { return r0 + g * kPackRows; }
    void panel(int64_t g, int64_t k0, int64_t kc, uint16_t* hi, uint16_t* lo) const {
        const int64_t r = row(g);
        split_f32_rows(w + size_t(r) * stride, stride, int(rows - r < 16 ? rows - r : 16), k, k0, kc, hi, lo);
    }
};

// One block of 32 tokens x (16 NG) rows over kc elements of k, added to the block's sums c [32][32]
// (row stride 128 bytes; zero at first): a (hi) and al (lo) at the block's first activation tile,
// bh / bl the groups' weight panels. Per 32 elements, the products in an order that reuses the tiles
// loaded: xh wh, then xh wl (the lo weights only for F16), then xl wh.
template <int NG, bool kF16>
void block(const uint16_t* a, const uint16_t* al, const uint16_t* const (&bh)[2], const uint16_t* const (&bl)[2],
           int64_t kc, int64_t kp, float* c, bool first) {
    constexpr size_t ldc = 128;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, ldc);
        _tile_loadd(2, c + 16 * 32, ldc);
        if constexpr (NG == 2) {
            _tile_loadd(1, c + 16, ldc);
            _tile_loadd(3, c + 16 * 32 + 16, ldc);
        }
    }
    auto products = [] {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (NG == 2) {
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    };
    const int64_t a1 = 16 * kp;  // the next 16 tokens' tiles
    for (int64_t kk = 0; kk < kc; kk += 32) {
        const int64_t at = 16 * kk, bt = 16 * kk;
        _tile_loadd(4, a + at, 64);
        _tile_loadd(5, a + a1 + at, 64);
        _tile_loadd(6, bh[0] + bt, 64);
        if constexpr (NG == 2) _tile_loadd(7, bh[1] + bt, 64);
        products();
        if constexpr (kF16) {
            _tile_loadd(6, bl[0] + bt, 64);
            if constexpr (NG == 2) _tile_loadd(7, bl[1] + bt, 64);
            products();
            _tile_loadd(6, bh[0] + bt, 64);
            if constexpr (NG == 2) _tile_loadd(7, bh[1] + bt, 64);
        }
        _tile_loadd(4, al + at, 64);
        _tile_loadd(5, al + a1 + at, 64);
        products();
    }
    _tile_stored(0, c, ldc);
    _tile_stored(2, c + 16 * 32, ldc);
    if constexpr (NG == 2) {
        _tile_stored(1, c + 16, ldc);
        _tile_stored(3, c + 16 * 32 + 16, ldc);
    }
}

// y[t][r] for groups [g0, g1) of w's rows and tokens [t0, t1) of the f32 activations.
template <class W>
void gemm_tiles(const W& w, int64_t g0, int64_t g1, const uint8_t* act, size_t as, int64_t t0, int64_t t1, float* y,
                int64_t ldy) {
    const int64_t n = t1 - t0, k = w.k;
    const int64_t kp = (k + 31) / 32 * 32, mp = (n + 31) / 32 * 32;
    Scratch& s = t_amx;
    if (s.a.size() < size_t(2 * mp * kp)) s.a.resize(size_t(2 * mp * kp));
    if (s.c.size() < size_t(mp * 32)) s.c.resize(size_t(mp * 32));
    uint16_t* ah = s.a.data();
    uint16_t* al = ah + mp * kp;
    float* cb = s.c.data();
    if (s.b.size() < size_t(4 * kChunk * 16 + 32)) s.b.resize(size_t(4 * kChunk * 16 + 32));
    // 64-byte aligned panels (split_f16_group's stores)
    uint16_t* b0 = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(s.b.data()) + 63) & ~uintptr_t(63));
    uint16_t* const bh[2] = {b0, b0 + kChunk * 16};
    uint16_t* const bl[2] = {b0 + 2 * kChunk * 16, b0 + 3 * kChunk * 16};
    split_activations(act + size_t(t0) * as, as, n, k, kp, mp, ah, al);
    configure_tiles();
    for (int64_t g = g0; g < g1; g += 2) {
        const int ng = g + 1 < g1 ? 2 : 1;
        for (int64_t k0 = 0; k0 < kp; k0 += kChunk) {
            const int64_t kc = kp - k0 < kChunk ? kp - k0 : kChunk;
            for (int j = 0; j < ng; ++j) w.panel(g + j, k0, kc, bh[j], bl[j]);
            for (int64_t m = 0; m < n; m += 32) {
                const uint16_t* am = ah + m * kp + 16 * k0;  // tile (m / 16, k0 / 32)
                const uint16_t* lm = al + m * kp + 16 * k0;
                float* c = cb + m * 32;
                const uint16_t *const pbh[2] = {bh[0], bh[1]}, *const pbl[2] = {bl[0], bl[1]};
                ng == 2 ? block<2, W::kLo>(am, lm, pbh, pbl, kc, kp, c, k0 == 0)
                        : block<1, W::kLo>(am, lm, pbh, pbl, kc, kp, c, k0 == 0);
            }
        }
        const int64_t r0 = w.row(g);
        const int64_t nr = w.rows - r0 < 16 * ng ? w.rows - r0 : 16 * ng;  // output rows of the pair
        const __mmask16 m0 = __mmask16(nr >= 16 ? 0xffff : (1u << nr) - 1);
        const __mmask16 m1 = __mmask16(nr <= 16 ? 0 : nr >= 32 ? 0xffff : (1u << (nr - 16)) - 1);
        for (int64_t t = 0; t < n; ++t) {
            float* out = y + (t0 + t) * ldy + r0;
            _mm512_mask_storeu_ps(out, m0, _mm512_loadu_ps(cb + 32 * t));
            if (m1) _mm512_mask_storeu_ps(out + 16, m1, _mm512_loadu_ps(cb + 32 * t + 16));
        }
    }
    _tile_release();
}

void gemm_f16(const uint8_t* packed, size_t gs, int64_t g0, int64_t g1, int64_t rows, const uint8_t* act, size_t as,
              int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    if (t1 - t0 < kAmxMinTokens) return g_f16_fma(packed, gs, g0, g1, rows, act, as, t0, t1, k, y, ldy);
    gemm_tiles(PackedGroups<true>{packed, gs, rows, k}, g0, g1, act, as, t0, t1, y, ldy);
}

void gemm_bf16(const uint8_t* packed, size_t gs, int64_t g0, int64_t g1, int64_t rows, const uint8_t* act, size_t as,
               int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy) {
    if (t1 - t0 < kAmxMinTokens) return g_bf16_fma(packed, gs, g0, g1, rows, act, as, t0, t1, k, y, ldy);
    gemm_tiles(PackedGroups<false>{packed, gs, rows, k}, g0, g1, act, as, t0, t1, y, ldy);
}

// Unpacked f32 weights, rows [r0, r1).
void gemm_f32(const uint8_t* w, size_t w_stride, int64_t r0, int64_t r1, const uint8_t* act, size_t as, int64_t t0,
              int64_t t1, int64_t k, float* y, int64_t ldy) {
    if (t1 - t0 < kAmxMinTokens) return g_f32_fma(w, w_stride, r0, r1, act, as, t0, t1, k, y, ldy);
    const F32Rows rows{reinterpret_cast<const float*>(w), w_stride / 4, r0, r1, k};
    gemm_tiles(rows, 0, (r1 - r0 + kPackRows - 1) / kPackRows, act, as, t0, t1, y, ldy);
}

}  // namespace

void add_amx_kernels(KernelTable& t) {
    g_f16_fma = t.packed[int(GgmlType::kF16)].fn;
    g_bf16_fma = t.packed[int(GgmlType::kBF16)].fn;
    g_f32_fma = t.matmul[int(GgmlType::kF32)].fn;
    t.tiles_packed[int(GgmlType::kF16)] = PackedKernel{gemm_f16, ActFormat::kF32, kTokens};
    t.tiles_packed[int(GgmlType::kBF16)] = PackedKernel{gemm_bf16, ActFormat::kF32, kTokens};
    t.tiles_plain[int(GgmlType::kF32)] = MatmulKernel{gemm_f32, ActFormat::kF32, kTokens};
}

}  // namespace cera::cpu
