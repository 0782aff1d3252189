#include "core/quant/kv_groups.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

namespace cera::kv_groups {
namespace {

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

uint8_t* slot_rows(uint8_t* open, int64_t width, int slot) {
    return open + size_t(slot) * size_t(kRows + 1) * open_row_bytes(width);
}
const uint8_t* slot_rows(const uint8_t* open, int64_t width, int slot) {
    return open + size_t(slot) * size_t(kRows + 1) * open_row_bytes(width);
}

Header header(const uint8_t* open, int64_t width, int slot) {
    Header h;
    std::memcpy(&h, slot_rows(open, width, slot) + kRows * open_row_bytes(width), sizeof h);
    return h;
}

void set_header(uint8_t* open, int64_t width, int slot, const Header& h) {
    std::memcpy(slot_rows(open, width, slot) + kRows * open_row_bytes(width), &h, sizeof h);
}

int find(const uint8_t* open, int64_t width, int slots, int64_t g) {
    for (int s = 0; s < slots; ++s)
        if (header(open, width, s).group == g) return s;
    return -1;
}

// A slot for a new group: of those with a stamp below `fresh` (untouched by this call) if any, the empty
// or full ones first, then the oldest.
int take(const uint8_t* open, int64_t width, int slots, uint64_t fresh) {
    int best = -1;
    auto rank = [&](const Header& h) {
        return std::tuple(h.stamp >= fresh, !(h.group < 0 || h.valid == kRows), h.stamp);
    };
    for (int s = 0; s < slots; ++s)
        if (best < 0 || rank(header(open, width, s)) < rank(header(open, width, best))) best = s;
    return best;
}

uint64_t next_stamp(const uint8_t* open, int64_t width, int slots) {
    uint64_t m = 0;
    for (int s = 0; s < slots; ++s) m = std::max(m, header(open, width, s).stamp);
    return m + 1;
}

}  // namespace

void quantize(const float* x, int n, int64_t width, uint8_t* group) {
    CERA_CHECK(n >= 1 && n <= kRows, "kv group of %d rows", n);
    for (int64_t c = 0; c < width; ++c) {
        float mn = x[c], mx = x[c];
        for (int i = 1; i < n; ++i) mn = std::min(mn, x[i * width + c]), mx = std::max(mx, x[i * width + c]);
        const uint16_t d16 = fp32_to_fp16((mx - mn) / 15.0f), m16 = fp32_to_fp16(mn);
        const float d = fp16_to_fp32(d16), m = fp16_to_fp32(m16), id = d > 0.0f ? 1.0f / d : 0.0f;
        uint8_t* rec = group + c * kChannelBytes;
        std::memcpy(rec, &d16, 2);
        std::memcpy(rec + 2, &m16, 2);
        std::memset(rec + 4, 0, kRows / 2);
        for (int i = 0; i < n; ++i) {
            const float q = std::nearbyint((x[i * width + c] - m) * id);
            const int qi = int(std::clamp(q, 0.0f, 15.0f));
            rec[4 + i / 2] |= uint8_t(qi << (4 * (i & 1)));
        }
    }
}

void dequantize(const uint8_t* group, int n, int64_t width, float* x) {
    for (int64_t c = 0; c < width; ++c) {
        const uint8_t* rec = group + c * kChannelBytes;
        const float d = fp16_to_fp32(load_u16(rec)), m = fp16_to_fp32(load_u16(rec + 2));
        for (int i = 0; i < n; ++i) x[i * width + c] = m + d * float((rec[4 + i / 2] >> (4 * (i & 1))) & 15);
    }
}

float value(const uint8_t* cache, int64_t row, int64_t c, int64_t width) {
    const uint8_t* rec = cache + record_offset(row, c, width);
    const int i = int(row % kRows);
    return fp16_to_fp32(load_u16(rec + 2)) +
           fp16_to_fp32(load_u16(rec)) * float((rec[4 + i / 2] >> (4 * (i & 1))) & 15);
}

void round_rows(const float* x, int64_t n, int64_t width, float* out) {
    std::vector<uint8_t> q(open_row_bytes(width));
    for (int64_t r = 0; r < n; ++r) {
        quantize_row_ref(GgmlType::kQ8_0, x + r * width, q.data(), width);
        dequantize_row_ref(GgmlType::kQ8_0, q.data(), out + r * width, width);
    }
}

void clear_open(uint8_t* open, int64_t width, int slots) {
    CERA_CHECK(width % 32 == 0 && open_row_bytes(width) >= sizeof(Header), "kv groups: rows of %lld", (long long)width);
    for (int s = 0; s < slots; ++s) set_header(open, width, s, Header{-1, 0, 0, 0});
}

const uint8_t* find_open(const uint8_t* open, int64_t width, int slots, int64_t g, int rows) {
    const int s = find(open, width, slots, g);
    return s >= 0 && header(open, width, s).valid >= rows ? slot_rows(open, width, s) : nullptr;
}

void store(const float* k, const int32_t* rows, int64_t n_tokens, int64_t width, uint8_t* cache, uint8_t* open,
           int slots) {
    const uint64_t fresh = next_stamp(open, width, slots);
    uint64_t stamp = fresh;
    const size_t rb = open_row_bytes(width);
    std::vector<uint8_t> q(size_t(kRows) * rb);  // the group's rows as the slot holds them
    std::vector<float> x(size_t(kRows) * size_t(width));
    for (int64_t t = 0; t < n_tokens;) {
        const int64_t g = rows[t] / kRows;
        const int first = rows[t] % kRows;
        int64_t u = t + 1;
        while (u < n_tokens && rows[u] / kRows == g) {
            CERA_CHECK(rows[u] == rows[u - 1] + 1, "kv groups: rows %d then %d in one group", rows[u - 1], rows[u]);
            ++u;
        }
        const int n = first + int(u - t);
        uint8_t* group = cache + size_t(g) * group_bytes(width);
        read_row_bytes(group, open, slots, g, first, width, q.data());
        quantize_row_ref(GgmlType::kQ8_0, k + t * width, q.data() + size_t(first) * rb, (u - t) * width);
        dequantize_row_ref(GgmlType::kQ8_0, q.data(), x.data(), int64_t(n) * width);
        quantize(x.data(), n, width, group);
        int s = find(open, width, slots, g);
        if (s >= 0 || n < kRows) {
            if (s < 0) s = take(open, width, slots, fresh);
            std::memcpy(slot_rows(open, width, s), q.data(), size_t(n) * rb);
            set_header(open, width, s, Header{g, n, 0, stamp++});
        }
        t = u;
    }
}

void read_rows(const uint8_t* group, const uint8_t* open, int slots, int64_t g, int n, int64_t width, float* x) {
    if (n == 0) return;
    if (const uint8_t* r = find_open(open, width, slots, g, n))
        return dequantize_row_ref(GgmlType::kQ8_0, r, x, int64_t(n) * width);
    dequantize(group, n, width, x);
}

void read_row_bytes(const uint8_t* group, const uint8_t* open, int slots, int64_t g, int n, int64_t width, uint8_t* q) {
    if (n == 0) return;
    if (const uint8_t* r = find_open(open, width, slots, g, n)) {
        std::memcpy(q, r, size_t(n) * open_row_bytes(width));
        return;
    }
    std::vector<float> x(size_t(n) * size_t(width));
    dequantize(group, n, width, x.data());
    quantize_row_ref(GgmlType::kQ8_0, x.data(), q, int64_t(n) * width);
}

void write_rows(uint8_t* group, uint8_t* open, int slots, int64_t g, int n, int64_t width, const uint8_t* q) {
    CERA_CHECK(n >= 1 && n <= kRows, "kv group of %d rows", n);
    int s = find(open, width, slots, g);
    if (s < 0) s = take(open, width, slots, next_stamp(open, width, slots));
    std::memcpy(slot_rows(open, width, s), q, size_t(n) * open_row_bytes(width));
    std::vector<float> x(size_t(n) * size_t(width));
    dequantize_row_ref(GgmlType::kQ8_0, q, x.data(), int64_t(n) * width);
    quantize(x.data(), n, width, group);
    set_header(open, width, s, Header{g, n, 0, next_stamp(open, width, slots)});
}

}  // namespace cera::kv_groups
