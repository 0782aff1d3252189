// AVX-512 attention rows (see kernels_attention.h).
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
inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// Places off % 32 .. + 15 of a block's 16 bytes of nibbles qs (places 0-15 low, 16-31 high; code q + 8)
// times the block's scale d: Q4_0's and Q4_KV's codes.
inline __m512 nibbles(const uint8_t* qs, int64_t off, float d) {
    __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    if (off & 16) q = _mm_srli_epi16(q, 4);
    q = _mm_and_si128(q, _mm_set1_epi8(0x0f));
    const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(q), _mm512_set1_epi32(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(d));
}

// 16 elements (those of mask m) from element offset off; for the block types off % 16 == 0 and m is full.
inline __m512 load(const void* base, int64_t off, Elem type, __mmask16 m) {
    switch (type) {
        case Elem::kF32:
            return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + off);
        case Elem::kF16:
            return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + off));
        case Elem::kBF16:
            return _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + off)), 16));
        case Elem::kQ8_0: {  // blocks of 34 bytes: f16 scale, 32 int8
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 34;
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + (off & 31)));
            return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                                 _mm512_set1_ps(fp16_to_fp32(*reinterpret_cast<const uint16_t*>(b))));
        }
        case Elem::kQ4_0: {  // blocks of 18 bytes: f16 scale, 16 bytes of nibbles
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 18;
            return nibbles(b + 2, off, fp16_to_fp32(*reinterpret_cast<const uint16_t*>(b)));
        }
        case Elem::kQ4_KV: {  // blocks of 17 bytes (BlockQ4_KV): a scale byte, nibbles as Q4_0's
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 17;
            return nibbles(b + 1, off, kQ4KVScales.v[b[0]]);
        }
        case Elem::kQ3_KV: {  // blocks of 14 bytes (BlockQ3_KV): f16 scale, 2-bit magnitudes, sign bits
            const auto* b = reinterpret_cast<const BlockQ3_KV*>(static_cast<const uint8_t*>(base) + (off >> 5) * 14);
            const int h = int(off & 16) >> 4;  // elements 16h .. 16h + 15
            uint32_t qs;
            uint16_t qh;
            std::memcpy(&qs, b->qs + 4 * h, 4);
            std::memcpy(&qh, b->qh + 2 * h, 2);
            const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const __m512i mg = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(int(qs)), _mm512_add_epi32(lane, lane)),
                                                _mm512_set1_epi32(3));
            const __m512i sg = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(int(qh)), lane), _mm512_set1_epi32(1));
            const __m512 v = _mm512_permutexvar_ps(_mm512_or_si512(mg, _mm512_slli_epi32(sg, 2)),
                                                   _mm512_castps256_ps512(_mm256_loadu_ps(kQ3KVValues)));
            return _mm512_mul_ps(v, _mm512_set1_ps(fp16_to_fp32(b->d)));
        }
        case Elem::kQ4_CH:  // keys only, read by load_key
            break;
    }
    return _mm512_setzero_ps();
}

// 16 elements (those of mask m) of key row `row` from channel c: load(), or for Q4_CH (kv_groups.h) two
// gathers over the channels' 36-byte records, one of their f16 step and minimum, one of the byte that
// holds the row's code (read as the top byte of the 4 bytes ending there, which stay inside the record).
inline __m512 load_key(const Args& a, int64_t row, int64_t c, __mmask16 m) {
    if (a.k_type != Elem::kQ4_CH) return load(a.k, row * a.kv_width + c, a.k_type, m);
    const uint8_t* rec = key_record(a, row, c);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(int(kv_groups::kChannelBytes)));
    const int i = int(row % kv_groups::kRows);
    const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, rec, 1);
    __m512i q = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, rec + 1 + i / 2, 1);
    q = _mm512_and_si512(_mm512_srli_epi32(q, 24 + 4 * (i & 1)), _mm512_set1_epi32(15));
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    const __m512 mn = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    return _mm512_add_ps(mn, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
}

