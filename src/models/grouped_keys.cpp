#include "models/grouped_keys.h"

#include <cstring>

#include "core/check.h"
#include "core/quant/kv_groups.h"
#include "core/quant/quant.h"

namespace cera {
namespace {

constexpr int64_t kG = kv_groups::kRows;

int slots_of(const LayerCache& c) { return int(c.k_open.ne[1] / (kG + 1)); }

std::vector<uint8_t> read_open(Backend& be, const LayerCache& c) {
    std::vector<uint8_t> open(c.k_open.n_bytes());
    be.read(open.data(), c.k_open, open.size());
    return open;
}

}  // namespace

int64_t key_cache_rows(GgmlType type, int64_t n_ctx) {
    return type == GgmlType::kQ4_CH ? (n_ctx + kG - 1) / kG * kG : n_ctx;
}

Tensor alloc_open_groups(Backend& be, int64_t width, int slots) {
    Tensor t = be.alloc(GgmlType::kQ8_0, {width, kv_groups::open_rows(slots)});
    std::vector<uint8_t> host(kv_groups::open_bytes(width, slots), 0);
    kv_groups::clear_open(host.data(), width, slots);
    be.write(t, host.data(), host.size());
    return t;
}

size_t saved_key_bytes(const LayerCache& c, int32_t n) {
    if (c.k.type != GgmlType::kQ4_CH) return c.k.row_bytes() * size_t(n);
    const int64_t width = c.k.ne[0];
    return kv_groups::group_bytes(width) * size_t((n + kG - 1) / kG) +
           size_t(n % kG) * kv_groups::open_row_bytes(width);
}

void save_keys(Backend& be, const LayerCache& c, int32_t n, uint8_t* out) {
    if (c.k.type != GgmlType::kQ4_CH) return be.read(out, c.k, c.k.row_bytes() * size_t(n));
    const int64_t width = c.k.ne[0], groups = (n + kG - 1) / kG;
    const size_t gb = kv_groups::group_bytes(width);
    be.read(out, c.k, gb * size_t(groups));
    if (n % kG == 0) return;
    // The last group's rows as its slot holds them, not as coded: a restored state goes on exactly as this
    // one would.
    const std::vector<uint8_t> open = read_open(be, c);
    kv_groups::read_row_bytes(out + gb * size_t(groups - 1), open.data(), slots_of(c), groups - 1, int(n % kG), width,
                              out + gb * size_t(groups));
}

void restore_keys(Backend& be, const LayerCache& c, int32_t n, const uint8_t* in) {
    if (c.k.type != GgmlType::kQ4_CH) return be.write(c.k, in, c.k.row_bytes() * size_t(n));
    const int64_t width = c.k.ne[0], groups = (n + kG - 1) / kG;
    const size_t gb = kv_groups::group_bytes(width);
    be.write(c.k, in, gb * size_t(groups));
    std::vector<uint8_t> open(c.k_open.n_bytes());
    kv_groups::clear_open(open.data(), width, slots_of(c));
    if (n % kG != 0) {
        // Coded again into a copy (the same bytes as the saved group's): the slot takes the rows.
        std::vector<uint8_t> group(in + gb * size_t(groups - 1), in + gb * size_t(groups));
        kv_groups::write_rows(group.data(), open.data(), slots_of(c), groups - 1, int(n % kG), width,
                              in + gb * size_t(groups));
    }
    be.write(c.k_open, open.data(), open.size());
}

void read_key_rows(Backend& be, const LayerCache& c, int64_t begin, int64_t end, std::vector<float>& out) {
    CERA_CHECK(c.k.type == GgmlType::kQ4_CH && begin % kG == 0 && end >= begin);
    const int64_t width = c.k.ne[0], g0 = begin / kG, g1 = (end + kG - 1) / kG;
    const size_t gb = kv_groups::group_bytes(width);
    std::vector<uint8_t> cache(gb * size_t(g1 - g0));  // groups [g0, g1)
    be.read(cache.data(), c.k, cache.size(), gb * size_t(g0));
    const std::vector<uint8_t> open = read_open(be, c);
    out.assign(size_t(end - begin) * size_t(width), 0.0f);
    for (int64_t g = g0; g < g1; ++g) {
        const int n = int(std::min(end - g * kG, kG));
        kv_groups::read_rows(cache.data() + gb * size_t(g - g0), open.data(), slots_of(c), g, n, width,
                             out.data() + size_t(g * kG - begin) * size_t(width));
    }
}

void write_key_rows(Backend& be, const LayerCache& c, int64_t begin, const std::vector<float>& rows) {
    CERA_CHECK(c.k.type == GgmlType::kQ4_CH && begin % kG == 0);
    const int64_t width = c.k.ne[0], n = int64_t(rows.size()) / width, g0 = begin / kG, g1 = (begin + n + kG - 1) / kG;
    if (n == 0) return;
    const size_t gb = kv_groups::group_bytes(width);
    std::vector<uint8_t> cache(gb * size_t(g1 - g0));  // groups [g0, g1)
    std::vector<uint8_t> open(c.k_open.n_bytes()), q(size_t(kG) * kv_groups::open_row_bytes(width));
    kv_groups::clear_open(open.data(), width, slots_of(c));
    for (int64_t g = g0; g < g1; ++g) {
        const int m = int(std::min(begin + n - g * kG, kG));
        quantize_row_ref(GgmlType::kQ8_0, rows.data() + size_t(g * kG - begin) * size_t(width), q.data(),
                         int64_t(m) * width);
        kv_groups::write_rows(cache.data() + gb * size_t(g - g0), open.data(), slots_of(c), g, m, width, q.data());
    }
    be.write(c.k, cache.data(), cache.size(), gb * size_t(g0));
    be.write(c.k_open, open.data(), open.size());
}

}  // namespace cera
