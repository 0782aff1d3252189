// qkx2_search in AVX-512: the lanes are sixteen consecutive steps of the search, and each lane performs
// the scalar loop's float operations in the same order (this file is compiled with -ffp-contract=off,
// so no multiply and add fuse), so every lane's fit is bit for bit the scalar one. The lanes are then
// taken in step order; a lane that improves the fit and moves min invalidates the lanes after it (they
// used the old min), so the next round starts at the step after it.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/quant/quant_k.h"

namespace cera::quant_detail {

void qkx2_search_avx512(Qkx2Search& s) {
    const int n = s.n;
    const float* x = s.x;
    const float* w = s.weights;
    const __m512i nmax = _mm512_set1_epi32(s.nmax);
    const __m512i zero_i = _mm512_setzero_si512();
    const __m512 magic = _mm512_set1_ps(12582912.f);
    const __m512i mant = _mm512_set1_epi32(0x007fffff);
    const __m512i bias = _mm512_set1_epi32(0x00400000);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    alignas(64) int32_t laux[32][16];  // [element][lane]
    alignas(64) float scale_l[16], min_l[16], err_l[16];
    int is0 = 0;
    while (is0 <= s.nstep) {
        const int lanes = s.nstep - is0 + 1 < 16 ? s.nstep - is0 + 1 : 16;
        const __m512 is = _mm512_cvtepi32_ps(_mm512_add_epi32(
            _mm512_set1_epi32(is0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
        // (rmin + rdelta * is + nmax) / (max - min)
        const __m512 iscale = _mm512_div_ps(
            _mm512_add_ps(_mm512_add_ps(_mm512_set1_ps(s.rmin), _mm512_mul_ps(_mm512_set1_ps(s.rdelta), is)),
                          _mm512_set1_ps(float(s.nmax))),
            _mm512_set1_ps(s.max - s.min));
        __m512 sum_l = _mm512_setzero_ps(), sum_l2 = _mm512_setzero_ps(), sum_xl = _mm512_setzero_ps();
        for (int i = 0; i < n; ++i) {
            const __m512 v = _mm512_add_ps(_mm512_mul_ps(iscale, _mm512_set1_ps(x[i] - s.min)), magic);
            __m512i l = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), mant), bias);  // nearest_int
            l = _mm512_min_epi32(_mm512_max_epi32(l, zero_i), nmax);
            _mm512_store_si512(laux[i], l);
            const __m512 lf = _mm512_cvtepi32_ps(l);
            const __m512 wl = _mm512_mul_ps(_mm512_set1_ps(w[i]), lf);
            sum_l = _mm512_add_ps(sum_l, wl);
            sum_l2 = _mm512_add_ps(sum_l2, _mm512_mul_ps(wl, lf));
            sum_xl = _mm512_add_ps(sum_xl, _mm512_mul_ps(wl, _mm512_set1_ps(x[i])));
        }
        const __m512 sw = _mm512_set1_ps(s.sum_w), sx = _mm512_set1_ps(s.sum_x);
        const __m512 D = _mm512_sub_ps(_mm512_mul_ps(sw, sum_l2), _mm512_mul_ps(sum_l, sum_l));
        __m512 this_scale = _mm512_div_ps(_mm512_sub_ps(_mm512_mul_ps(sw, sum_xl), _mm512_mul_ps(sx, sum_l)), D);
        __m512 this_min = _mm512_div_ps(_mm512_sub_ps(_mm512_mul_ps(sum_l2, sx), _mm512_mul_ps(sum_l, sum_xl)), D);
        const __mmask16 pos = _mm512_cmp_ps_mask(this_min, _mm512_setzero_ps(), _CMP_GT_OQ);
        this_min = _mm512_mask_mov_ps(this_min, pos, _mm512_setzero_ps());
        this_scale = _mm512_mask_mov_ps(this_scale, pos, _mm512_div_ps(sum_xl, sum_l2));
        __m512 err = _mm512_setzero_ps();
        for (int i = 0; i < n; ++i) {
            const __m512 lf = _mm512_cvtepi32_ps(_mm512_load_si512(laux[i]));
            __m512 diff = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(this_scale, lf), this_min), _mm512_set1_ps(x[i]));
            diff = s.use_mad ? _mm512_and_ps(diff, abs_mask) : _mm512_mul_ps(diff, diff);
            err = _mm512_add_ps(err, _mm512_mul_ps(_mm512_set1_ps(w[i]), diff));
        }
        const __mmask16 d_pos = _mm512_cmp_ps_mask(D, _mm512_setzero_ps(), _CMP_GT_OQ);
        _mm512_store_ps(scale_l, this_scale);
        _mm512_store_ps(min_l, this_min);
        _mm512_store_ps(err_l, err);
        int next = is0 + lanes;
        for (int k = 0; k < lanes; ++k) {
            if (!((d_pos >> k) & 1) || !(err_l[k] < s.best_error)) continue;
            for (int i = 0; i < n; ++i) s.L[i] = uint8_t(laux[i][k]);
            s.best_error = err_l[k];
            s.scale = scale_l[k];
            if (min_l[k] != s.min) {  // the later lanes used the old min
                s.min = min_l[k];
                next = is0 + k + 1;
                break;
            }
        }
        is0 = next;
    }
}

}  // namespace cera::quant_detail
