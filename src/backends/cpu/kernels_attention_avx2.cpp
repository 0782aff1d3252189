// AVX2 attention rows (see kernels_attention.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

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
        case Elem::kQ4_0: {  // blocks of 18 bytes: f16 scale, 16 bytes of nibbles (low: 0-15, high: 16-31)
            const uint8_t* b = static_cast<const uint8_t*>(base) + (off >> 5) * 18;
            __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + (off & 15)));
            if (off & 16) q = _mm_srli_epi16(q, 4);
            q = _mm_and_si128(q, _mm_set1_epi8(0x0f));
            const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q), _mm256_set1_epi32(8));
            return _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(fp16_to_fp32(*reinterpret_cast<const uint16_t*>(b))));
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
    }
    return _mm256_setzero_ps();
}

}  // namespace

void rows_avx2(const Args& a, int64_t r0, int64_t r1, float* scratch) {
    const int hd = a.head_dim;
    constexpr int kMaxVec = 16;
    if (hd % 8 != 0 || hd / 8 > kMaxVec) return rows_ref(a, r0, r1, scratch);
    const int nv = hd / 8;
    float* scores = scratch;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / a.n_head;
        const int h = int(r % a.n_head), hk = h / a.group;
        const float* qv = a.q + r * hd;
        const int32_t end = a.pos[t] + 1;
        const int32_t begin = a.window > 0 ? std::max(0, end - a.window) : 0;
        const int64_t head_off = int64_t(hk) * hd;
        __m256 q[kMaxVec];
        for (int i = 0; i < nv; ++i) q[i] = _mm256_mul_ps(_mm256_loadu_ps(qv + 8 * i), _mm256_set1_ps(a.scale));
        float mx = -INFINITY;
        for (int32_t j = begin; j < end; ++j) {
            __m256 s0 = _mm256_setzero_ps(), s1 = s0;
            const int64_t o = kv_row(a, j) * a.kv_width + head_off;
            int i = 0;
            for (; i + 2 <= nv; i += 2) {
                s0 = _mm256_fmadd_ps(q[i], load8(a.k, o + 8 * i, a.k_type), s0);
                s1 = _mm256_fmadd_ps(q[i + 1], load8(a.k, o + 8 * i + 8, a.k_type), s1);
            }
            if (i < nv) s0 = _mm256_fmadd_ps(q[i], load8(a.k, o + 8 * i, a.k_type), s0);
            const float s = hsum(_mm256_add_ps(s0, s1));
            scores[j - begin] = s;
            mx = std::max(mx, s);
        }
        const int32_t n = end - begin;
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vsum = _mm256_setzero_ps();
        int32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + i), vmx));
            _mm256_storeu_ps(scores + i, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum(vsum);
        for (; i < n; ++i) sum += scores[i] = std::exp(scores[i] - mx);
        const float inv = 1.0f / sum;
        __m256 acc[kMaxVec];
        for (int v = 0; v < nv; ++v) acc[v] = _mm256_setzero_ps();
        for (int32_t j = begin; j < end; ++j) {
            const __m256 p = _mm256_set1_ps(scores[j - begin]);
            const int64_t o = kv_row(a, j) * a.kv_width + head_off;
            for (int v = 0; v < nv; ++v) acc[v] = _mm256_fmadd_ps(p, load8(a.v, o + 8 * v, a.v_type), acc[v]);
        }
        float* out = a.out + r * hd;
        for (int v = 0; v < nv; ++v) _mm256_storeu_ps(out + 8 * v, _mm256_mul_ps(acc[v], _mm256_set1_ps(inv)));
    }
}

void block_avx2(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch) {
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = t * a.n_head + int64_t(hk) * a.group;
        rows_avx2(a, r, r + a.group, scratch);
    }
}

}  // namespace cera::cpu_attention
