// Reference quantizers/dequantizers. Every float operation follows the order of llama.cpp's
// reference code (ggml-quants.c), so that quantizing gives the same bytes as llama-quantize
// without an importance matrix. This file is compiled for baseline x86-64 (no FMA
// contraction), as ggml's reference quantizers are.
#include "core/quant/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/fp16.h"
#include "core/quant/quant_k.h"

namespace cera {
namespace {

using namespace quant_detail;  // fp16 helpers and the K-quant quantizers (quant_k.cpp)

// ---- plain types ----

void dequant_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void quant_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void dequant_f16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
}
void quant_f16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
}
void dequant_bf16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
}
void quant_bf16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
}

// ---- 32-element blocks ----

// A block of 32 4-bit codes q + 8 (element j in the low nibble of qs[j], j + 16 in the high one) at scale d:
// Q4_0's and Q4_KV's.
void dequant_nibbles(const uint8_t* qs, float d, float* y) {
    for (int j = 0; j < 16; ++j) {
        y[j] = float((qs[j] & 0xF) - 8) * d;
        y[j + 16] = float((qs[j] >> 4) - 8) * d;
    }
}

void dequant_q4_0(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / kQK4_0; ++i, y += kQK4_0) dequant_nibbles(x[i].qs, h2f(x[i].d), y);
}

void quant_q4_0(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ4_0*>(dst);
    for (int64_t i = 0; i < n / kQK4_0; ++i, x += kQK4_0) {
        float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude (first one wins)
        for (int j = 0; j < kQK4_0; ++j)
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < 16; ++j) {
            const int q0 = int(int8_t(x[j] * id + 8.5f));  // truncation, as ggml's cast
            const int q1 = int(int8_t(x[j + 16] * id + 8.5f));
            y[i].qs[j] = uint8_t((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
        }
    }
}

void dequant_q4_1(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / kQK4_1; ++i, y += kQK4_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = float(x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = float(x[i].qs[j] >> 4) * d + m;
        }
    }
}

