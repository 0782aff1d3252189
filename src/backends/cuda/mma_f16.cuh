// Warp-level f16 tensor-core helpers that the attention kernels share (attention_mma.cu for the causal
// cache, attention_full.cu for the vision encoder): an f32 pair split into f16 hi and lo pairs, the
// m16n8k16 MMA, ldmatrix loads, and exp2.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace cera::cuda {

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
// f16 pair (a low) and the pair of what rounding left out.
__device__ __forceinline__ void to_half2(float a, float b, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    hi = half2_bits(h);
    const float2 f = __half22float2(h);
    lo = half2_bits(__floats2half2_rn(a - f.x, b - f.y));
}
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(uint32_t(__cvta_generic_to_shared(p)))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(uint32_t(__cvta_generic_to_shared(p)))
                 : "memory");
}

}  // namespace cera::cuda
