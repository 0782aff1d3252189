// Repacking of weight matrices into the CPU's interleaved layouts (repack.h) and the registry of
// packed images. Scalar, run once per weight at load time.
#include "backends/cpu/repack.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "core/check.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

namespace cera::cpu {
namespace {

constexpr int R = kPackRows;

void put_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

// The 32-block types with a min or a 5th bit (Q4_1, Q5_0, Q5_1): where the fields of a GGUF block
// are, and the size of a packed pair of blocks (repack.h).
struct Small32 {
    size_t bbytes, m_off, qh_off, qs_off;  // m_off / qh_off 0: no such field
    bool min() const { return m_off != 0; }
    bool high() const { return qh_off != 0; }
    int lines() const { return high() ? 5 : 4; }
    size_t header() const { return min() ? 128 : 64; }
    size_t pair_bytes() const { return header() + 2 * size_t(lines()) * 64; }
};
Small32 small32(GgmlType type) {
    switch (type) {
        case GgmlType::kQ4_1:
            return {sizeof(BlockQ4_1), 2, 0, 4};
        case GgmlType::kQ5_0:
            return {sizeof(BlockQ5_0), 0, 2, 6};
        case GgmlType::kQ5_1:
            return {sizeof(BlockQ5_1), 2, 4, 8};
        default:
            return {0, 0, 0, 0};
    }
}

// One group: rows [r0, r0 + 16) of w (rows past `rows` are padding) -> out.
void pack_group(GgmlType type, const uint8_t* w, size_t rs, int64_t r0, int64_t rows, int64_t k, uint8_t* out) {
    auto row = [&](int r) -> const uint8_t* { return r0 + r < rows ? w + size_t(r0 + r) * rs : nullptr; };
    const int64_t nb = k / 32, nsb = k / kQK_K;
    switch (type) {
        case GgmlType::kQ4_0:
        case GgmlType::kIQ4_NL:
        case GgmlType::kQ8_0: {
            const bool q8 = type == GgmlType::kQ8_0;
            const size_t bbytes = q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
            const int lines = q8 ? 8 : 4;
            const size_t pair_bytes = 64 + 2 * size_t(lines) * 64;
            for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
                uint8_t* o = out + size_t(p) * pair_bytes;
                for (int h = 0; h < 2; ++h) {
                    const int64_t b = 2 * p + h;
                    for (int r = 0; r < R; ++r) {
                        const uint8_t* src = row(r);
                        const uint8_t* blk = (src != nullptr && b < nb) ? src + size_t(b) * bbytes : nullptr;
                        uint16_t d = 0;
                        if (blk != nullptr) std::memcpy(&d, blk, 2);
                        std::memcpy(o + 2 * (h * R + r), &d, 2);
                        for (int j = 0; j < lines; ++j)
                            for (int i = 0; i < 4; ++i) {
                                uint8_t c = blk != nullptr ? blk[2 + 4 * j + i] : (q8 ? 0 : 0x88);
                                if (q8) c ^= 0x80;
                                o[64 + size_t(h * lines + j) * 64 + 4 * r + i] = c;
                            }
                    }
                }
            }
            return;
        }
        case GgmlType::kF16: {
            for (int r = 0; r < R; ++r) {
                const uint8_t* src = row(r);
                for (int64_t i = 0; i < k; ++i) {
                    uint8_t* o = out + 32 * size_t(i) + 2 * r;
                    if (src != nullptr)
                        std::memcpy(o, src + 2 * i, 2);
                    else
                        o[0] = o[1] = 0;
                }
            }
            return;
        }
        case GgmlType::kBF16: {
            for (int r = 0; r < R; ++r) {
                const uint8_t* src = row(r);
                for (int64_t i = 0; i < (k + 1) / 2 * 2; ++i) {
                    uint8_t* o = out + 64 * size_t(i / 2) + 4 * r + 2 * (i % 2);
                    if (src != nullptr && i < k)
                        std::memcpy(o, src + 2 * i, 2);
                    else
                        o[0] = o[1] = 0;
                }
            }
            return;
        }
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_0:
        case GgmlType::kQ5_1: {
            const Small32 L = small32(type);
            const int lines = L.lines();
            for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
                uint8_t* o = out + size_t(p) * L.pair_bytes();
                for (int h = 0; h < 2; ++h) {
                    const int64_t b = 2 * p + h;
                    for (int r = 0; r < R; ++r) {
                        const uint8_t* src = row(r);
                        const uint8_t* blk = (src != nullptr && b < nb) ? src + size_t(b) * L.bbytes : nullptr;
                        uint16_t d = 0, m = 0;
                        uint32_t qh = 0;
                        if (blk != nullptr) {
                            std::memcpy(&d, blk, 2);
                            if (L.min()) std::memcpy(&m, blk + L.m_off, 2);
                            if (L.high()) std::memcpy(&qh, blk + L.qh_off, 4);
                        }
                        std::memcpy(o + 2 * (h * R + r), &d, 2);
                        if (L.min()) std::memcpy(o + 64 + 2 * (h * R + r), &m, 2);
                        uint8_t* q = o + L.header() + size_t(h * lines) * 64 + 4 * r;
                        for (int j = 0; j < 4; ++j)
                            for (int i = 0; i < 4; ++i) q[64 * j + i] = blk != nullptr ? blk[L.qs_off + 4 * j + i] : 0;
                        if (L.high())
                            for (int i = 0; i < 4; ++i) {
                                uint8_t v = 0;
                                for (int j = 0; j < 4; ++j)
                                    v |= uint8_t(((qh >> (4 * j + i)) & 1) << j | ((qh >> (16 + 4 * j + i)) & 1)
                                                                                      << (4 + j));
                                q[64 * 4 + i] = v;
                            }
                    }
                }
            }
            return;
        }
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K: {
            // Q4_K and Q5_K share d, dmin and the scales; Q5_K's qh comes before its qs
            const bool q5 = type == GgmlType::kQ5_K;
            const size_t bbytes = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K), qs_off = q5 ? 48 : 16;
            const size_t sbytes = packed_group_bytes(type, kQK_K);
            for (int64_t sb = 0; sb < nsb; ++sb) {
                uint8_t* o = out + size_t(sb) * sbytes;
                for (int r = 0; r < R; ++r) {
                    const uint8_t* src = row(r);
                    const uint8_t* blk = src != nullptr ? src + size_t(sb) * bbytes : nullptr;
                    uint16_t d = 0, dmin = 0;
                    if (blk != nullptr) std::memcpy(&d, blk, 2), std::memcpy(&dmin, blk + 2, 2);
                    std::memcpy(o + 2 * r, &d, 2);
                    std::memcpy(o + 32 + 2 * r, &dmin, 2);
                    for (int s = 0; s < 8; ++s) {
                        uint8_t sc = 0, m = 0;
                        if (blk != nullptr) get_scale_min_k4(s, blk + 4, &sc, &m);
                        o[64 + 16 * s + r] = sc;
                        o[192 + 16 * s + r] = m;
                    }
                    for (int l = 0; l < 32; ++l)
                        for (int i = 0; i < 4; ++i)
                            o[320 + 64 * l + 4 * r + i] = blk != nullptr ? blk[qs_off + 4 * l + i] : 0;
                    if (q5)
                        for (int j = 0; j < 8; ++j)
                            for (int i = 0; i < 4; ++i)
                                o[2368 + 64 * j + 4 * r + i] = blk != nullptr ? blk[16 + 4 * j + i] : 0;
                }
            }
            return;
        }
        case GgmlType::kQ6_K: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                uint8_t* o = out + size_t(sb) * 3392;
                for (int r = 0; r < R; ++r) {
                    const uint8_t* src = row(r);
                    const auto* blk = src != nullptr ? reinterpret_cast<const BlockQ6_K*>(src) + sb : nullptr;
                    uint8_t code[256];
                    if (blk != nullptr) {
                        for (int n = 0; n < 2; ++n)
                            for (int l = 0; l < 32; ++l) {
                                const uint8_t* ql = blk->ql + 64 * n;
                                const uint8_t qh = blk->qh[32 * n + l];
                                code[128 * n + l] = uint8_t((ql[l] & 0xF) | ((qh & 3) << 4));
                                code[128 * n + l + 32] = uint8_t((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
                                code[128 * n + l + 64] = uint8_t((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
                                code[128 * n + l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
                            }
                    } else {
                        std::memset(code, 32, sizeof(code));
                    }
                    put_f32(o + 4 * r, blk != nullptr ? fp16_to_fp32(blk->d) : 0.0f);
                    for (int s = 0; s < 16; ++s) o[64 + 16 * s + r] = uint8_t(blk != nullptr ? blk->scales[s] : 0);
                    for (int q = 0; q < 32; ++q)
                        for (int i = 0; i < 4; ++i)
                            o[320 + 192 * (q % 16) + 64 * (q / 16) + 4 * r + i] =
                                uint8_t((code[4 * q + i] & 0xF) | ((code[128 + 4 * q + i] & 0xF) << 4));
                    for (int h = 0; h < 16; ++h)
                        for (int i = 0; i < 4; ++i) {
                            uint8_t v = 0;
                            for (int s = 0; s < 4; ++s) v |= uint8_t((code[64 * s + 4 * h + i] >> 4) << (2 * s));
                            o[320 + 192 * h + 128 + 4 * r + i] = v;
                        }
                }
            }
            return;
        }
        case GgmlType::kQ2_K:
        case GgmlType::kQ3_K: {
            const bool q3 = type == GgmlType::kQ3_K;
            const size_t sbytes = packed_group_bytes(type, kQK_K), codes_at = 320;  // after the header and the scales
            for (int64_t sb = 0; sb < nsb; ++sb) {
                uint8_t* o = out + size_t(sb) * sbytes;
                for (int r = 0; r < R; ++r) {
                    const uint8_t* src = row(r);
                    const uint8_t* qs = nullptr;
                    if (q3) {
                        const auto* blk = src != nullptr ? reinterpret_cast<const BlockQ3_K*>(src) + sb : nullptr;
                        put_f32(o + 4 * r, blk != nullptr ? fp16_to_fp32(blk->d) : 0.0f);
                        int8_t sc[16] = {};
                        if (blk != nullptr) unpack_q3_k_scales(blk->scales, sc);
                        for (int j = 0; j < 16; ++j) o[64 + 16 * j + r] = uint8_t(blk != nullptr ? sc[j] - 32 : 0);
                        for (int m = 0; m < 8; ++m)
                            for (int i = 0; i < 4; ++i)
                                o[codes_at + 1024 + 64 * m + 4 * r + i] = blk != nullptr ? blk->hmask[4 * m + i] : 0;
                        if (blk != nullptr) qs = blk->qs;
                    } else {
                        const auto* blk = src != nullptr ? reinterpret_cast<const BlockQ2_K*>(src) + sb : nullptr;
                        uint16_t d = 0, dmin = 0;
                        if (blk != nullptr) d = blk->d, dmin = blk->dmin;
                        std::memcpy(o + 2 * r, &d, 2);
                        std::memcpy(o + 32 + 2 * r, &dmin, 2);
                        for (int j = 0; j < 16; ++j) o[64 + 16 * j + r] = blk != nullptr ? blk->scales[j] : 0;
                        if (blk != nullptr) qs = blk->qs;
                    }
                    for (int l = 0; l < 16; ++l)
                        for (int i = 0; i < 4; ++i)
                            o[codes_at + 64 * l + 4 * r + i] = qs != nullptr ? qs[4 * l + i] : 0;
                }
            }
            return;
        }
        case GgmlType::kIQ4_XS: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                uint8_t* o = out + size_t(sb) * 2240;
                for (int r = 0; r < R; ++r) {
                    const uint8_t* src = row(r);
                    const auto* blk = src != nullptr ? reinterpret_cast<const BlockIQ4_XS*>(src) + sb : nullptr;
                    put_f32(o + 4 * r, blk != nullptr ? fp16_to_fp32(blk->d) : 0.0f);
                    for (int s = 0; s < 8; ++s)
                        o[64 + 16 * s + r] = uint8_t(blk != nullptr ? iq4_xs_scale(*blk, s) - 32 : 0);
                    for (int l = 0; l < 32; ++l)
                        for (int i = 0; i < 4; ++i)
                            o[192 + 64 * l + 4 * r + i] = blk != nullptr ? blk->qs[4 * l + i] : 0;
                }
            }
            return;
        }
        default:
            CERA_CHECK(false, "repack: no packed layout for %s", type_name(type));
    }
}