// Q4_CH: open_key() of a whole head (nv vectors) into dst, or zeros when !in.
inline void open_key16(const Args& a, int32_t j, bool in, int64_t c0, int nv, float* dst) {
    if (in && j >= a.new_first) {
        std::memcpy(dst, new_key(a, j, c0), sizeof(float) * 16 * size_t(nv));
    } else if (in && a.k_slot) {
        const uint8_t* row = slot_row(a, j);
        for (int v = 0; v < nv; ++v) _mm512_storeu_ps(dst + 16 * v, load(row, c0 + 16 * v, Elem::kQ8_0, 0xffff));
    } else if (in) {
        open_key(a, j, c0, 16 * nv, dst);
    } else {
        std::fill(dst, dst + 16 * nv, 0.0f);
    }
}

// Q4_CH: the 16 rows from `row` (a multiple of 16) of channels [c0, c0 + head_dim) as codes, transposed:
// kt[d * 16 + i] = element c0 + d of row + i. A channel's 16 codes are 8 bytes of its record.
inline void decode_channels(const Args& a, int64_t row, int64_t c0, float* kt) {
    const uint8_t* rec = key_record(a, row, c0);
    const int off = 4 + int(row % kv_groups::kRows) / 2;
    for (int d = 0; d < a.head_dim; ++d, rec += kv_groups::kChannelBytes) {
        uint16_t dm[2];
        std::memcpy(dm, rec, 4);
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + off));
        const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
        _mm512_storeu_ps(kt + d * 16, _mm512_add_ps(_mm512_set1_ps(fp16_to_fp32(dm[1])),
                                                    _mm512_mul_ps(_mm512_set1_ps(fp16_to_fp32(dm[0])), q)));
    }
}

}  // namespace

void rows_avx512(const Args& a, int64_t r0, int64_t r1, float* scratch) {
    const int hd = a.head_dim;
    const int nv = (hd + 15) / 16;  // vectors per head
    constexpr int kMaxVec = 16;     // head_dim <= 256 kept in registers; larger heads use the ref path
    // The block types' loads take 16 elements from a multiple of 16.
    if (nv > kMaxVec || (hd % 16 != 0 && (is_block(a.k_type) || is_block(a.v_type))))
        return rows_ref(a, r0, r1, scratch);
    __mmask16 mask[kMaxVec];
    for (int i = 0; i < nv; ++i) mask[i] = __mmask16(hd - 16 * i >= 16 ? 0xffff : (1u << (hd - 16 * i)) - 1);
    float* scores = scratch;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / a.n_head;
        const int h = int(r % a.n_head), hk = h / a.group;
        const float* qv = a.q + r * hd;
        const int32_t end = a.pos[t] + 1;
        const int32_t begin = key_begin(a, end);
        const int64_t head_off = int64_t(hk) * hd;
        __m512 q[kMaxVec];
        for (int i = 0; i < nv; ++i)
            q[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[i], qv + 16 * i), _mm512_set1_ps(a.scale));
        // Scores, four keys at a time to overlap the reductions; Q4_CH keys of the query's own group
        // (from `open` on) as the open group holds them.
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        const int32_t open = std::max(begin, open_begin(a, end));
        int32_t j = begin;
        for (; j + 4 <= open; j += 4) {
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            const int64_t k0 = kv_row(a, j), k1 = kv_row(a, j + 1), k2 = kv_row(a, j + 2), k3 = kv_row(a, j + 3);
            for (int i = 0; i < nv; ++i) {
                s0 = _mm512_fmadd_ps(q[i], load_key(a, k0, head_off + 16 * i, mask[i]), s0);
                s1 = _mm512_fmadd_ps(q[i], load_key(a, k1, head_off + 16 * i, mask[i]), s1);
                s2 = _mm512_fmadd_ps(q[i], load_key(a, k2, head_off + 16 * i, mask[i]), s2);
                s3 = _mm512_fmadd_ps(q[i], load_key(a, k3, head_off + 16 * i, mask[i]), s3);
            }
            float* sc = scores + (j - begin);
            sc[0] = _mm512_reduce_add_ps(s0);
            sc[1] = _mm512_reduce_add_ps(s1);
            sc[2] = _mm512_reduce_add_ps(s2);
            sc[3] = _mm512_reduce_add_ps(s3);
        }
        for (; j < open; ++j) {
            __m512 s0 = _mm512_setzero_ps();
            const int64_t kr = kv_row(a, j);
            for (int i = 0; i < nv; ++i) s0 = _mm512_fmadd_ps(q[i], load_key(a, kr, head_off + 16 * i, mask[i]), s0);
            scores[j - begin] = _mm512_reduce_add_ps(s0);
        }
        for (; j < end; ++j) {
            alignas(64) float kb[16 * kMaxVec];
            open_key(a, j, head_off, hd, kb);
            __m512 s0 = _mm512_setzero_ps();
            for (int i = 0; i < nv; ++i) s0 = _mm512_fmadd_ps(q[i], _mm512_maskz_loadu_ps(mask[i], kb + 16 * i), s0);
            scores[j - begin] = _mm512_reduce_add_ps(s0);
        }
        const int32_t n = end - begin;
        int32_t i = 0;
        for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(scores + i));
        if (i < n) vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, __mmask16((1u << (n - i)) - 1), scores + i));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (i = 0; i + 16 <= n; i += 16) {
            const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + i), mx));
            _mm512_storeu_ps(scores + i, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        if (i < n) {
            const __mmask16 m = __mmask16((1u << (n - i)) - 1);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + i), mx));
            _mm512_mask_storeu_ps(scores + i, m, e);
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
        }
        const float inv = 1.0f / _mm512_reduce_add_ps(vsum);
        // Weighted sum of the values.
        __m512 acc[kMaxVec];
        for (int v = 0; v < nv; ++v) acc[v] = _mm512_setzero_ps();
        for (j = begin; j < end; ++j) {
            const __m512 p = _mm512_set1_ps(scores[j - begin]);
            const int64_t o = kv_row(a, j) * a.kv_width + head_off;
            for (int v = 0; v < nv; ++v) acc[v] = _mm512_fmadd_ps(p, load(a.v, o + 16 * v, a.v_type, mask[v]), acc[v]);
        }
        float* out = a.out + r * hd;
        for (int v = 0; v < nv; ++v)
            _mm512_mask_storeu_ps(out + 16 * v, mask[v], _mm512_mul_ps(acc[v], _mm512_set1_ps(inv)));
    }
}

