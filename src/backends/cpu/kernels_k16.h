// The unpacked kernels of the 16-element K-quants (Q2_K, Q3_K, Q6_K) on Q8_K activations, in 256-bit
// registers: one text for the AVX2 and AVX-512 tables. Included by kernels_avx2.cpp and
// kernels_avx512.cpp inside their anonymous namespace, after each defines the two primitives of its
// ISA:
//   float hsum(__m256)                     the sum of the 8 lanes;
//   __m256i dot_u8s8(__m256i u, __m256i s) 32 products of unsigned codes below 64 and signed
//                                          activation codes, summed in fours to 8 int32 lanes.
// Tiles of MR weight rows x NC tokens, driven by each file's gemm.
#pragma once

// Q2_K / Q3_K: 16 sub-blocks of 16, 2-bit fields of qs (and Q3_K's third bit in hmask); field j of
// qs[32n .. 32n+31] is elements 128n + 32j .. +31, sub-blocks 8n + 2j and 8n + 2j + 1, as Q6_K's
// quarters. Q2_K's mins and Q3_K's code offset 4 go through Q8_K's per-16 sums.
template <bool kQ3, int MR, int NC>
void tile_q23k(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    const int64_t nsb = k / kQK_K;
    __m256 acc[MR][NC], accm[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = accm[r][c] = _mm256_setzero_ps();
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    for (int64_t sb = 0; sb < nsb; ++sb) {
        __m256i sc[MR][8];  // quarter j: lanes 0-3 scale of sub-block 2j, lanes 4-7 of 2j+1
        __m256i v16[MR];    // per-16 int16 factors of the activation sums: Q2_K's mins, Q3_K's scales
        float d[MR], dmin[MR];
        const uint8_t* qs[MR];
        const uint8_t* hm[MR];
        for (int r = 0; r < MR; ++r) {
            __m128i s8;
            if constexpr (kQ3) {
                const auto* blk = reinterpret_cast<const BlockQ3_K*>(w + r * ws) + sb;
                alignas(16) int8_t u[16];
                unpack_q3_k_scales(blk->scales, u);
                s8 = _mm_sub_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(u)), _mm_set1_epi8(32));
                v16[r] = _mm256_cvtepi8_epi16(s8);
                d[r] = _cvtsh_ss(blk->d);
                dmin[r] = 0;
                qs[r] = blk->qs;
                hm[r] = blk->hmask;
            } else {
                const auto* blk = reinterpret_cast<const BlockQ2_K*>(w + r * ws) + sb;
                const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales));
                s8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
                v16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
                d[r] = _cvtsh_ss(blk->d);
                dmin[r] = _cvtsh_ss(blk->dmin);
                qs[r] = blk->qs;
                hm[r] = nullptr;
            }
            const __m256i lo = _mm256_cvtepi8_epi32(s8), hi = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
            for (int j = 0; j < 8; ++j) {
                const int a = (2 * j) % 8;
                sc[r][j] = _mm256_permutevar8x32_epi32(j < 4 ? lo : hi,
                                                       _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1));
            }
        }
        for (int c = 0; c < NC; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_K*>(act + c * as) + sb;
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->bsums));
            __m256i isum[MR];
            for (int r = 0; r < MR; ++r)  // Q3_K: the codes are value + 4, so start at -4 * sum(scale * bsum)
                isum[r] =
                    kQ3 ? _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, v16[r]), 2))
                        : _mm256_setzero_si256();
            for (int n = 0; n < 2; ++n) {
                __m256i xv[4];
                for (int j = 0; j < 4; ++j)
                    xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 128 * n + 32 * j));
                for (int r = 0; r < MR; ++r) {
                    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[r] + 32 * n));
                    const __m256i h =
                        kQ3 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hm[r])) : _mm256_setzero_si256();
                    for (int j = 0; j < 4; ++j) {
                        __m256i code = _mm256_and_si256(_mm256_srli_epi16(q, unsigned(2 * j)), three);
                        if constexpr (kQ3) {
                            const int bit = 4 * n + j;
                            const __m256i hb = bit >= 2 ? _mm256_srli_epi16(h, unsigned(bit - 2))
                                                        : _mm256_slli_epi16(h, unsigned(2 - bit));
                            code = _mm256_or_si256(code, _mm256_and_si256(hb, four));
                        }
                        const __m256i p = dot_u8s8(code, xv[j]);
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(p, sc[r][4 * n + j]));
                    }
                }
            }
            for (int r = 0; r < MR; ++r) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d[r] * xb->d), acc[r][c]);
                if constexpr (!kQ3)
                    accm[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, v16[r])),
                                                 _mm256_set1_ps(dmin[r] * xb->d), accm[r][c]);
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]) - hsum(accm[r][c]);
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; codes 0..63 with offset 32, removed via bsums.
template <int MR, int NC>
void tile_q6k(const uint8_t* w, size_t ws, const uint8_t* act, size_t as, int64_t k, float* y, int64_t ldy) {
    const int64_t nsb = k / kQK_K;
    __m256 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    for (int64_t sb = 0; sb < nsb; ++sb) {
        __m256i sc[MR][8];  // quarter j: lanes 0-3 scale of sub-block 2j, lanes 4-7 of 2j+1
        __m256i sc16[MR];   // the 16 scales as int16, for the offset term
        float d[MR];
        for (int r = 0; r < MR; ++r) {
            const auto* blk = reinterpret_cast<const BlockQ6_K*>(w + r * ws) + sb;
            d[r] = _cvtsh_ss(blk->d);
            const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales));
            sc16[r] = _mm256_cvtepi8_epi16(s8);
            const __m256i lo = _mm256_cvtepi8_epi32(s8), hi = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
            for (int j = 0; j < 8; ++j) {
                const __m256i src = j < 4 ? lo : hi;
                const int a = (2 * j) % 8;
                sc[r][j] = _mm256_permutevar8x32_epi32(src, _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1));
            }
        }
        for (int c = 0; c < NC; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_K*>(act + c * as) + sb;
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->bsums));
            __m256i isum[MR];
            // the offset: codes are q + 32, so start at -32 * sum(scale * bsum)
            for (int r = 0; r < MR; ++r)
                isum[r] =
                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16[r]), 5));
            for (int n = 0; n < 2; ++n) {
                __m256i xv[4];
                for (int j = 0; j < 4; ++j)
                    xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 128 * n + 32 * j));
                for (int r = 0; r < MR; ++r) {
                    const auto* blk = reinterpret_cast<const BlockQ6_K*>(w + r * ws) + sb;
                    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * n));
                    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * n + 32));
                    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * n));
                    __m256i q[4];
                    q[0] =
                        _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(h, three), 4));
                    q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), three), 4));
                    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), three), 4));
                    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), three), 4));
                    for (int j = 0; j < 4; ++j) {
                        const __m256i p = dot_u8s8(q[j], xv[j]);
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(p, sc[r][4 * n + j]));
                    }
                }
            }
            for (int r = 0; r < MR; ++r) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d[r] * xb->d), acc[r][c]);
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < MR; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}
