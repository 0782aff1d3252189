// AVX2 attention blocks (see kernels_attention.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_attention.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"

namespace cera::cpu_attention {
namespace {

// exp(x) for x <= 0 (softmax inputs), ~1 ulp: 2^n * p(r), r = x - n ln2.
inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n: n in [-126, 0] here, so the exponent field n + 127 is valid.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Places off % 32 .. + 7 of a block's 16 bytes of nibbles qs (places 0-15 low, 16-31 high; code q + 8)
// times the block's scale d: Q4_0's and Q4_KV's codes.
inline __m256 nibbles8(const uint8_t* qs, int64_t off, float d) {
    __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + (off & 15)));
    if (off & 16) q = _mm_srli_epi16(q, 4);
    q = _mm_and_si128(q, _mm_set1_epi8(0x0f));
    const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d));
}

// 8 elements from element offset off (a multiple of 8).
inline __m256 load8(const void* base, int64_t off, Elem type) {
    switch (type) {
        case Elem::kF32:
            return _mm256_loadu_ps(static_cast<const float*>(base) + off);
        case Elem::kF16:
            return _mm256_cvtph_ps(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + off)));
        case Elem::kBF16:
            return _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + off))),
                16));
        case Elem::kQ8_0: {  // blocks of 34 bytes: f16 scale, 32 int8
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 34;
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + (off & 31)));
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                                 _mm256_set1_ps(fp16_to_fp32(*reinterpret_cast<const uint16_t*>(b))));
        }
        case Elem::kQ4_0: {  // blocks of 18 bytes: f16 scale, 16 bytes of nibbles
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 18;
            return nibbles8(b + 2, off, fp16_to_fp32(*reinterpret_cast<const uint16_t*>(b)));
        }
        case Elem::kQ4_KV: {  // blocks of 17 bytes (BlockQ4_KV): a scale byte, nibbles as Q4_0's
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 17;
            return nibbles8(b + 1, off, kQ4KVScales.v[b[0]]);
        }
        case Elem::kQ3_KV: {  // blocks of 14 bytes (BlockQ3_KV): f16 scale, 2-bit magnitudes, sign bits
            const auto* b = reinterpret_cast<const BlockQ3_KV*>(static_cast<const uint8_t*>(base) + (off >> 5) * 14);
            const int g = int(off & 31) >> 3;  // elements 8g .. 8g + 7
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i m = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(b->qs[2 * g] | b->qs[2 * g + 1] << 8), _mm256_add_epi32(lane, lane)),
                _mm256_set1_epi32(3));
            const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->qh[g]), lane), _mm256_set1_epi32(1));
            const __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kQ3KVValues), _mm256_or_si256(m, _mm256_slli_epi32(s, 2)));
            return _mm256_mul_ps(v, _mm256_set1_ps(fp16_to_fp32(b->d)));
        }
        case Elem::kQ4_CH:  // keys only, decoded by channel (decode_channels)
            break;
    }
    return _mm256_setzero_ps();
}

// The nv vectors of a cache row from element offset off into dst (the type's switch taken once a row).
template <Elem T>
inline void decode_row_as(const void* base, int64_t off, int nv, float* dst) {
    for (int v = 0; v < nv; ++v) _mm256_storeu_ps(dst + 8 * v, load8(base, off + 8 * v, T));
}
inline const float* decode_row(const void* base, int64_t off, Elem type, int nv, float* dst) {
    switch (type) {
        case Elem::kF32: decode_row_as<Elem::kF32>(base, off, nv, dst); break;
        case Elem::kF16: decode_row_as<Elem::kF16>(base, off, nv, dst); break;
        case Elem::kBF16: decode_row_as<Elem::kBF16>(base, off, nv, dst); break;
        case Elem::kQ8_0: decode_row_as<Elem::kQ8_0>(base, off, nv, dst); break;
        case Elem::kQ4_0: decode_row_as<Elem::kQ4_0>(base, off, nv, dst); break;
        case Elem::kQ3_KV: decode_row_as<Elem::kQ3_KV>(base, off, nv, dst); break;
        case Elem::kQ4_KV:
            decode_row_as<Elem::kQ4_KV>(base, off, nv, dst);
            break;
        case Elem::kQ4_CH:
            break;
    }
    return dst;
}

