// Q4_CH keys (the kivi4 cache, core/quant/kv_groups.h) in a sequence's cache: their allocation, their
// bytes in a saved state, their rows as f32 for a context shift. A cache of another type takes the plain
// row-by-row path of each (row_bytes() a position).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/arch.h"

namespace cera {

// Rows the key cache of a context of n_ctx positions allocates: whole groups for Q4_CH.
int64_t key_cache_rows(GgmlType type, int64_t n_ctx);

// The open groups of a Q4_CH key cache of rows of `width` (LayerCache::k_open), `slots` of them, empty.
Tensor alloc_open_groups(Backend& be, int64_t width, int slots);

// Bytes of a layer's keys for positions [0, n) in a saved state: n rows, or for Q4_CH the groups that
// hold them and the Q8_0 rows of the last one if it is not full.
size_t saved_key_bytes(const LayerCache& c, int32_t n);
void save_keys(Backend& be, const LayerCache& c, int32_t n, uint8_t* out);
// The inverse of save_keys; the open groups then hold the last group's rows.
void restore_keys(Backend& be, const LayerCache& c, int32_t n, const uint8_t* in);

// Q4_CH keys of positions [begin, end) as f32 [end - begin, width] (begin a multiple of 64), and back:
// write_key_rows codes the groups from `begin` on again and leaves the last one open.
void read_key_rows(Backend& be, const LayerCache& c, int64_t begin, int64_t end, std::vector<float>& out);
void write_key_rows(Backend& be, const LayerCache& c, int64_t begin, const std::vector<float>& rows);

}  // namespace cera