void quant_q4_1(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ4_1*>(dst);
    for (int64_t i = 0; i < n / kQK4_1; ++i, x += kQK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < kQK4_1; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        for (int j = 0; j < 16; ++j) {
            const int q0 = int(int8_t((x[j] - min) * id + 0.5f));
            const int q1 = int(int8_t((x[j + 16] - min) * id + 0.5f));
            y[i].qs[j] = uint8_t((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
        }
    }
}

inline uint32_t load_qh(const uint8_t* qh) {
    uint32_t v;
    std::memcpy(&v, qh, 4);
    return v;  // little-endian host, as the file
}

void dequant_q5_0(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ5_0*>(src);
    for (int64_t i = 0; i < n / kQK5_0; ++i, y += kQK5_0) {
        const float d = h2f(x[i].d);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int h0 = int((qh >> j) & 1) << 4, h1 = int((qh >> (j + 16)) & 1) << 4;
            y[j] = float(((x[i].qs[j] & 0xF) | h0) - 16) * d;
            y[j + 16] = float(((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void quant_q5_0(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ5_0*>(dst);
    for (int64_t i = 0; i < n / kQK5_0; ++i, x += kQK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < kQK5_0; ++j)
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = int(int8_t(x[j] * id + 16.5f));
            int q1 = int(int8_t(x[j + 16] * id + 16.5f));
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
            y[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= uint32_t((q0 >> 4) & 1) << j;
            qh |= uint32_t((q1 >> 4) & 1) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

void dequant_q5_1(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ5_1*>(src);
    for (int64_t i = 0; i < n / kQK5_1; ++i, y += kQK5_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int h0 = int((qh >> j) & 1) << 4, h1 = int((qh >> (j + 16)) & 1) << 4;
            y[j] = float((x[i].qs[j] & 0xF) | h0) * d + m;
            y[j + 16] = float((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void quant_q5_1(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ5_1*>(dst);
    for (int64_t i = 0; i < n / kQK5_1; ++i, x += kQK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < kQK5_1; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int q0 = int(uint8_t((x[j] - min) * id + 0.5f));
            const int q1 = int(uint8_t((x[j + 16] - min) * id + 0.5f));
            y[i].qs[j] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= uint32_t((q0 >> 4) & 1) << j;
            qh |= uint32_t((q1 >> 4) & 1) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

void dequant_q8_0(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / kQK8_0; ++i, y += kQK8_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < kQK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void quant_q8_0(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / kQK8_0; ++i, x += kQK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = int8_t(std::round(x[j] * id));
    }
}

void dequant_q8_1(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ8_1*>(src);
    for (int64_t i = 0; i < n / kQK8_1; ++i, y += kQK8_1) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < kQK8_1; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void quant_q8_1(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t i = 0; i < n / kQK8_1; ++i, x += kQK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < kQK8_1; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        int sum = 0;
        for (int j = 0; j < kQK8_1; ++j) {
            y[i].qs[j] = int8_t(std::round(x[j] * id));
            sum += y[i].qs[j];
        }
        y[i].s = f2h(float(sum) * d);
    }
}

// ---- K-quants: dequantization ----

void dequant_q2_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const uint8_t* q = x[i].qs;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; ++part) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * part] >> shift) & 3) - ml;
                }
            }
        }
    }
}

void dequant_q3_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ3_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d_all = h2f(x[i].d);
        int8_t scales[16];
        unpack_q3_k_scales(x[i].scales, scales);
        const uint8_t* q = x[i].qs;
        const uint8_t* hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int part = 0; part < 2; ++part) {
                    const float dl = d_all * float(scales[is++] - 32);
                    for (int l = 16 * part; l < 16 * part + 16; ++l)
                        *y++ = dl * float(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

void dequant_q4_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ4_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const uint8_t* q = x[i].qs;
        for (int g = 0; g < 4; ++g, q += 32) {
            uint8_t sc, m;
            get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * float(sc), m1 = dmin * float(m);
            get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * float(sc), m2 = dmin * float(m);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
        }
    }
}

void dequant_q5_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ5_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        const uint8_t* ql = x[i].qs;
        const uint8_t* qh = x[i].qh;
        for (int g = 0; g < 4; ++g, ql += 32) {
            uint8_t sc, m;
            get_scale_min_k4(2 * g, x[i].scales, &sc, &m);
            const float d1 = d * float(sc), m1 = dmin * float(m);
            get_scale_min_k4(2 * g + 1, x[i].scales, &sc, &m);
            const float d2 = d * float(sc), m2 = dmin * float(m);
            const uint8_t u1 = uint8_t(1 << (2 * g)), u2 = uint8_t(2 << (2 * g));
            for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void dequant_q6_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(x[i].d);
        const uint8_t* ql = x[i].ql;
        const uint8_t* qh = x[i].qh;
        const int8_t* sc = x[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * float(sc[is]) * float(q1);
                y[l + 32] = d * float(sc[is + 2]) * float(q2);
                y[l + 64] = d * float(sc[is + 4]) * float(q3);
                y[l + 96] = d * float(sc[is + 6]) * float(q4);
            }
        }
    }
}

// Q3_KV (blocks.h). The block's scale: its root mean square picks the codes (the quantizer is the
// Lloyd-Max one of a Gaussian of that deviation), then d = sum(x v) / sum(v v) over the chosen levels v,
// the least-squares scale of those codes. Sums run as the butterfly of a 32-lane warp (pairs 16 apart,
// then 8, 4, 2, 1), so that the CUDA stores compute the same floats.
float q3_kv_tree_sum(float* s) {
    for (int off = 16; off > 0; off >>= 1)
        for (int j = 0; j < off; ++j) s[j] = s[j] + s[j + off];
    return s[0];
}

void dequant_q3_kv(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ3_KV*>(src);
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 32; ++j) {
            const int c = (x[i].qs[j / 4] >> (2 * (j % 4)) & 3) | (x[i].qh[j / 8] >> (j % 8) & 1) << 2;
            y[j] = d * kQ3KVValues[c];
        }
    }
}

void quant_q3_kv(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ3_KV*>(dst);
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        float s[32];
        for (int j = 0; j < 32; ++j) s[j] = x[j] * x[j];
        const float ss = q3_kv_tree_sum(s);
        std::memset(&y[i], 0, sizeof(BlockQ3_KV));
        if (ss == 0.0f) continue;  // d = 0: every element decodes to 0
        const float is = 1.0f / std::sqrt(ss / 32.0f);
        float xv[32], vv[32];
        for (int j = 0; j < 32; ++j) {
            const float t = std::fabs(x[j] * is);
            const int m = (t > kQ3KVBounds[0]) + (t > kQ3KVBounds[1]) + (t > kQ3KVBounds[2]);
            const int sg = x[j] < 0.0f;
            const float v = kQ3KVValues[m | sg << 2];
            xv[j] = x[j] * v;
            vv[j] = v * v;
            y[i].qs[j / 4] |= uint8_t(m << (2 * (j % 4)));
            y[i].qh[j / 8] |= uint8_t(sg << (j % 8));
        }
        const float sxv = q3_kv_tree_sum(xv);
        y[i].d = f2h(sxv / q3_kv_tree_sum(vv));
    }
}

