// The scalar specification of the attention kernels (kernels_attention.h): each row's scores in
// one pass over its keys, the maximum found first, then the softmax and the weighted sum of the
// values in a second pass. Plain loops; the AVX2 and AVX-512 kernels are checked against it.
#include "backends/cpu/kernels_attention.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/quant/kv_groups.h"
#include "core/quant/quant.h"

namespace cera::cpu_attention {
namespace {

// Dot product with 8 independent partial sums (lets the compiler keep them in vector registers
// without reassociating a single sum).
inline float dot_f32(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

}  // namespace

void rows_ref(const Args& a, int64_t r0, int64_t r1, float* scratch) {
    const int hd = a.head_dim;
    float* acc = scratch;
    float* kv_buf = acc + hd;  // a head's blocks: up to head_dim + 62 elements
    float* scores = kv_buf + hd + 64;
    // head_dim elements from element offset off. A head of a block type may start inside a block and
    // end inside another (heads narrower than a block share it): its blocks are decoded whole.
    auto row = [&](const void* base, Elem type, int64_t off) -> const float* {
        switch (type) {
            case Elem::kF32:
                return static_cast<const float*>(base) + off;
            case Elem::kF16:
            case Elem::kBF16: {
                const uint16_t* s = static_cast<const uint16_t*>(base) + off;
                for (int d = 0; d < hd; ++d) kv_buf[d] = type == Elem::kF16 ? fp16_to_fp32(s[d]) : bf16_to_fp32(s[d]);
                return kv_buf;
            }
            case Elem::kQ8_0:
            case Elem::kQ4_0:
            case Elem::kQ3_KV:
            case Elem::kQ4_KV: {
                const GgmlType t = type == Elem::kQ8_0    ? GgmlType::kQ8_0
                                   : type == Elem::kQ4_0  ? GgmlType::kQ4_0
                                   : type == Elem::kQ3_KV ? GgmlType::kQ3_KV
                                                          : GgmlType::kQ4_KV;
                const int64_t skip = off % 32;
                dequantize_row_ref(t, static_cast<const uint8_t*>(base) + (off / 32) * row_size(t, 32), kv_buf,
                                   (skip + hd + 31) / 32 * 32);
                return kv_buf + skip;
            }
            case Elem::kQ4_CH: {
                const auto* cache = static_cast<const uint8_t*>(base);
                const int64_t r = off / a.kv_width, c0 = off % a.kv_width;
                for (int d = 0; d < hd; ++d) kv_buf[d] = kv_groups::value(cache, r, c0 + d, a.kv_width);
                return kv_buf;
            }
        }
        return nullptr;
    };
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / a.n_head;
        const int h = int(r % a.n_head), hk = h / a.group;
        const float* qv = a.q + r * hd;
        const int32_t end = a.pos[t] + 1;
        const int32_t begin = key_begin(a, end), open = open_begin(a, end);
        float mx = -INFINITY;
        for (int32_t j = begin; j < end; ++j) {
            const float* kr = nullptr;
            if (j >= open)
                open_key(a, j, int64_t(hk) * hd, hd, kv_buf), kr = kv_buf;
            else
                kr = row(a.k, a.k_type, kv_row(a, j) * a.kv_width + int64_t(hk) * hd);
            const float s = dot_f32(qv, kr, hd) * a.scale;
            scores[j - begin] = s;
            mx = std::max(mx, s);
        }
        double sum = 0;
        for (int32_t j = 0; j < end - begin; ++j) {
            scores[j] = std::exp(scores[j] - mx);
            sum += scores[j];
        }
        std::fill(acc, acc + hd, 0.0f);
        for (int32_t j = begin; j < end; ++j) {
            const float w = scores[j - begin];
            const float* vr = row(a.v, a.v_type, kv_row(a, j) * a.kv_width + int64_t(hk) * hd);
            for (int d = 0; d < hd; ++d) acc[d] += w * vr[d];
        }
        float* o = a.out + r * hd;
        const float inv = float(1.0 / sum);
        for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
}

void block_ref(const Args& a, int64_t t0, int64_t t1, int hk, float* scratch) {
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = t * a.n_head + int64_t(hk) * a.group;
        rows_ref(a, r, r + a.group, scratch);
    }
}

}  // namespace cera::cpu_attention