// Q4_CH: open_key() of a whole head (nv vectors of 8) into dst, the slot's Q8_0 rows 8 at a time.
inline void open_key8(const Args& a, int32_t j, int64_t c0, int nv, float* dst) {
    if (j >= a.new_first) {
        std::memcpy(dst, new_key(a, j, c0), sizeof(float) * 8 * size_t(nv));
    } else if (a.k_slot) {
        const uint8_t* row = slot_row(a, j);
        for (int v = 0; v < nv; ++v) _mm256_storeu_ps(dst + 8 * v, load8(row, c0 + 8 * v, Elem::kQ8_0));
    } else {
        open_key(a, j, c0, 8 * nv, dst);
    }
}

// Q4_CH: rows [row, row + nk) (within one group) of channels [c0, c0 + head_dim) as codes, row-major into
// kt (a row every head_dim floats).
inline void decode_channels(const Args& a, int64_t row, int64_t c0, int nk, float* kt) {
    const uint8_t* rec = key_record(a, row, c0);
    const int i0 = int(row % kv_groups::kRows);
    for (int d = 0; d < a.head_dim; ++d, rec += kv_groups::kChannelBytes) {
        uint16_t dm[2];
        std::memcpy(dm, rec, 4);
        const float step = fp16_to_fp32(dm[0]), mn = fp16_to_fp32(dm[1]);
        for (int i = 0; i < nk; ++i)
            kt[i * a.head_dim + d] = mn + step * float((rec[4 + (i0 + i) / 2] >> (4 * ((i0 + i) & 1))) & 15);
    }
}

