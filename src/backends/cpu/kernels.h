// CPU kernels: the interface the models call. Each op has a scalar reference
// (the specification) and AVX2 / AVX-512 variants, chosen once at start from
// CPUID; CERA_CPU_ISA=ref|avx2|avx512 forces a table.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/threadpool.h"

namespace cera::cpu {

// kAmx: the AVX-512 table with products of many tokens on AMX tiles (kernel_table.h).
enum class Isa { kRef, kAvx2, kAvx512, kAmx };
const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // this CPU can run isa's kernel table (AVX-512 needs VNNI too)
Isa best_isa();               // the best supported
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

// Weight registration: a backend may hand its weight matrices to register_weight once at load; where
// the active kernel table has a kernel on a repacked layout of the type (backends/cpu/repack.h), a
// packed copy is made and later matmul calls with the same (type, w, rows, k) use it. The bytes at w
// must not change while registered. Returns whether a packed copy is in use. Registrations are
// counted; unregister_weight drops one (and the copy with the last).
// Matmul calls check a few bytes of w against the registration (a freed buffer whose address holds
// other weights must not use the old copy) unless `immutable`: w lies in a read-only file mapping
// that outlives the registration, so its bytes are never read again and its pages may be dropped.
bool register_weight(GgmlType type, const void* w, int64_t rows, int64_t k, bool immutable = false);
void unregister_weight(const void* w);

// The scalar reference of matmul (dequantize each weight row to f32, then dot in double-free f32 order).
void matmul_ref(GgmlType type, const void* w, int64_t rows, int64_t k, const float* x, int64_t n_tokens, float* y,
                int64_t ldy);

// ---- row ops (ISA-dispatched like matmul; *_ref are the scalar specifications) ----

// y = x / sqrt(mean(x^2) + eps) * w over one row of n; w may be null (no weight); y may alias x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
void rms_norm_ref(const float* x, const float* w, float* y, int64_t n, float eps);
// SwiGLU: y = silu(g) * u = g / (1 + exp(-g)) * u; y may alias g or u.
void silu_mul(const float* g, const float* u, float* y, int64_t n);
void silu_mul_ref(const float* g, const float* u, float* y, int64_t n);
// y = a + scale * b; y may alias a or b.
void add(const float* a, const float* b, float scale, float* y, int64_t n);
void add_ref(const float* a, const float* b, float scale, float* y, int64_t n);
// y[c] += sum_j t[j] * f16(b[j * ld + c]) for c < n, j < r (KernelTable::axpy_rows_f16's specification).
void axpy_rows_f16_ref(const uint16_t* b, int64_t ld, const float* t, int64_t r, float* y, int64_t n);
// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
float dot_f32_ref(const float* a, const float* b, int64_t n);
// In place: x = exp(x - max) / sum(exp(x - max)) over one row of n.
void softmax(float* x, int64_t n);
void softmax_ref(float* x, int64_t n);
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu_host's tanh form (backend.h); y may alias x.
void gelu_tanh_ref(const float* x, float* y, int64_t n);

}  // namespace cera::cpu