// Q4_KV (blocks.h): Q4_0's codes under the nearest one-byte scales to max / -8 on either side; the one
// whose codes leave the smaller squared error wins (the smaller scale clips the block's extreme a little,
// the larger codes the rest more coarsely), the larger on a tie.
void dequant_q4_kv(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ4_KV*>(src);
    for (int64_t i = 0; i < n / 32; ++i, y += 32) dequant_nibbles(x[i].qs, kQ4KVScales.v[x[i].e], y);
}

void quant_q4_kv(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ4_KV*>(dst);
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude (first one wins)
        for (int j = 0; j < 32; ++j)
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
        y[i].e = 0;
        std::memset(y[i].qs, 0x88, sizeof y[i].qs);
        if (amax == 0.0f) continue;
        // k0: the largest k with scale(k) <= amax / 8 (1 if none); the candidates k0 and k0 + 1.
        const float want = amax / 8.0f;
        int lo = 1, hi = 127;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (kQ4KVScales.v[mid] <= want)
                lo = mid;
            else
                hi = mid - 1;
        }
        const uint8_t sign = max > 0.0f ? 0x80 : 0;  // d = max / -8
        float best = INFINITY;
        for (int k = lo; k <= std::min(lo + 1, 127); ++k) {
            const uint8_t e = uint8_t(k) | sign;
            const float d = kQ4KVScales.v[e], id = 1.0f / d;
            uint8_t qs[16];
            float err = 0.0f;
            for (int j = 0; j < 32; ++j) {
                // floor and clamp in one: truncation of the value clamped to [0, 15]
                const int q = int(std::min(std::max(x[j] * id + 8.5f, 0.0f), 15.0f));
                const float r = x[j] - float(q - 8) * d;
                err += r * r;
                if (j < 16)
                    qs[j] = uint8_t(q);
                else
                    qs[j - 16] |= uint8_t(q << 4);
            }
            if (err <= best) best = err, y[i].e = e, std::memcpy(y[i].qs, qs, sizeof qs);
        }
    }
}

void dequant_q8_k(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i)
        for (int j = 0; j < kQK_K; ++j) *y++ = x[i].d * float(x[i].qs[j]);
}

// A K-quant quantizer with no importance matrix: the reference.
template <void (*F)(const float*, void*, int64_t, const float*)>
void unweighted(const float* x, void* dst, int64_t n) {
    F(x, dst, n, nullptr);
}