// The inverse of pack_group for one row: lane r of the group at `g` -> the row's GGUF blocks.
void unpack_lane(GgmlType type, const uint8_t* g, int r, int64_t k, uint8_t* out) {
    const int64_t nb = k / 32, nsb = k / kQK_K;
    switch (type) {
        case GgmlType::kQ4_0:
        case GgmlType::kIQ4_NL:
        case GgmlType::kQ8_0: {
            const bool q8 = type == GgmlType::kQ8_0;
            const size_t bbytes = q8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
            const int lines = q8 ? 8 : 4;
            const size_t pair_bytes = 64 + 2 * size_t(lines) * 64;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* o = g + size_t(b / 2) * pair_bytes;
                const int h = int(b % 2);
                uint8_t* blk = out + size_t(b) * bbytes;
                std::memcpy(blk, o + 2 * (h * R + r), 2);
                for (int j = 0; j < lines; ++j)
                    for (int i = 0; i < 4; ++i)
                        blk[2 + 4 * j + i] = uint8_t(o[64 + size_t(h * lines + j) * 64 + 4 * r + i] ^ (q8 ? 0x80 : 0));
            }
            return;
        }
        case GgmlType::kF16: {
            for (int64_t i = 0; i < k; ++i) std::memcpy(out + 2 * i, g + 32 * size_t(i) + 2 * r, 2);
            return;
        }
        case GgmlType::kBF16: {
            for (int64_t i = 0; i < k; ++i) std::memcpy(out + 2 * i, g + 64 * size_t(i / 2) + 4 * r + 2 * (i % 2), 2);
            return;
        }
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_0:
        case GgmlType::kQ5_1: {
            const Small32 L = small32(type);
            const int lines = L.lines();
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* o = g + size_t(b / 2) * L.pair_bytes();
                const int h = int(b % 2);
                uint8_t* blk = out + size_t(b) * L.bbytes;
                std::memcpy(blk, o + 2 * (h * R + r), 2);
                if (L.min()) std::memcpy(blk + L.m_off, o + 64 + 2 * (h * R + r), 2);
                const uint8_t* q = o + L.header() + size_t(h * lines) * 64 + 4 * r;
                for (int j = 0; j < 4; ++j)
                    for (int i = 0; i < 4; ++i) blk[L.qs_off + 4 * j + i] = q[64 * j + i];
                if (L.high()) {
                    uint32_t qh = 0;
                    for (int i = 0; i < 4; ++i)
                        for (int j = 0; j < 4; ++j) {
                            qh |= uint32_t((q[64 * 4 + i] >> j) & 1) << (4 * j + i);
                            qh |= uint32_t((q[64 * 4 + i] >> (4 + j)) & 1) << (16 + 4 * j + i);
                        }
                    std::memcpy(blk + L.qh_off, &qh, 4);
                }
            }
            return;
        }
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K: {
            const bool q5 = type == GgmlType::kQ5_K;
            const size_t bbytes = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K), qs_off = q5 ? 48 : 16;
            const size_t sbytes = packed_group_bytes(type, kQK_K);
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t* o = g + size_t(sb) * sbytes;
                uint8_t* blk = out + size_t(sb) * bbytes;
                std::memcpy(blk, o + 2 * r, 2);
                std::memcpy(blk + 2, o + 32 + 2 * r, 2);
                uint8_t sc[8], m[8];
                uint8_t* scales = blk + 4;
                for (int s = 0; s < 8; ++s) sc[s] = o[64 + 16 * s + r], m[s] = o[192 + 16 * s + r];
                for (int j = 0; j < 4; ++j) {  // get_scale_min_k4, backwards
                    scales[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
                    scales[j + 4] = uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
                    scales[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
                }
                for (int l = 0; l < 32; ++l)
                    for (int i = 0; i < 4; ++i) blk[qs_off + 4 * l + i] = o[320 + 64 * l + 4 * r + i];
                if (q5)
                    for (int j = 0; j < 8; ++j)
                        for (int i = 0; i < 4; ++i) blk[16 + 4 * j + i] = o[2368 + 64 * j + 4 * r + i];
            }
            return;
        }
        case GgmlType::kQ6_K: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t* o = g + size_t(sb) * 3392;
                auto* blk = reinterpret_cast<BlockQ6_K*>(out) + sb;
                float d;
                std::memcpy(&d, o + 4 * r, 4);
                blk->d = fp32_to_fp16(d);
                for (int s = 0; s < 16; ++s) blk->scales[s] = int8_t(o[64 + 16 * s + r]);
                uint8_t code[256];
                for (int q = 0; q < 32; ++q)
                    for (int i = 0; i < 4; ++i) {
                        const uint8_t v = o[320 + 192 * (q % 16) + 64 * (q / 16) + 4 * r + i];
                        code[4 * q + i] = v & 0xF;
                        code[128 + 4 * q + i] = v >> 4;
                    }
                for (int h = 0; h < 16; ++h)
                    for (int i = 0; i < 4; ++i) {
                        const uint8_t v = o[320 + 192 * h + 128 + 4 * r + i];
                        for (int s = 0; s < 4; ++s) code[64 * s + 4 * h + i] |= uint8_t(((v >> (2 * s)) & 3) << 4);
                    }
                for (int n = 0; n < 2; ++n)
                    for (int l = 0; l < 32; ++l) {
                        const uint8_t* c = code + 128 * n + l;
                        blk->ql[64 * n + l] = uint8_t((c[0] & 0xF) | ((c[64] & 0xF) << 4));
                        blk->ql[64 * n + l + 32] = uint8_t((c[32] & 0xF) | ((c[96] & 0xF) << 4));
                        blk->qh[32 * n + l] =
                            uint8_t((c[0] >> 4) | ((c[32] >> 4) << 2) | ((c[64] >> 4) << 4) | ((c[96] >> 4) << 6));
                    }
            }
            return;
        }
        case GgmlType::kQ2_K: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t* o = g + size_t(sb) * 1344;
                auto* blk = reinterpret_cast<BlockQ2_K*>(out) + sb;
                std::memcpy(&blk->d, o + 2 * r, 2);
                std::memcpy(&blk->dmin, o + 32 + 2 * r, 2);
                for (int j = 0; j < 16; ++j) blk->scales[j] = o[64 + 16 * j + r];
                for (int l = 0; l < 16; ++l)
                    for (int i = 0; i < 4; ++i) blk->qs[4 * l + i] = o[320 + 64 * l + 4 * r + i];
            }
            return;
        }
        case GgmlType::kQ3_K: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t* o = g + size_t(sb) * 1856;
                auto* blk = reinterpret_cast<BlockQ3_K*>(out) + sb;
                float d;
                std::memcpy(&d, o + 4 * r, 4);
                blk->d = fp32_to_fp16(d);
                std::memset(blk->scales, 0, sizeof blk->scales);
                for (int j = 0; j < 16; ++j) {  // unpack_q3_k_scales, backwards
                    const int sc = int(int8_t(o[64 + 16 * j + r])) + 32;
                    blk->scales[j % 8] |= uint8_t((sc & 0xF) << (4 * (j / 8)));
                    blk->scales[8 + j % 4] |= uint8_t((sc >> 4) << (2 * (j / 4)));
                }
                for (int l = 0; l < 16; ++l)
                    for (int i = 0; i < 4; ++i) blk->qs[4 * l + i] = o[320 + 64 * l + 4 * r + i];
                for (int m = 0; m < 8; ++m)
                    for (int i = 0; i < 4; ++i) blk->hmask[4 * m + i] = o[1344 + 64 * m + 4 * r + i];
            }
            return;
        }
        case GgmlType::kIQ4_XS: {
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t* o = g + size_t(sb) * 2240;
                auto* blk = reinterpret_cast<BlockIQ4_XS*>(out) + sb;
                float d;
                std::memcpy(&d, o + 4 * r, 4);
                blk->d = fp32_to_fp16(d);
                blk->scales_h = 0;
                std::memset(blk->scales_l, 0, sizeof blk->scales_l);
                for (int s = 0; s < 8; ++s) {
                    const int ls = int(int8_t(o[64 + 16 * s + r])) + 32;
                    blk->scales_l[s / 2] |= uint8_t((ls & 0xF) << (4 * (s % 2)));
                    blk->scales_h |= uint16_t((ls >> 4) << (2 * s));
                }
                for (int l = 0; l < 32; ++l)
                    for (int i = 0; i < 4; ++i) blk->qs[4 * l + i] = o[192 + 64 * l + 4 * r + i];
            }
            return;
        }
        default:
            CERA_CHECK(false, "unpack: no packed layout for %s", type_name(type));
    }
}