// The block's rows (its tokens x the group's heads) walk the keys together, flash-style, in tiles of 8:
// a tile's K and V rows are read in place (F32) or decoded to f32 once, for every row of the block, from
// L1. A row's 8 scores come from 8 accumulators and one reduction tree, its softmax is online, and its
// unnormalised output stays in the scratch, up to 8 vectors of it in registers while a tile is added.
// NV: head_dim / 8 when known at compile time (the loops over a row's vectors unroll, so the
// accumulators stay in registers: with a loop bound known only at run time they live on the stack, and
// every multiply-add waits on a store), else 0.
template <int NV>
void block_tiles(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch) {
    const int hd = a.head_dim, G = a.group;
    constexpr int kTile = 8;
    const int nv = NV > 0 ? NV : hd / 8;
    const int64_t R = (t1 - t0) * G;  // rows: r -> token t0 + r / G, head hk * G + r % G
    float* qs = scratch;              // [R, head_dim] scaled queries
    float* acc = qs + R * hd;         // [R, head_dim] unnormalised outputs
    float* m = acc + R * hd;          // [R] running max
    float* l = m + R;                 // [R] running sum
    float* kt = l + R;                // [kTile, head_dim] keys of the tile
    float* vt = kt + kTile * hd;      // [kTile, head_dim] values of the tile
    float* ko =
        vt + kTile * hd;  // Q4_CH: [kTile, head_dim] the tile's keys as the open group holds them (kt: as codes)
    const bool grouped = a.k_type == Elem::kQ4_CH;
    const int64_t head_off = int64_t(hk) * hd;
    int32_t kb, ke;
    start_block(a, t0, t1, hk, qs, acc, m, l, kb, ke);
    // Tiles on a grid of absolute positions: a row meets the same tiles whatever else is in its block (a
    // decode step and a speculative verification give it the same sums, bit for bit).
    kb -= kb % kTile;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    for (int32_t j0 = kb; j0 < ke; j0 += kTile) {
        const int nk = std::min(kTile, ke - j0);
        // The tile's rows: an F32 cache's in place, the others decoded once into kt / vt; past the last
        // key, zeros.
        // Q4_CH keys: kt holds the tile as codes, ko as the open group holds it, each filled for the first row that
        // reads it (the rows whose own group the tile is in read ko).
        const float* kr[kTile];
        const float* vr[kTile];
        const float* kro[kTile];
        for (int i = 0; i < kTile; ++i) {
            kro[i] = ko + i * hd;
            if (i >= nk) {
                std::fill(kt + i * hd, kt + (i + 1) * hd, 0.0f);
                std::fill(ko + i * hd, ko + (i + 1) * hd, 0.0f);
                kr[i] = vr[i] = kt + i * hd;
                continue;
            }
            const int64_t o = kv_row(a, j0 + i) * a.kv_width + head_off;
            kr[i] = a.k_type == Elem::kF32 ? static_cast<const float*>(a.k) + o
                    : grouped              ? kt + i * hd
                                           : decode_row(a.k, o, a.k_type, nv, kt + i * hd);
            vr[i] = a.v_type == Elem::kF32 ? static_cast<const float*>(a.v) + o : decode_row(a.v, o, a.v_type, nv, vt + i * hd);
        }
        bool codes = false, open = false;
        const __m256i keys = _mm256_add_epi32(_mm256_set1_epi32(j0), lane);
        for (int64_t r = 0; r < R; ++r) {
            const int32_t e = a.pos[t0 + r / G] + 1;
            const int32_t b = key_begin(a, e);
            if (j0 >= e || j0 + nk <= b) continue;
            const float* const* krow = kr;
            if (grouped && open_begin(a, e) <= j0) {
                if (!open)
                    for (int i = 0; i < nk; ++i) open_key8(a, j0 + i, head_off, nv, ko + i * hd);
                open = true;
                krow = kro;
            } else if (grouped && !codes) {
                decode_channels(a, kv_row(a, j0), head_off, nk, kt);
                codes = true;
            }
            // Scores: accumulator i holds key i's products, summed across lanes by one hadd tree.
            const float* qr = qs + r * hd;
            __m256 s[kTile];
            for (int i = 0; i < kTile; ++i) s[i] = _mm256_setzero_ps();
            for (int v = 0; v < nv; ++v) {
                const __m256 qv = _mm256_loadu_ps(qr + 8 * v);
                for (int i = 0; i < kTile; ++i) s[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krow[i] + 8 * v), s[i]);
            }
            const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
            const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
            __m256 sc = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
            const __m256 valid = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_cmpgt_epi32(keys, _mm256_set1_epi32(b - 1)),
                                 _mm256_cmpgt_epi32(_mm256_set1_epi32(e), keys)));
            sc = _mm256_blendv_ps(neg_inf, sc, valid);
            __m128 mx = _mm_max_ps(_mm256_castps256_ps128(sc), _mm256_extractf128_ps(sc, 1));
            mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
            mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
            const float tile_max = _mm_cvtss_f32(mx);
            float* ar = acc + r * hd;
            float c = 1.0f;  // the rescale of the row's sums
            if (tile_max > m[r]) {
                c = std::exp(m[r] - tile_max);  // 0 on the row's first tile (m = -inf)
                l[r] *= c;
                m[r] = tile_max;
            }
            const __m256 p = _mm256_and_ps(valid, exp256(_mm256_sub_ps(sc, _mm256_set1_ps(m[r]))));
            l[r] += hsum(p);
            // Outputs, up to 8 vectors of dims at a time: rescaled, plus the tile's weighted values.
            const __m256 vc = _mm256_set1_ps(c);
            for (int v0 = 0; v0 < nv; v0 += 8) {
                const int nc = std::min(8, nv - v0);
                __m256 av[8];
                for (int v = 0; v < nc; ++v) av[v] = _mm256_mul_ps(_mm256_loadu_ps(ar + 8 * (v0 + v)), vc);
                for (int i = 0; i < nk; ++i) {
                    const __m256 pi = _mm256_permutevar8x32_ps(p, _mm256_set1_epi32(i));
                    const float* vi = vr[i] + 8 * v0;
                    for (int v = 0; v < nc; ++v) av[v] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(vi + 8 * v), av[v]);
                }
                for (int v = 0; v < nc; ++v) _mm256_storeu_ps(ar + 8 * (v0 + v), av[v]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t t = t0 + r / G;
        float* o = a.out + (t * a.n_head + int64_t(hk) * G + r % G) * hd;
        const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
        for (int v = 0; v < nv; ++v) _mm256_storeu_ps(o + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(acc + r * hd + 8 * v), inv));
    }
}

}  // namespace

void block_avx2(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch) {
    switch (a.head_dim) {
        case 32: return block_tiles<4>(a, t0, t1, hk, scratch);
        case 64: return block_tiles<8>(a, t0, t1, hk, scratch);
        case 128: return block_tiles<16>(a, t0, t1, hk, scratch);
        default: break;
    }
    if (a.head_dim % 8 == 0) return block_tiles<0>(a, t0, t1, hk, scratch);
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = t * a.n_head + int64_t(hk) * a.group;
        rows_ref(a, r, r + a.group, scratch);
    }
}

}  // namespace cera::cpu_attention
