// Context shift: move the surviving KV rows down through host memory (the source and
// destination ranges overlap) and re-rotate the keys on the device with a position of -d.
#include "models/context_shift.h"

#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/quant/kv_groups.h"
#include "core/quant/quant.h"
#include "models/grouped_keys.h"

namespace cera {
namespace {

// Host rows of a cache ([n, width] of F32, F16, BF16, Q8_0 or Q4_0) to f32 and back (the keys are
// rotated in f32 and stored again in their type).
void rows_to_f32(const std::vector<uint8_t>& raw, GgmlType type, int64_t width, std::vector<float>& out) {
    const size_t row = row_size(type, width), n = raw.size() / row;
    out.resize(n * size_t(width));
    for (size_t r = 0; r < n; ++r) dequantize_row_ref(type, raw.data() + r * row, out.data() + r * size_t(width), width);
}

void f32_to_rows(const std::vector<float>& in, GgmlType type, int64_t width, std::vector<uint8_t>& raw) {
    const size_t row = row_size(type, width), n = in.size() / size_t(width);
    raw.resize(n * row);
    for (size_t r = 0; r < n; ++r) quantize_row_ref(type, in.data() + r * size_t(width), raw.data() + r * row, width);
}

// Q4_CH keys (grouped_keys.h): the groups from the one holding n_keep on are read as f32, the moved
// rows roped by -n_discard, and those groups coded again.
void shift_grouped_keys(Backend& be, const LayerStateSpec& sp, const LayerCache& c, const Tensor& pos, int32_t position,
                        int32_t n_keep, int32_t n_discard) {
    const int64_t width = sp.kv_width, begin = n_keep / kv_groups::kRows * kv_groups::kRows;
    const int64_t n_move = int64_t(position) - n_keep - n_discard;
    std::vector<float> rows;
    read_key_rows(be, c, begin, position, rows);
    std::vector<float> moved(rows.begin() + (n_keep + n_discard - begin) * width, rows.end());
    if (sp.rope.mode != RopeMode::kNone) {
        Tensor tmp = be.alloc(GgmlType::kF32, {width, n_move});
        be.write(tmp, moved.data(), moved.size() * 4);
        be.norm_rope(tmp, int(width / sp.head_dim), int(sp.head_dim), Tensor{}, 0.0f, pos, sp.rope);
        be.read(moved.data(), tmp, moved.size() * 4);
        be.free(tmp);
    }
    rows.resize(size_t(n_keep - begin) * size_t(width));
    rows.insert(rows.end(), moved.begin(), moved.end());
    write_key_rows(be, c, begin, rows);
}

}  // namespace

void shift_kv_cache(Backend& be, std::span<const LayerStateSpec> specs, std::span<const LayerCache> caches,
                    int32_t position, int32_t n_keep, int32_t n_discard) {
    if (n_keep < 0 || n_discard < 0 || int64_t(n_keep) + n_discard > position)
        throw_error(ErrorCode::kOutOfRange, "context shift: keep %d and discard %d of %d tokens", n_keep, n_discard,
                    position);
    CERA_CHECK(specs.size() == caches.size());
    const int64_t n_move = int64_t(position) - n_keep - n_discard;
    if (n_discard == 0 || n_move == 0) return;  // nothing moves (dropping the tail needs no data movement)

    Tensor pos = be.alloc(GgmlType::kI32, {n_move});
    const std::vector<int32_t> minus_d(size_t(n_move), -n_discard);
    be.write(pos, minus_d.data(), minus_d.size() * sizeof(int32_t));
    std::vector<uint8_t> raw;
    std::vector<float> f;
    for (size_t il = 0; il < caches.size(); ++il) {
        const LayerCache& c = caches[il];
        const LayerStateSpec& sp = specs[il];
        if (!c.k) continue;
        // Values: a plain move.
        const size_t vrow = c.v.row_bytes();
        raw.resize(vrow * size_t(n_move));
        be.read(raw.data(), c.v, raw.size(), vrow * size_t(n_keep + n_discard));
        be.write(c.v, raw.data(), raw.size(), vrow * size_t(n_keep));
        if (c.k.type == GgmlType::kQ4_CH) {
            shift_grouped_keys(be, sp, c, pos, position, n_keep, n_discard);
            continue;
        }
        // Keys: move and rotate by -n_discard.
        const size_t row = c.k.row_bytes();
        const size_t src = row * size_t(n_keep + n_discard), dst = row * size_t(n_keep), n = row * size_t(n_move);
        raw.resize(n);
        be.read(raw.data(), c.k, n, src);
        if (sp.rope.mode != RopeMode::kNone) {
            CERA_CHECK(sp.head_dim > 0 && sp.kv_width % sp.head_dim == 0);
            rows_to_f32(raw, c.k.type, sp.kv_width, f);
            Tensor tmp = be.alloc(GgmlType::kF32, {sp.kv_width, n_move});
            be.write(tmp, f.data(), f.size() * 4);
            // RoPE acts on the keys as the model made them: a rotated cache's rows turn back first.
            if (c.rotated_k) be.rotate_heads(tmp, int(sp.head_dim), true);
            be.norm_rope(tmp, int(sp.kv_width / sp.head_dim), int(sp.head_dim), Tensor{}, 0.0f, pos, sp.rope);
            if (c.rotated_k) be.rotate_heads(tmp, int(sp.head_dim), false);
            be.read(f.data(), tmp, f.size() * 4);
            be.free(tmp);
            f32_to_rows(f, c.k.type, sp.kv_width, raw);
        }
        be.write(c.k, raw.data(), n, dst);
    }
    be.free(pos);
    be.synchronize();
}

}  // namespace cera
