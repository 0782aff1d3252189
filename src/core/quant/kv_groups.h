// Q4_CH, the key rows of the kivi4 KV cache (not a GGUF type): keys quantized per channel over groups of
// 64 consecutive cache rows, as KIVI does. Per-token blocks take their scale from a row's largest channel,
// and the keys of many models keep a few channels at 5-20x the others, token after token; a channel's
// own scale and minimum over 64 tokens follow such a channel and leave the others their resolution.
//
// A group is rows [64 g, 64 g + 64) of a cache of rows of `width` elements: width * 36 bytes (row_size
// of 64 rows: 4.5 bits an element), one 36-byte record a channel c at byte 36 c:
//   bytes 0-1 d (f16), bytes 2-3 m (f16), bytes 4-35 the 64 codes q (row i's in byte 4 + i / 2, the low
//   nibble for even i), the element m + d * q.
//
// A group's codes hold once all its rows are known. Until then (KIVI's residual, kept in Q8_0 rows here
// rather than in full precision, at about half the bytes of f16 rows) a query reads the keys of its own group as Q8_0
// rows: the rows of the group being filled stay in an open group (a slot), and the rows a step stores come from the
// step itself, rounded the same way (round_rows). A query at position p so reads keys [64 (p / 64), p] as Q8_0 rows and
// the keys before as codes of full groups, however the positions were split into steps: prefill, decode and speculative
// verification see the same keys.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace cera::kv_groups {

constexpr int kRows = 64;             // cache rows a group
constexpr size_t kChannelBytes = 36;  // bytes a channel of a group
inline size_t group_bytes(int64_t width) { return size_t(width) * kChannelBytes; }

// The first n rows of x ([n, width] f32, 1 <= n <= 64) as group bytes: for each channel its minimum m
// and step d = (max - min) / 15 (both rounded to f16), codes round((x - m) / d) in [0, 15]; rows n..63
// take code 0.
void quantize(const float* x, int n, int64_t width, uint8_t* group);
// Rows [0, n) of a group as f32 [n, width].
void dequantize(const uint8_t* group, int n, int64_t width, float* x);

// The byte offset of channel c's record of the group holding cache row `row`.
inline size_t record_offset(int64_t row, int64_t c, int64_t width) {
    return size_t(row / kRows) * group_bytes(width) + size_t(c) * kChannelBytes;
}
// Element c of cache row `row` of a Q4_CH cache starting at `cache`.
float value(const uint8_t* cache, int64_t row, int64_t c, int64_t width);

// A key row as the open groups hold it: through Q8_0 and back (n rows of width, x and out may be one).
void round_rows(const float* x, int64_t n, int64_t width, float* out);

// Open groups: `slots` slots of kRows + 1 Q8_0 rows of `width` (a multiple of 32) each: a group's rows
// [0, valid), then a header row (Header at its start).
struct Header {
    int64_t group;  // the group held, -1: none
    int32_t valid;  // its rows held
    int32_t unused;
    uint64_t stamp;  // last store (older slots are taken first)
};
inline int64_t open_rows(int slots) { return int64_t(kRows + 1) * slots; }
inline size_t open_row_bytes(int64_t width) { return row_size(GgmlType::kQ8_0, width); }
inline size_t open_bytes(int64_t width, int slots) { return size_t(open_rows(slots)) * open_row_bytes(width); }
void clear_open(uint8_t* open, int64_t width, int slots);
// The Q8_0 rows of the slot holding group g with at least `rows` rows, or nullptr.
const uint8_t* find_open(const uint8_t* open, int64_t width, int slots, int64_t g, int rows);

// cache rows[t] = k[t] for t in [0, n_tokens) (k: [n_tokens, width] f32; rows ascending by one within
// each run of one group), rounded as round_rows: each group touched is coded again from its rows so far
// (those before the run from its slot, or decoded when no slot has them) and the run's, dropping rows
// after the run's end; a group left unfilled, or one a slot held, keeps its rows in a slot (taken from
// those this call did not touch, groups already full first, then the least recently stored).
void store(const float* k, const int32_t* rows, int64_t n_tokens, int64_t width, uint8_t* cache, uint8_t* open,
           int slots);

// Rows [0, n) of group g (its bytes at `group`) as f32: the slot's if one holds them, else decoded.
void read_rows(const uint8_t* group, const uint8_t* open, int slots, int64_t g, int n, int64_t width, float* x);
// The same rows as Q8_0 rows (q: n * open_row_bytes(width)): the slot's bytes, else the decoded rows'.
void read_row_bytes(const uint8_t* group, const uint8_t* open, int slots, int64_t g, int n, int64_t width, uint8_t* q);
// Rows [0, n) of group g become the Q8_0 rows q (1 <= n <= 64): coded at `group`, held in a slot.
// Whatever rewrites cache rows other than through store() empties the slots (clear_open) first.
void write_rows(uint8_t* group, uint8_t* open, int slots, int64_t g, int n, int64_t width, const uint8_t* q);

}  // namespace cera::kv_groups