// Packed images live in 2 MiB-aligned chunks marked for transparent huge pages: decode streams
// every weight byte per token, and with 4 KiB pages each page costs a TLB miss and stops the
// hardware prefetcher (measured: 1-thread Q8_0 decode 41 -> 82 tok/s). Chunks are carved
// sequentially and freed when their last image is unregistered.
struct Chunk {
    uint8_t* base;
    size_t size, used;
    int live;
};
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kChunkBytes = size_t(32) << 20;

struct Entry {
    GgmlType type;
    int64_t rows, k;
    size_t group_stride;
    uint8_t* data;
    Chunk* chunk;
    uint64_t fingerprint;
    int refs;
    bool immutable;  // every registration so far was immutable: matmul calls skip the fingerprint
};

// A few 8-byte samples of the original matrix. The registry is keyed by address, and a caller
// may free a registered buffer and reuse its address for other weights (tests do, through a
// long-lived backend); a packed copy is used only while the samples still match, and a new
// registration at the address repacks when they do not. Weights in a read-only file mapping are
// registered immutable and never checked: their pages may be dropped once the copy exists, and a
// check would map them again. Four samples: a cheap check per matmul call, and any new quantized
// content changes them.
uint64_t fingerprint(const void* w, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(w);
    uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes;
    const size_t last = bytes >= 8 ? bytes - 8 : 0;
    for (size_t off : {size_t(0), last / 3 & ~size_t(7), 2 * (last / 3) & ~size_t(7), last}) {
        uint64_t v = 0;
        std::memcpy(&v, p + off, bytes >= 8 ? 8 : bytes);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

std::mutex g_mu;
std::vector<Chunk*> g_chunks;  // guarded by g_mu; the last one is being filled

uint8_t* arena_alloc(size_t bytes, Chunk** owner) {  // g_mu held
    bytes = (bytes + 4095) / 4096 * 4096;
    Chunk* c = g_chunks.empty() ? nullptr : g_chunks.back();
    if (c == nullptr || c->size - c->used < bytes) {
        const size_t size = std::max(kChunkBytes, (bytes + kHugePage - 1) / kHugePage * kHugePage);
        auto* base = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, size));
        if (base == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
        madvise(base, size, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
        c = new Chunk{base, size, 0, 0};
        g_chunks.push_back(c);
    }
    uint8_t* p = c->base + c->used;
    c->used += bytes;
    ++c->live;
    *owner = c;
    return p;
}

void arena_free(Chunk* c) {  // g_mu held
    if (--c->live > 0) return;
    std::free(c->base);
    g_chunks.erase(std::find(g_chunks.begin(), g_chunks.end(), c));
    delete c;
}
std::unordered_map<const void*, Entry>& registry() {
    static auto* m = new std::unordered_map<const void*, Entry>();  // never destroyed: used at exit
    return *m;
}

}  // namespace

size_t packed_group_bytes(GgmlType type, int64_t k) {
    switch (type) {
        case GgmlType::kQ4_0:
        case GgmlType::kIQ4_NL:
            return size_t((k / 32 + 1) / 2) * 576;
        case GgmlType::kQ8_0:
            return size_t((k / 32 + 1) / 2) * 1088;
        case GgmlType::kF16:
            return size_t(k) * 32;
        case GgmlType::kBF16:
            return size_t(k + 1) / 2 * 64;
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_0:
        case GgmlType::kQ5_1:
            return size_t((k / 32 + 1) / 2) * small32(type).pair_bytes();
        case GgmlType::kQ4_K:
            return size_t(k / kQK_K) * 2368;
        case GgmlType::kQ5_K:
            return size_t(k / kQK_K) * 2880;
        case GgmlType::kQ6_K:
            return size_t(k / kQK_K) * 3392;
        case GgmlType::kIQ4_XS:
            return size_t(k / kQK_K) * 2240;
        case GgmlType::kQ2_K:
            return size_t(k / kQK_K) * 1344;
        case GgmlType::kQ3_K:
            return size_t(k / kQK_K) * 1856;
        default:
            return 0;
    }
}

void unpack_row(GgmlType type, PackedView packed, int64_t r, int64_t k, uint8_t* out) {
    unpack_lane(type, packed.data + size_t(r / R) * packed.group_stride, int(r % R), k, out);
}

void repack_weights(GgmlType type, const void* w, int64_t rows, int64_t k, uint8_t* out) {
    const size_t gs = packed_group_bytes(type, k);
    CERA_CHECK(gs > 0, "repack: no packed layout for %s", type_name(type));
    const size_t rs = row_size(type, k);
    for (int64_t g = 0; g * R < rows; ++g)
        pack_group(type, static_cast<const uint8_t*>(w), rs, g * R, rows, k, out + size_t(g) * gs);
}

PackedView find_packed(const void* w, GgmlType type, int64_t rows, int64_t k) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto& reg = registry();
    if (reg.empty()) return {};
    auto it = reg.find(w);
    if (it == reg.end() || it->second.type != type || it->second.rows != rows || it->second.k != k) return {};
    const Entry& e = it->second;
    if (!e.immutable && fingerprint(w, row_size(type, k) * size_t(rows)) != e.fingerprint) return {};  // stale
    return {e.data, e.group_stride};
}

