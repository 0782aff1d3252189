// Repacked weight layouts for the CPU matmul, and the registry that holds them.
//
// A GGUF row-major matrix makes a 1-row kernel do per-block float work for every (row, token) pair
// and read each row's scales one at a time. Repacked, rows go in groups of kPackRows = 16 and each
// 64-byte line holds the same 4 code bytes of the group's 16 rows: one 512-bit vpdpbusd against a
// broadcast 4-byte activation chunk advances all 16 row sums (one int32 lane per row), the scales
// of a block are one 16-lane vector, and the result of a group is one store per token.
// Rows past the end of the matrix are zero padding (scale 0) in the last group.
//
// Layouts, per group of 16 rows (r = row within the group, "line" = 64 bytes = 16 rows x 4 bytes):
//   Q4_0: per pair of 32-blocks (an odd count gets a zero block): d fp16 [2][16] (64 B), then per
//         block 4 lines: line j, row r = qs[4j .. 4j+3] of that row's block (low nibble = element
//         4j+i, high nibble = element 16+4j+i). 576 B per pair.
//   Q8_0: per pair of 32-blocks: d fp16 [2][16] (64 B), then per block 8 lines of codes + 128
//         (unsigned; line j = elements 4j..4j+3). 1088 B per pair.
//   Q4_1, Q5_0, Q5_1: per pair of 32-blocks: d fp16 [2][16] (64 B), for Q4_1 / Q5_1 m fp16 [2][16]
//         (64 B), then per block the 4 code lines of Q4_0 (low 4 bits of the codes) and for Q5_0 /
//         Q5_1 a 5th line H: byte i of row r, bit j = 5th bit of element 4j+i, bit 4+j = of
//         element 16+4j+i. Q4_1 640 B, Q5_0 704 B, Q5_1 768 B per pair.
//   IQ4_NL: Q4_0's layout (the codes index kIQ4NLValues).
//   IQ4_XS: per 256-super-block: d f32 [16], sub-block scales ls - 32 i8 [8][16] (sub-block-major), then
//         32 lines: line 4s+j, row r = qs[16s + 4j .. 16s+4j+3] of that row's block (low nibble: element
//         32s+4j+i, high: +16). 64+128+2048 = 2240 B.
//   Q2_K: per 256-super-block: d fp16 [16], dmin fp16 [16], the scale bytes u8 [16][16] (sub-block-major:
//         low nibble scale, high nibble min), then 16 lines: line 8n+m, row r = qs[32n + 4m .. 32n+4m+3]
//         (bits 2j..2j+1 of byte i: element 128n + 32j + 4m + i, sub-block 8n + 2j + m/4). 1344 B.
//   Q3_K: per 256-super-block: d f32 [16], scales - 32 i8 [16][16] (sub-block-major), Q2_K's 16 code
//         lines (the low 2 bits), then 8 lines H: line m, row r = hmask[4m .. 4m+3] (bit 4n+j of byte i:
//         the 3rd bit of the code at field j of line 8n+m's byte i). 64+256+1024+512 = 1856 B.
//   F16: 32 B per element: element i of row r at bytes 32 i + 2 r (any k). 32 k B.
//   BF16: 64 B per pair of elements (vdpbf16ps's operand): elements 2i, 2i+1 of row r at bytes
//         64 i + 4 r, 64 i + 4 r + 2 (an odd k gets a zero element). 64 ceil(k / 2) B.
//   Q4_K: per 256-super-block: d fp16 [16], dmin fp16 [16], scales u8 [8][16], mins u8 [8][16],
//         then 32 lines: line 8g+j, row r = qs[32g + 4j .. 32g+4j+3] (low nibble: element
//         64g+4j+i, sub-block 2g; high: +32, 2g+1). 32+32+128+128+2048 = 2368 B (Q4_K: 2304).
//   Q5_K: Q4_K's layout, then 8 lines H: line j, row r = qh[4j .. 4j+3] of that row's block (bit 2g:
//         5th bit of the low nibble of line 8g+j's byte, bit 2g+1: of its high nibble). 2880 B.
//   Q6_K: per 256-super-block: d f32 [16], scales i8 [16][16] (sub-block-major), then for h = 0..15
//         the lines L[h], L[h+16], H[h] (in the order the kernel reads them), where L[q] byte i:
//         low nibble = low 4 bits of code 4q+i, high nibble = of code 128+4q+i; H[h] byte i: bits
//         2s..2s+1 = high 2 bits of code 64s+4h+i; codes q+32 in 0..63. 64+256+3072 = 3392 B.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace cera::cpu {

constexpr int kPackRows = 16;

// Bytes of one group of 16 rows of a k-wide matrix in the packed layout of `type`; 0 when the type
// has no packed layout.
size_t packed_group_bytes(GgmlType type, int64_t k);

// Writes the packed image of rows [0, rows) of w (GGUF layout, row stride row_size(type, k)) to
// out, which holds ceil(rows / 16) * packed_group_bytes(type, k) bytes.
void repack_weights(GgmlType type, const void* w, int64_t rows, int64_t k, uint8_t* out);

struct PackedView {
    const uint8_t* data = nullptr;  // nullptr: not registered
    size_t group_stride = 0;
};

// Writes row r of a packed image back in the GGUF layout (row_size(type, k) bytes): the bytes
// repack_weights read, for every scale but a NaN's payload. Lets ops other than the matmul (the
// embedding lookup) read a weight whose original bytes are no longer resident.
void unpack_row(GgmlType type, PackedView packed, int64_t r, int64_t k, uint8_t* out);

// The packed image registered for exactly (w, type, rows, k), if any.
PackedView find_packed(const void* w, GgmlType type, int64_t rows, int64_t k);

}  // namespace cera::cpu
