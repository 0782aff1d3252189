// AVX-512 attention rows (see cpu_backend_attention.h).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend_attention.h"

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

inline __m512 load(const void* base, int64_t off, bool f16, __mmask16 m) {
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + off));
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + off);
}

}  // namespace

void rows_avx512(const Args& a, int64_t r0, int64_t r1, float* scratch) {
    const int hd = a.head_dim;
    const int nv = (hd + 15) / 16;  // vectors per head
    constexpr int kMaxVec = 16;     // head_dim <= 256 kept in registers; larger heads use the ref path
    if (nv > kMaxVec) return rows_ref(a, r0, r1, scratch);
    __mmask16 mask[kMaxVec];
    for (int i = 0; i < nv; ++i) mask[i] = __mmask16(hd - 16 * i >= 16 ? 0xffff : (1u << (hd - 16 * i)) - 1);
    float* scores = scratch;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / a.n_head;
        const int h = int(r % a.n_head), hk = h / a.group;
        const float* qv = a.q + r * hd;
        const int32_t end = a.pos[t] + 1;
        const int32_t begin = a.window > 0 ? std::max(0, end - a.window) : 0;
        const int64_t head_off = int64_t(hk) * hd;
        __m512 q[kMaxVec];
        for (int i = 0; i < nv; ++i)
            q[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[i], qv + 16 * i), _mm512_set1_ps(a.scale));
        // Scores, four keys at a time to overlap the reductions.
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        int32_t j = begin;
        for (; j + 4 <= end; j += 4) {
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            const int64_t o = int64_t(j) * a.kv_width + head_off;
            for (int i = 0; i < nv; ++i) {
                s0 = _mm512_fmadd_ps(q[i], load(a.k, o + 16 * i, a.f16, mask[i]), s0);
                s1 = _mm512_fmadd_ps(q[i], load(a.k, o + a.kv_width + 16 * i, a.f16, mask[i]), s1);
                s2 = _mm512_fmadd_ps(q[i], load(a.k, o + 2 * a.kv_width + 16 * i, a.f16, mask[i]), s2);
                s3 = _mm512_fmadd_ps(q[i], load(a.k, o + 3 * a.kv_width + 16 * i, a.f16, mask[i]), s3);
            }
            float* sc = scores + (j - begin);
            sc[0] = _mm512_reduce_add_ps(s0);
            sc[1] = _mm512_reduce_add_ps(s1);
            sc[2] = _mm512_reduce_add_ps(s2);
            sc[3] = _mm512_reduce_add_ps(s3);
        }
        for (; j < end; ++j) {
            __m512 s0 = _mm512_setzero_ps();
            const int64_t o = int64_t(j) * a.kv_width + head_off;
            for (int i = 0; i < nv; ++i) s0 = _mm512_fmadd_ps(q[i], load(a.k, o + 16 * i, a.f16, mask[i]), s0);
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
            const int64_t o = int64_t(j) * a.kv_width + head_off;
            for (int v = 0; v < nv; ++v) acc[v] = _mm512_fmadd_ps(p, load(a.v, o + 16 * v, a.f16, mask[v]), acc[v]);
        }
        float* out = a.out + r * hd;
        for (int v = 0; v < nv; ++v)
            _mm512_mask_storeu_ps(out + 16 * v, mask[v], _mm512_mul_ps(acc[v], _mm512_set1_ps(inv)));
    }
}

}  // namespace cera::cpu_attention
