// Internal to the CPU backend: the per-ISA kernel table behind kernels.h, and the activation
// formats the quantized matmuls use.
//
// Activation formats (made once per matmul call, one row per token):
//   kAct32: for weights in 32-blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): int8 codes qs[k], then float d[k/32],
//           then int32 sum[k/32] (sum of the block's codes, for the weights' zero offsets).
//           x ~ d[b] * qs[i], d = amax / 127 (float, not fp16), codes rounded to nearest.
//   kActQ8K: for the K-quants: BlockQ8_K[k/256] (core/quant/blocks.h).
//   kActF32: the f32 row itself (F32, F16 weights, BF16 on AVX2, and the dequantizing fallbacks).
//   kBF16: for BF16 weights on AVX-512 (vdpbf16ps): the row in bfloat16 (bf16_act), k rounded up to
//           even with a zero element.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_attention.h"
#include "core/fp16.h"

namespace cera::cpu {

enum class ActFormat { kF32, kAct32, kActQ8K, kBF16 };

// An activation in bfloat16 as vcvtneps2bf16 makes it: round to nearest even, f32 subnormals to
// signed zero, NaN stays NaN (quieted).
inline uint16_t bf16_act(float f) {
    const uint32_t x = fp32_to_bits(f);
    if ((x & 0x7f800000) == 0 && (x & 0x007fffff) != 0) return uint16_t((x >> 16) & 0x8000);
    return fp32_to_bf16(f);
}

size_t act_row_bytes(ActFormat f, int64_t k);
void quantize_act_row(ActFormat f, const float* x, int64_t k, void* out);  // scalar, baseline

// Computes y[t][r] for rows [r0, r1) and tokens [t0, t1):
//   w: the whole weight matrix (row stride w_stride bytes); act: activation rows (stride a_stride
//   bytes) in the format the kernel's ActFormat names, indexed by token; y: row stride ldy.
using GemmFn = void (*)(const uint8_t* w, size_t w_stride, int64_t r0, int64_t r1, const uint8_t* act, size_t a_stride,
                        int64_t t0, int64_t t1, int64_t k, float* y, int64_t ldy);

struct MatmulKernel {
    GemmFn fn = nullptr;  // nullptr: this ISA has no kernel for the type
    ActFormat act = ActFormat::kF32;
    int64_t token_block = 0;  // as PackedKernel::token_block
};

// Kernels on repacked weights (repack.h): rows in groups of kPackRows, interleaved so that one
// 512-bit register (two 256-bit ones) holds 4 consecutive codes of each of the group's rows.
// Computes y[t][r] for the row groups [g0, g1) (rows beyond `rows` are padding and are not stored)
// and tokens [t0, t1).
using PackedFn = void (*)(const uint8_t* packed, size_t group_stride, int64_t g0, int64_t g1, int64_t rows,
                          const uint8_t* act, size_t a_stride, int64_t t0, int64_t t1, int64_t k, float* y,
                          int64_t ldy);

struct PackedKernel {
    PackedFn fn = nullptr;  // nullptr: this ISA has no kernel on the packed layout of the type
    ActFormat act = ActFormat::kF32;
    // Tokens a call, for a kernel that blocks its activations itself (the AMX kernels); 0: as many as
    // fit the matmul driver's L2 budget.
    int64_t token_block = 0;
};

constexpr int kMaxTypeId = 40;

struct KernelTable {
    Isa isa;
    MatmulKernel matmul[kMaxTypeId];
    PackedKernel packed[kMaxTypeId];
    void (*rms_norm)(const float* x, const float* w, float* y, int64_t n, float eps);
    void (*silu_mul)(const float* g, const float* u, float* y, int64_t n);
    void (*add)(const float* a, const float* b, float scale, float* y, int64_t n);
    float (*dot_f32)(const float* a, const float* b, int64_t n);
    // y[c] += sum_j t[j] * b[j * ld + c] for c < n, j < r, b f16: the up projection of a LoRA product
    // (Backend::lora_segments) with Bᵀ's rows, y kept in registers across the r rows.
    void (*axpy_rows_f16)(const uint16_t* b, int64_t ld, const float* t, int64_t r, float* y, int64_t n);
    void (*softmax)(float* x, int64_t n);
    // y = GELU of x, the tanh form (GeluKind::kTanh), as gelu_host computes it; y may alias x.
    void (*gelu_tanh)(const float* x, float* y, int64_t n);
    // One activation row in format f: the same bytes as quantize_act_row.
    void (*quantize_act)(ActFormat f, const float* x, int64_t k, void* out);
    // Causal GQA attention of a block of query tokens over one KV head (kernels_attention.h).
    cpu_attention::BlockFn attention;
    // Products that may trade batch invariance for speed (matmul's `tiles`): on the AMX table, packed F16
    // and BF16 and plain F32 weights on AMX tiles; null elsewhere. A row's result then depends on how many
    // rows the call has (kAmxMinTokens), so the text models' products, whose batched and lone outputs
    // agree bit for bit (docs/batching.md), do not take them.
    PackedKernel tiles_packed[kMaxTypeId];
    MatmulKernel tiles_plain[kMaxTypeId];
};

// Fill t.packed with the kernels on packed weights (kernels_packed_avx512.cpp, kernels_packed_avx2.cpp).
void add_packed_kernels_avx512(KernelTable& t, bool bf16_dot);
void add_packed_kernels_avx2(KernelTable& t);
// Put the AMX kernels (kernels_amx.cpp) in t's tiles_packed and tiles_plain: packed F16 and BF16 and
// plain F32 on f32 activations, which t's own kernels for them (the FMA ones) still compute for calls of
// few tokens.
void add_amx_kernels(KernelTable& t);
// A call of fewer tokens than this takes the FMA kernels on the AMX table: 32 tokens are a tile block.
constexpr int64_t kAmxMinTokens = 16;

const KernelTable& kernel_table_ref();
const KernelTable& kernel_table_avx2();
// The AVX-512 table. Its BF16 products run either on vdpbf16ps against bfloat16 activations
// (bf16_dot, which needs AVX512_BF16) or on f32 FMAs against f32 activations, a shift making each
// bfloat16 weight an f32. kernel_table_avx512() takes vdpbf16ps on AMD cores with AVX512_BF16, which
// run a 512-bit FMA as two halves, so that an instruction of 32 products doubles their rate; Intel
// cores with two 512-bit FMA units run the FMAs faster (bench/NOTES.md), and cores without
// AVX512_BF16 have only them.
const KernelTable& kernel_table_avx512(bool bf16_dot);
const KernelTable& kernel_table_avx512();
// The AVX-512 table (FMA BF16 path) with tile kernels for F16, BF16 and F32 products of many tokens on
// AMX (Isa::kAmx; the CPU must have AMX-BF16 and the OS must grant it).
const KernelTable& kernel_table_amx();
const KernelTable& active_table();  // the table of active_isa()
// The table of `isa`, which this CPU must support (isa_supported): a CPU backend computes with the
// table its options name, whatever the active one is.
const KernelTable& kernel_table(Isa isa);

// matmul and register_weight (kernels.h) for the kernels of `tab` instead of the active table's. tiles:
// the product may take tab's tile kernels (KernelTable::tiles_packed, tiles_plain).
void matmul(const KernelTable& tab, GgmlType type, const void* w, int64_t rows, int64_t k, const float* x,
            int64_t n_tokens, float* y, int64_t ldy, ThreadPool* pool, bool tiles = false);
bool register_weight(const KernelTable& tab, GgmlType type, const void* w, int64_t rows, int64_t k, bool immutable);

}  // namespace cera::cpu
