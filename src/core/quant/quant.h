// Reference (scalar) quantizers and dequantizers, one table row per type.
// They are the specification the fast kernels are checked against. The quantizers
// reproduce llama.cpp's reference quantizers (quantize_row_*_ref, no importance
// matrix) bit for bit, so a tensor quantized here equals one llama-quantize wrote.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/quant/blocks.h"

namespace cera {

// One row of the format table.
struct QuantTraits {
    GgmlType type;
    int64_t block_size;   // elements per block
    size_t type_size;     // bytes per block
    void (*dequantize)(const void* src, float* dst, int64_t n);   // nullptr: not supported
    void (*quantize)(const float* src, void* dst, int64_t n);     // nullptr: not supported
    // Under an importance matrix (one row, its qw of n values); nullptr: the type takes none (quantize).
    void (*quantize_weighted)(const float* src, void* dst, int64_t n, const float* qw);
};

// nullptr when the type has neither a dequantizer nor a quantizer here.
const QuantTraits* quant_traits(GgmlType type);

bool can_dequantize(GgmlType type);
bool can_quantize(GgmlType type);

// dst[0..n) = the values of the n elements at src. n must be a multiple of the block size.
// Supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ4_NL IQ4_XS Q3_KV Q4_KV;
// any other type throws cera::Error(kUnsupported).
void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n);

// Writes row_size(type, n) bytes at dst. n must be a multiple of the block size.
// Supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K (activation format)
// IQ4_NL IQ4_XS Q3_KV Q4_KV;
// any other type throws cera::Error(kUnsupported).
void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n);

// Quantizes one row of n values under its importance matrix row: imatrix[k] is the mean square of the
// activations that multiply column k (what `cera imatrix` and llama-imatrix measure). Reproduces
// llama.cpp's quantize_<type> with quant_weights bit for bit (so llama-quantize --imatrix). Types that
// take no importance matrix (F32, F16, BF16, Q8_0) and imatrix == nullptr quantize as quantize_row_ref.
void quantize_row_imatrix(GgmlType type, const float* src, void* dst, int64_t n, const float* imatrix);
bool takes_imatrix(GgmlType type);

// Rounds to the nearest integer, ties to even, as ggml's K-quant helpers do (|x| < 2^22).
inline int nearest_int(float x) {
    float v = x + 12582912.f;
    int32_t i;
    __builtin_memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

}  // namespace cera
