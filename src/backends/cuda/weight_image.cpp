// GGUF weight bytes -> the CUDA device image (layout in kernels.h), built on the host at upload.
#include <cstring>

#include "backends/cuda/kernels.h"
#include "core/check.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "core/quant/blocks.h"

namespace cera::cuda {

size_t weight_image_bytes(GgmlType type, int64_t rows, int64_t k) {
    const QuantLayout L = quant_layout(type);
    if (L.block_elems == 0) return row_size(type, k) * size_t(rows);
    return size_t(rows) * size_t(k / L.block_elems) * size_t(L.q_bytes + L.m_bytes);
}

namespace {

// The Q5_K scale stream: d, dmin, then the 8 scales and 8 mins (6 bits each) regrouped so that the
// four values of 64-element group g are byte g of three words (quant_device.cuh, k_group_scales):
//   word 1 byte g = sc(2g)   | (m(2g)   >> 4) << 6
//   word 2 byte g = sc(2g+1) | (m(2g+1) >> 4) << 6
//   word 3 byte g = (m(2g) & 15) | (m(2g+1) & 15) << 4
// Same 16 bytes as the GGUF fields; a lane decodes its group with shifts by 8g, no per-group branch.
void k_scale_stream(uint16_t d, uint16_t dmin, const uint8_t* scales, uint8_t* mo) {
    std::memcpy(mo, &d, 2);
    std::memcpy(mo + 2, &dmin, 2);
    for (int g = 0; g < 4; ++g) {
        uint8_t sc0, m0, sc1, m1;
        get_scale_min_k4(2 * g, scales, &sc0, &m0);
        get_scale_min_k4(2 * g + 1, scales, &sc1, &m1);
        mo[4 + g] = uint8_t(sc0 | (m0 >> 4) << 6);
        mo[8 + g] = uint8_t(sc1 | (m1 >> 4) << 6);
        mo[12 + g] = uint8_t((m0 & 15) | (m1 & 15) << 4);
    }
}

// The Q5_K qs as halves: 16-byte chunk c of the image = bytes 16 (c / 4) .. of group c % 4, i.e.
// chunk 2 (c % 4) + c / 4 of the GGUF qs (quant_device.cuh Q5kTraits).
void k_quants(const uint8_t* qs, uint8_t* qo) {
    for (int c = 0; c < 8; ++c) std::memcpy(qo + 16 * c, qs + 16 * (2 * (c % 4) + c / 4), 16);
}

// Q4_K as 32-element items (quant_device.cuh QTraits<kQ4_K>): chunk j of the quants = sub-block j,
// element l in the low nibble of byte l and l + 16 in the high one; the scale stream: d, dmin, then
// sub-block j's scale and min at bytes 4 + 2j, 5 + 2j. Sub-block 2g is the low nibbles of GGUF qs
// bytes 32g .. 32g + 31, sub-block 2g + 1 their high nibbles.
void k4_items(const BlockQ4_K& b, uint8_t* qo, uint8_t* mo) {
    for (int j = 0; j < 8; ++j) {
        const uint8_t* src = b.qs + 32 * (j / 2);
        const int sh = 4 * (j % 2);
        for (int l = 0; l < 16; ++l)
            qo[16 * j + l] = uint8_t(((src[l] >> sh) & 15) | ((src[l + 16] >> sh) & 15) << 4);
    }
    std::memcpy(mo, &b.d, 2);
    std::memcpy(mo + 2, &b.dmin, 2);
    for (int j = 0; j < 8; ++j) get_scale_min_k4(j, b.scales, mo + 4 + 2 * j, mo + 5 + 2 * j);
}

// Splits every block into its quant part (q) and scale part (m).
template <class B, class F>
void split_blocks(const void* gguf, int64_t n_blocks, uint8_t* q, uint8_t* m, const QuantLayout& L, F&& fn) {
    const B* b = static_cast<const B*>(gguf);
    for (int64_t i = 0; i < n_blocks; ++i) fn(b[i], q + i * L.q_bytes, m + i * L.m_bytes);
}

}  // namespace

void make_weight_image(GgmlType type, const void* gguf, int64_t rows, int64_t k, void* image) {
    const QuantLayout L = quant_layout(type);
    if (L.block_elems == 0) {
        std::memcpy(image, gguf, row_size(type, k) * size_t(rows));
        return;
    }
    CERA_CHECK(k % L.block_elems == 0);
    const int64_t n = rows * (k / L.block_elems);
    uint8_t* q = static_cast<uint8_t*>(image);
    uint8_t* m = q + n * L.q_bytes;
    switch (type) {
        case GgmlType::kQ4_0:
            split_blocks<BlockQ4_0>(gguf, n, q, m, L, [](const BlockQ4_0& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 16);
                std::memcpy(mo, &b.d, 2);
            });
            break;
        case GgmlType::kQ4_1:
            split_blocks<BlockQ4_1>(gguf, n, q, m, L, [](const BlockQ4_1& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 16);
                std::memcpy(mo, &b.d, 2);
                std::memcpy(mo + 2, &b.m, 2);
            });
            break;
        case GgmlType::kQ5_0:
            split_blocks<BlockQ5_0>(gguf, n, q, m, L, [](const BlockQ5_0& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 16);
                std::memset(mo, 0, 8);
                std::memcpy(mo, &b.d, 2);
                std::memcpy(mo + 4, b.qh, 4);
            });
            break;
        case GgmlType::kQ5_1:
            split_blocks<BlockQ5_1>(gguf, n, q, m, L, [](const BlockQ5_1& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 16);
                std::memcpy(mo, &b.d, 2);
                std::memcpy(mo + 2, &b.m, 2);
                std::memcpy(mo + 4, b.qh, 4);
            });
            break;
        case GgmlType::kQ8_0:
            split_blocks<BlockQ8_0>(gguf, n, q, m, L, [](const BlockQ8_0& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 32);
                std::memcpy(mo, &b.d, 2);
            });
            break;
        case GgmlType::kQ4_K:
            split_blocks<BlockQ4_K>(gguf, n, q, m, L, k4_items);
            break;
        case GgmlType::kQ5_K:
            split_blocks<BlockQ5_K>(gguf, n, q, m, L, [](const BlockQ5_K& b, uint8_t* qo, uint8_t* mo) {
                k_quants(b.qs, qo);
                std::memcpy(qo + 128, b.qh, 32);
                k_scale_stream(b.d, b.dmin, b.scales, mo);
            });
            break;
        case GgmlType::kQ6_K:
            split_blocks<BlockQ6_K>(gguf, n, q, m, L, [](const BlockQ6_K& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.ql, 128);
                std::memcpy(qo + 128, b.qh, 64);
                std::memcpy(qo + 192, b.scales, 16);
                std::memcpy(mo, &b.d, 2);
            });
            break;
        case GgmlType::kQ2_K:
            split_blocks<BlockQ2_K>(gguf, n, q, m, L, [](const BlockQ2_K& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 64);
                std::memcpy(mo, &b.d, 2);
                std::memcpy(mo + 2, &b.dmin, 2);
                std::memcpy(mo + 4, b.scales, 16);
            });
            break;
        case GgmlType::kQ3_K:
            split_blocks<BlockQ3_K>(gguf, n, q, m, L, [](const BlockQ3_K& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 64);
                std::memcpy(qo + 64, b.hmask, 32);
                std::memset(mo, 0, 4);
                std::memcpy(mo, &b.d, 2);
                int8_t sc[16];
                unpack_q3_k_scales(b.scales, sc);
                for (int j = 0; j < 16; ++j) mo[4 + j] = uint8_t(int8_t(sc[j] - 32));
            });
            break;
        case GgmlType::kIQ4_NL:
            split_blocks<BlockIQ4_NL>(gguf, n, q, m, L, [](const BlockIQ4_NL& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 16);
                std::memcpy(mo, &b.d, 2);
            });
            break;
        case GgmlType::kIQ4_XS:
            split_blocks<BlockIQ4_XS>(gguf, n, q, m, L, [](const BlockIQ4_XS& b, uint8_t* qo, uint8_t* mo) {
                std::memcpy(qo, b.qs, 128);
                std::memcpy(mo, &b.d, 2);
                std::memcpy(mo + 2, &b.scales_h, 2);
                std::memcpy(mo + 4, b.scales_l, 4);
            });
            break;
        default: CERA_CHECK(false, "no CUDA image layout for %s", type_name(type));
    }
}

std::vector<uint8_t> expand_to_f16(GgmlType type, const void* gguf, int64_t rows, int64_t k) {
    if (!can_dequantize(type))
        throw_error(ErrorCode::kUnsupported, "CUDA backend: weight type %s is not supported", type_name(type));
    std::vector<uint8_t> out(size_t(rows * k) * 2);
    std::vector<float> row(static_cast<size_t>(k));
    const size_t rb = row_size(type, k);
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_ref(type, static_cast<const uint8_t*>(gguf) + size_t(r) * rb, row.data(), k);
        uint16_t* d = reinterpret_cast<uint16_t*>(out.data()) + r * k;
        for (int64_t i = 0; i < k; ++i) d[i] = fp32_to_fp16(row[size_t(i)]);
    }
    return out;
}

}  // namespace cera::cuda
