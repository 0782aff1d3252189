// CPU kernels: the interface the models call. Each op has a scalar reference
// (the specification) and AVX2 / AVX-512 variants, chosen once at start from
// CPUID; CERA_CPU_ISA=ref|avx2|avx512 forces a table.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/threadpool.h"

namespace cera::cpu {

enum class Isa { kRef, kAvx2, kAvx512 };
const char* isa_name(Isa isa);
Isa active_isa();          // chosen once: CERA_CPU_ISA if set, else the best the CPU has
void force_isa(Isa isa);   // for tests and benchmarks

// y[t][r] = sum_k W[r][k] * x[t][k]
//   w: [rows, k] in `type`, row stride row_size(type, k) bytes (a GGUF tensor with ne = {k, rows})
//   x: [n_tokens, k] f32, row stride k
//   y: [n_tokens, rows] f32, row stride ldy (>= rows)
// Quantized types quantize x to 8 bits first where the type's integer dot product allows.
// pool may be null (single-threaded).
void matmul(GgmlType type, const void* w, int64_t rows, int64_t k, const float* x, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool* pool);

// The scalar reference of matmul (dequantize each weight row to f32, then dot in double-free f32 order).
void matmul_ref(GgmlType type, const void* w, int64_t rows, int64_t k, const float* x, int64_t n_tokens, float* y,
                int64_t ldy);

}  // namespace cera::cpu