bool register_weight(GgmlType type, const void* w, int64_t rows, int64_t k, bool immutable) {
    return register_weight(active_table(), type, w, rows, k, immutable);
}

bool register_weight(const KernelTable& tab, GgmlType type, const void* w, int64_t rows, int64_t k, bool immutable) {
    // Packed copies only serve a kernel table that has a packed kernel for the type.
    if (uint32_t(type) >= uint32_t(kMaxTypeId) || tab.packed[int(type)].fn == nullptr) return false;
    const size_t gs = packed_group_bytes(type, k);
    if (gs == 0 || rows < 1 || k % type_info(type).block_size != 0) return false;
    const uint64_t fp = fingerprint(w, row_size(type, k) * size_t(rows));
    {
        std::lock_guard<std::mutex> lock(g_mu);
        auto it = registry().find(w);
        if (it != registry().end() && it->second.type == type && it->second.rows == rows && it->second.k == k &&
            it->second.fingerprint == fp) {
            ++it->second.refs;
            it->second.immutable = it->second.immutable && immutable;
            return true;
        }
    }
    const size_t bytes = size_t((rows + R - 1) / R) * gs;
    Chunk* chunk = nullptr;
    uint8_t* data;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        data = arena_alloc(bytes, &chunk);
    }
    if (data == nullptr) return false;
    repack_weights(type, w, rows, k, data);
    std::lock_guard<std::mutex> lock(g_mu);
    auto [it, inserted] = registry().emplace(w, Entry{type, rows, k, gs, data, chunk, fp, 1, immutable});
    if (!inserted) {
        Entry& e = it->second;
        if (e.type == type && e.rows == rows && e.k == k && e.fingerprint == fp) {
            arena_free(chunk);  // the same weights, registered by another thread meanwhile
            e.immutable = e.immutable && immutable;
        } else {
            // Other contents at a reused address: the earlier registrant's buffer is gone, so its
            // copy is replaced (the count keeps both registrations' unregister calls balanced).
            arena_free(e.chunk);
            e = Entry{type, rows, k, gs, data, chunk, fp, e.refs, immutable};
        }
        ++e.refs;
    }
    return true;
}

void unregister_weight(const void* w) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(w);
    if (it == registry().end()) return;
    if (--it->second.refs > 0) return;
    arena_free(it->second.chunk);
    registry().erase(it);
}

}  // namespace cera::cpu
