// The KV cache's row formats on the device (KvCodec, kernels.h): how the attention kernels read
// values out of a cache row and how the stores write them. A row holds the CPU backend's bytes for
// the same type (GGUF's F32, F16, BF16, Q8_0 and Q4_0, and Q3_KV of the tq3 cache), so saved states, prefix-cache rows and the
// context shift move between the backends unchanged, and the block codecs quantize with the CPU's
// reference arithmetic: the same bytes from the same values.
//
// Reads take generic addresses (shared or global memory) of a row's first byte (a head's first
// element) and an element index. The element codecs read 16 bytes at once (8 values at d % 8 == 0);
// the block codecs read 2-byte words, since their 34-, 18- and 14-byte blocks keep only 2-byte alignment.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "core/quant/blocks.h"

namespace cera::cuda {

struct KvF32 {
    static constexpr KvCodec kCodec = KvCodec::kF32;
};
struct KvF16 {
    static constexpr KvCodec kCodec = KvCodec::kF16;
};
struct KvBF16 {
    static constexpr KvCodec kCodec = KvCodec::kBF16;
};
struct KvQ8 {
    static constexpr KvCodec kCodec = KvCodec::kQ8_0;
};
struct KvQ4 {
    static constexpr KvCodec kCodec = KvCodec::kQ4_0;
};
struct KvQ3 {
    static constexpr KvCodec kCodec = KvCodec::kQ3;
};

// Calls f(K{}) with the codec type of c (host side: the launchers pick their kernel with it).
template <class F>
void with_kv_codec(KvCodec c, F&& f) {
    switch (c) {
        case KvCodec::kF32:
            f(KvF32{});
            break;
        case KvCodec::kF16:
            f(KvF16{});
            break;
        case KvCodec::kBF16:
            f(KvBF16{});
            break;
        case KvCodec::kQ8_0:
            f(KvQ8{});
            break;
        case KvCodec::kQ4_0:
            f(KvQ4{});
            break;
        case KvCodec::kQ3:
            f(KvQ3{});
            break;
    }
}

__device__ __forceinline__ uint32_t kv_u16(const unsigned char* p) { return *reinterpret_cast<const uint16_t*>(p); }
// Small integers to floats without the conversion unit (a quarter of the FMA rate): the integer goes
// into the low mantissa bits of 2^23 (a byte permute or an or) and one subtraction takes 2^23 off,
// exactly. Byte i of u (i = 0, 1) as an int8; nibble x (0..15) minus 8.
__device__ __forceinline__ float s8_at(uint32_t u, int i) {
    return __int_as_float(__byte_perm(u ^ 0x8080u, 0x4B000000u, 0x7440u + i)) - 8388736.0f;  // 2^23 + 128
}
__device__ __forceinline__ float nib_m8(uint32_t x) {
    return __int_as_float(0x4B000000u | x) - 8388616.0f;
}  // 2^23 + 8
__device__ __forceinline__ float kv_scale(const unsigned char* block) {
    return __half2float(*reinterpret_cast<const __half*>(block));
}
// The quant byte of element d in its Q4_0 block (elements 0..15 in the low nibbles, 16..31 in the high).
__device__ __forceinline__ const unsigned char* q4_byte(const unsigned char* row, int d, int& shift) {
    const int o = d & 31;
    shift = o & 16 ? 4 : 0;
    return row + (d >> 5) * 18 + 2 + (o & 15);
}

// Q3_KV (core/quant/blocks.h): the value of code m | s << 2 at scale d, d * kQ3KVValues[c] (the
// levels are symmetric, so the sign flips after the product, exactly).
// Device code reads the levels and bounds as scalar constants.
constexpr float kQ3L0 = kQ3KVValues[0], kQ3L1 = kQ3KVValues[1], kQ3L2 = kQ3KVValues[2], kQ3L3 = kQ3KVValues[3];
constexpr float kQ3B0 = kQ3KVBounds[0], kQ3B1 = kQ3KVBounds[1], kQ3B2 = kQ3KVBounds[2];
__device__ __forceinline__ float q3_value(uint32_t m, uint32_t s, float d) {
    const float mag = m & 2 ? (m & 1 ? kQ3L3 : kQ3L2) : (m & 1 ? kQ3L1 : kQ3L0);
    return __uint_as_float(__float_as_uint(__fmul_rn(d, mag)) ^ (s << 31));
}

// Values d .. d + 7 (d % 8 == 0) as floats.
template <class K>
__device__ __forceinline__ void kv_load8(const unsigned char* row, int d, float* v) {
    if constexpr (std::is_same_v<K, KvF32>) {
        const float4 a = reinterpret_cast<const float4*>(row)[d / 4],
                     b = reinterpret_cast<const float4*>(row)[d / 4 + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else if constexpr (std::is_same_v<K, KvF16>) {
        const uint4 a = reinterpret_cast<const uint4*>(row)[d / 8];
        const __half2* h = reinterpret_cast<const __half2*>(&a);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else if constexpr (std::is_same_v<K, KvBF16>) {
        const uint4 a = reinterpret_cast<const uint4*>(row)[d / 8];
        const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else if constexpr (std::is_same_v<K, KvQ8>) {
        const unsigned char* b = row + (d >> 5) * 34;
        const float s = kv_scale(b);
        const unsigned char* q = b + 2 + (d & 31);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t u = kv_u16(q + 2 * i);
            v[2 * i] = s8_at(u, 0) * s, v[2 * i + 1] = s8_at(u, 1) * s;
        }
    } else if constexpr (std::is_same_v<K, KvQ3>) {
        const unsigned char* b = row + (d >> 5) * 14;
        const int g = (d & 31) >> 3;
        const float s = kv_scale(b);
        const uint32_t m = kv_u16(b + 2 + 2 * g), sg = b[10 + g];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = q3_value(m >> (2 * i) & 3, sg >> i & 1, s);
    } else {
        static_assert(std::is_same_v<K, KvQ4>);
        int sh;
        const unsigned char* q = q4_byte(row, d, sh);
        const float s = kv_scale(row + (d >> 5) * 18);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t u = kv_u16(q + 2 * i) >> sh;
            v[2 * i] = nib_m8(u & 15) * s, v[2 * i + 1] = nib_m8((u >> 8) & 15) * s;
        }
    }
}

// Values d and d + 1 (d even) as floats.
template <class K>
__device__ __forceinline__ float2 kv_load2(const unsigned char* row, int d) {
    if constexpr (std::is_same_v<K, KvF32>) {
        return reinterpret_cast<const float2*>(row)[d / 2];
    } else if constexpr (std::is_same_v<K, KvF16>) {
        return __half22float2(reinterpret_cast<const __half2*>(row)[d / 2]);
    } else if constexpr (std::is_same_v<K, KvBF16>) {
        const uint32_t w = reinterpret_cast<const uint32_t*>(row)[d / 2];
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    } else if constexpr (std::is_same_v<K, KvQ8>) {
        const unsigned char* b = row + (d >> 5) * 34;
        const float s = kv_scale(b);
        const uint32_t u = kv_u16(b + 2 + (d & 31));
        return make_float2(s8_at(u, 0) * s, s8_at(u, 1) * s);
    } else if constexpr (std::is_same_v<K, KvQ3>) {
        const unsigned char* b = row + (d >> 5) * 14;
        const int o = d & 31;
        const float s = kv_scale(b);
        const uint32_t m = b[2 + o / 4] >> (2 * (o & 3)), sg = b[10 + o / 8] >> (o & 7);
        return make_float2(q3_value(m & 3, sg & 1, s), q3_value(m >> 2 & 3, sg >> 1 & 1, s));
    } else {
        int sh;
        const uint32_t u = kv_u16(q4_byte(row, d, sh)) >> sh;
        const float s = kv_scale(row + (d >> 5) * 18);
        return make_float2(nib_m8(u & 15) * s, nib_m8((u >> 8) & 15) * s);
    }
}

// Value d as a float.
template <class K>
__device__ __forceinline__ float kv_load1(const unsigned char* row, int d) {
    if constexpr (std::is_same_v<K, KvF32>) {
        return reinterpret_cast<const float*>(row)[d];
    } else if constexpr (std::is_same_v<K, KvF16>) {
        return __half2float(reinterpret_cast<const __half*>(row)[d]);
    } else if constexpr (std::is_same_v<K, KvBF16>) {
        return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[d]) << 16);
    } else if constexpr (std::is_same_v<K, KvQ8>) {
        const unsigned char* b = row + (d >> 5) * 34;
        return float(int8_t(b[2 + (d & 31)])) * kv_scale(b);
    } else if constexpr (std::is_same_v<K, KvQ3>) {
        const unsigned char* b = row + (d >> 5) * 14;
        const int o = d & 31;
        return q3_value(b[2 + o / 4] >> (2 * (o & 3)) & 3, b[10 + o / 8] >> (o & 7) & 1, kv_scale(b));
    } else {
        int sh;
        const uint32_t u = *q4_byte(row, d, sh) >> sh;
        return float(int(u & 15) - 8) * kv_scale(row + (d >> 5) * 18);
    }
}

// Element e of a row of an element codec := x.
__device__ __forceinline__ void kv_put1(KvCodec c, unsigned char* row, int64_t e, float x) {
    switch (c) {
        case KvCodec::kF32:
            reinterpret_cast<float*>(row)[e] = x;
            break;
        case KvCodec::kF16:
            reinterpret_cast<__half*>(row)[e] = __float2half_rn(x);
            break;
        case KvCodec::kBF16:
            reinterpret_cast<__nv_bfloat16*>(row)[e] = __float2bfloat16_rn(x);
            break;
        default:
            break;
    }
}

// The 32-element block at `block` (Q8_0, Q4_0 or Q3_KV) from the warp's values, lane i holding element i:
// every lane calls it. The arithmetic is the reference quantizers' (core/quant): Q8_0 d = amax / 127,
// q = round(x / d); Q4_0 d = -max / 8 with max the signed value of largest magnitude (the first one
// on a tie), q = min(15, trunc(x / d + 8.5)); Q3_KV the codes of x * (1 / rms), then the least-squares
// d, its sums warp_sum's butterfly, which is the reference's order (quant.cpp q3_kv_tree_sum), so every
// lane holds the same float. Products and sums round as the host's (no contraction).
__device__ __forceinline__ void kv_put_block(KvCodec c, unsigned char* block, float x) {
    const int lane = threadIdx.x & 31;
    if (c == KvCodec::kQ3) {
        const float ss = warp_sum(__fmul_rn(x, x));
        uint32_t m = 0, sg = 0;
        float d = 0.0f;
        if (ss != 0.0f) {
            const float is = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(ss, 32.0f)));
            const float t = fabsf(__fmul_rn(x, is));
            m = uint32_t(t > kQ3B0) + uint32_t(t > kQ3B1) + uint32_t(t > kQ3B2);
            sg = x < 0.0f;
            const float v = q3_value(m, sg, 1.0f);
            const float sxv = warp_sum(__fmul_rn(x, v));
            d = __fdiv_rn(sxv, warp_sum(__fmul_rn(v, v)));
        }
        uint32_t byte = m << (2 * (lane & 3));
        byte |= __shfl_xor_sync(0xffffffffu, byte, 1);
        byte |= __shfl_xor_sync(0xffffffffu, byte, 2);
        const uint32_t signs = __ballot_sync(0xffffffffu, sg);
        if ((lane & 3) == 0) block[2 + lane / 4] = uint8_t(byte);
        if (lane < 4) block[10 + lane] = uint8_t(signs >> (8 * lane));
        if (lane == 0) *reinterpret_cast<__half*>(block) = __float2half_rn(d);
        return;
    }
    if (c == KvCodec::kQ8_0) {
        const float d = warp_max(fabsf(x)) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block[2 + lane] = uint8_t(int8_t(roundf(__fmul_rn(x, id))));
        if (lane == 0) *reinterpret_cast<__half*>(block) = __float2half_rn(d);
        return;
    }
    float a = fabsf(x);
    int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ao = __shfl_xor_sync(0xffffffffu, a, o);
        const int io = __shfl_xor_sync(0xffffffffu, at, o);
        if (ao > a || (ao == a && io < at)) a = ao, at = io;
    }
    // A block of zeros keeps the reference's initial max, +0 (x[0] may be -0).
    const float max = a > 0.0f ? __shfl_sync(0xffffffffu, x, at) : 0.0f;
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = min(15, int(int8_t(__fadd_rn(__fmul_rn(x, id), 8.5f))));
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16) block[2 + lane] = uint8_t(q | hi << 4);
    if (lane == 0) *reinterpret_cast<__half*>(block) = __float2half_rn(d);
}

// A head of hd values at src (readable by every lane) into the row at dst: every lane of a warp calls it.
__device__ __forceinline__ void kv_put_head(KvCodec c, const float* src, unsigned char* dst, int hd) {
    const int lane = threadIdx.x & 31;
    if (!kv_blocked(c)) {
        for (int i = lane; i < hd; i += 32) kv_put1(c, dst, i, src[i]);
        return;
    }
    const int64_t bb = kv_row_bytes(c, 32);
    for (int b = 0; b < hd / 32; ++b) kv_put_block(c, dst + b * bb, src[32 * b + lane]);
}

}  // namespace cera::cuda