void block_avx512(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch) {
    const int hd = a.head_dim, G = a.group;
    // Q4_CH keys decode a tile's 16 rows of a channel from 8 bytes, and the rows that share the KV head
    // share the tile: decode steps too take the tiles. Other decode rows and odd head sizes: the row kernel.
    const bool grouped = a.k_type == Elem::kQ4_CH;
    if (hd % 16 != 0 || hd > 256 || (t1 - t0 == 1 && !grouped)) {
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t r = t * a.n_head + int64_t(hk) * G;
            rows_avx512(a, r, r + G, scratch);
        }
        return;
    }
    const int nv = hd / 16;
    const int64_t R = (t1 - t0) * G;  // rows: r -> token t0 + r / G, head hk * G + r % G
    float* qs = scratch;              // [R, head_dim] scaled queries
    float* acc = qs + R * hd;         // [R, head_dim] unnormalised outputs
    float* m = acc + R * hd;          // [R] running max
    float* l = m + R;                 // [R] running sum
    float* kt = l + R;                // [head_dim, 16] transposed key tile
    float* tile = kt + 16 * hd;       // [16, head_dim] keys of the tile, row-major
    float* vt = tile + 16 * hd;       // [16, head_dim] values of the tile
    float* pbuf = vt + 16 * hd;       // [16] probabilities of one row
    float* kt_open = pbuf + 16;  // Q4_CH: [head_dim, 16] the tile's keys as the open group holds them (kt: as codes)
    const int64_t head_off = int64_t(hk) * hd;
    int32_t kb, ke;
    start_block(a, t0, t1, hk, qs, acc, m, l, kb, ke);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Q4_CH tiles start at a multiple of 16: their rows lie in one group (the keys before kb are masked).
    for (int32_t j0 = grouped ? kb & ~15 : kb; j0 < ke; j0 += 16) {
        const int nk = std::min(16, ke - j0);
        for (int i = 0; i < 16; ++i) {
            for (int v = 0; v < nv; ++v) {
                const bool in = i < nk;
                const int64_t o = (in ? kv_row(a, j0 + i) : 0) * a.kv_width + head_off + 16 * v;
                if (!grouped)
                    _mm512_storeu_ps(tile + i * hd + 16 * v, in ? load(a.k, o, a.k_type, 0xffff) : _mm512_setzero_ps());
                _mm512_storeu_ps(vt + i * hd + 16 * v, in ? load(a.v, o, a.v_type, 0xffff) : _mm512_setzero_ps());
            }
        }
        bool codes = false, open = false;  // Q4_CH: which of kt, kt_open hold the tile
        if (!grouped)
            for (int d = 0; d < hd; ++d)
                for (int i = 0; i < 16; ++i) kt[d * 16 + i] = tile[i * hd + d];
        const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32(j0), lane);
        for (int64_t r = 0; r < R; ++r) {
            const int32_t e = a.pos[t0 + r / G] + 1;
            const int32_t b = key_begin(a, e);
            if (j0 >= e || j0 + nk <= b) continue;
            const float* ktr = kt;
            if (grouped && open_begin(a, e) <= j0) {  // the query's own group: f16 values
                if (!open) {
                    for (int i = 0; i < 16; ++i) open_key16(a, j0 + i, i < nk, head_off, nv, tile + i * hd);
                    for (int d = 0; d < hd; ++d)
                        for (int i = 0; i < 16; ++i) kt_open[d * 16 + i] = tile[i * hd + d];
                    open = true;
                }
                ktr = kt_open;
            } else if (grouped && !codes) {
                decode_channels(a, kv_row(a, j0), head_off, kt);
                codes = true;
            }
            const float* qr = qs + r * hd;
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            for (int d = 0; d < hd; d += 4) {
                s0 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_loadu_ps(ktr + d * 16), s0);
                s1 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 1]), _mm512_loadu_ps(ktr + (d + 1) * 16), s1);
                s2 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 2]), _mm512_loadu_ps(ktr + (d + 2) * 16), s2);
                s3 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 3]), _mm512_loadu_ps(ktr + (d + 3) * 16), s3);
            }
            const __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
            const __mmask16 valid = _mm512_cmpge_epi32_mask(keys, _mm512_set1_epi32(b)) &
                                    _mm512_cmplt_epi32_mask(keys, _mm512_set1_epi32(e));
            const float tile_max = _mm512_mask_reduce_max_ps(valid, s);
            if (tile_max > m[r]) {
                const float c = std::exp(m[r] - tile_max);  // 0 on the first tile (m = -inf)
                float* ar = acc + r * hd;
                for (int v = 0; v < nv; ++v)
                    _mm512_storeu_ps(ar + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(ar + 16 * v), _mm512_set1_ps(c)));
                l[r] *= c;
                m[r] = tile_max;
            }
            const __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, _mm512_set1_ps(m[r]))));
            l[r] += _mm512_reduce_add_ps(p);
            _mm512_storeu_ps(pbuf, p);
            __m512 av[16];
            float* ar = acc + r * hd;
            for (int v = 0; v < nv; ++v) av[v] = _mm512_loadu_ps(ar + 16 * v);
            for (int i = 0; i < nk; ++i) {
                if (pbuf[i] == 0.0f) continue;
                const __m512 pi = _mm512_set1_ps(pbuf[i]);
                for (int v = 0; v < nv; ++v) av[v] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(vt + i * hd + 16 * v), av[v]);
            }
            for (int v = 0; v < nv; ++v) _mm512_storeu_ps(ar + 16 * v, av[v]);
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t t = t0 + r / G;
        float* o = a.out + (t * a.n_head + int64_t(hk) * G + r % G) * hd;
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        for (int v = 0; v < nv; ++v)
            _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + 16 * v), inv));
    }
}

}  // namespace cera::cpu_attention