constexpr QuantTraits kTraits[] = {
    {GgmlType::kF32, 1, 4, dequant_f32, quant_f32, nullptr},
    {GgmlType::kF16, 1, 2, dequant_f16, quant_f16, nullptr},
    {GgmlType::kBF16, 1, 2, dequant_bf16, quant_bf16, nullptr},
    {GgmlType::kQ4_0, kQK4_0, sizeof(BlockQ4_0), dequant_q4_0, quant_q4_0, quant_q4_0_weighted},
    {GgmlType::kQ4_1, kQK4_1, sizeof(BlockQ4_1), dequant_q4_1, quant_q4_1, quant_q4_1_weighted},
    {GgmlType::kQ5_0, kQK5_0, sizeof(BlockQ5_0), dequant_q5_0, quant_q5_0, quant_q5_0_weighted},
    {GgmlType::kQ5_1, kQK5_1, sizeof(BlockQ5_1), dequant_q5_1, quant_q5_1, quant_q5_1_weighted},
    {GgmlType::kQ8_0, kQK8_0, sizeof(BlockQ8_0), dequant_q8_0, quant_q8_0, nullptr},
    {GgmlType::kQ8_1, kQK8_1, sizeof(BlockQ8_1), dequant_q8_1, quant_q8_1, nullptr},
    {GgmlType::kQ2_K, kQK_K, sizeof(BlockQ2_K), dequant_q2_k, unweighted<quant_q2_k>, quant_q2_k},
    {GgmlType::kQ3_K, kQK_K, sizeof(BlockQ3_K), dequant_q3_k, unweighted<quant_q3_k>, quant_q3_k},
    {GgmlType::kQ4_K, kQK_K, sizeof(BlockQ4_K), dequant_q4_k, unweighted<quant_q4_k>, quant_q4_k},
    {GgmlType::kQ5_K, kQK_K, sizeof(BlockQ5_K), dequant_q5_k, unweighted<quant_q5_k>, quant_q5_k},
    {GgmlType::kQ6_K, kQK_K, sizeof(BlockQ6_K), dequant_q6_k, unweighted<quant_q6_k>, quant_q6_k},
    {GgmlType::kQ8_K, kQK_K, sizeof(BlockQ8_K), dequant_q8_k, quant_q8_k, nullptr},
    {GgmlType::kIQ4_NL, 32, sizeof(BlockIQ4_NL), dequant_iq4_nl, unweighted<quant_iq4_nl>, quant_iq4_nl},
    {GgmlType::kIQ4_XS, kQK_K, sizeof(BlockIQ4_XS), dequant_iq4_xs, unweighted<quant_iq4_xs>, quant_iq4_xs},
    {GgmlType::kQ3_KV, 32, sizeof(BlockQ3_KV), dequant_q3_kv, quant_q3_kv, nullptr},
    {GgmlType::kQ4_KV, 32, sizeof(BlockQ4_KV), dequant_q4_kv, quant_q4_kv, nullptr},
};

void check_row(const QuantTraits& t, int64_t n) {
    CERA_CHECK(n >= 0 && n % t.block_size == 0, "%s row of %lld elements is not a multiple of the block size %lld",
               type_name(t.type), (long long)n, (long long)t.block_size);
    CERA_CHECK(type_info(t.type).type_size == t.type_size, "%s block size disagrees with dtype.cpp", type_name(t.type));
}

}  // namespace

const QuantTraits* quant_traits(GgmlType type) {
    for (const QuantTraits& t : kTraits)
        if (t.type == type) return &t;
    return nullptr;
}

bool can_dequantize(GgmlType type) {
    const QuantTraits* t = quant_traits(type);
    return t != nullptr && t->dequantize != nullptr;
}

bool can_quantize(GgmlType type) {
    const QuantTraits* t = quant_traits(type);
    return t != nullptr && t->quantize != nullptr;
}

void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n) {
    const QuantTraits* t = quant_traits(type);
    if (t == nullptr || t->dequantize == nullptr) {
        const TypeInfo* ti = type_info(uint32_t(type));
        throw_error(ErrorCode::kUnsupported, "cannot dequantize tensor type %s", ti ? ti->name : "(unknown)");
    }
    check_row(*t, n);
    t->dequantize(src, dst, n);
}

bool takes_imatrix(GgmlType type) {
    const QuantTraits* t = quant_traits(type);
    return t != nullptr && t->quantize_weighted != nullptr;
}

void quantize_row_imatrix(GgmlType type, const float* src, void* dst, int64_t n, const float* imatrix) {
    const QuantTraits* t = quant_traits(type);
    if (imatrix == nullptr || t == nullptr || t->quantize_weighted == nullptr)
        return quantize_row_ref(type, src, dst, n);
    check_row(*t, n);
    t->quantize_weighted(src, dst, n, imatrix);
}

void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n) {
    const QuantTraits* t = quant_traits(type);
    if (t == nullptr || t->quantize == nullptr) {
        const TypeInfo* ti = type_info(uint32_t(type));
        throw_error(ErrorCode::kUnsupported, "cannot quantize to tensor type %s", ti ? ti->name : "(unknown)");
    }
    check_row(*t, n);
    t->quantize(src, dst, n);
}

}  // namespace cera
