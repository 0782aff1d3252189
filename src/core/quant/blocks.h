// Quantized block layouts, byte for byte as ggml (llama.cpp) stores them in GGUF files.
// Plain structs of fixed-width integers (fp16 scales as uint16_t bits): shared by the CPU
// kernels and the CUDA kernels, so no std:: and nothing host-only here.
//
// Element order inside a block (what the reference dequantizers in quant.cpp implement):
//   Q4_0/Q4_1:  qs[j] low nibble = element j, high nibble = element j + 16.
//   Q5_0/Q5_1:  as Q4, plus bit j of the little-endian uint32 qh = bit 4 of element j (j < 32).
//   Q8_0/Q8_1:  qs[j] = element j.
//   K-quants:   256-element super-blocks of 8 (or 16) sub-blocks with 6-bit (or 8-bit) sub-scales.
//   IQ4_NL:     as Q4_0, the nibble an index into kIQ4NLValues.
//   IQ4_XS:     8 sub-blocks of 32, each laid out as IQ4_NL's qs, with 6-bit sub-scales.
//   Q4_KV:      as Q4_0, under a one-byte scale.
#pragma once
#include <stdint.h>

namespace cera {

constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK8_1 = 32;
constexpr int kQK_K = 256;           // elements per K-quant super-block
constexpr int kKScaleSize = 12;      // bytes of packed 6-bit scales/mins in Q4_K/Q5_K

// x = d * (q - 8), q in [0, 15]
struct BlockQ4_0 {
    uint16_t d;                // fp16 scale
    uint8_t qs[kQK4_0 / 2];    // nibbles
};
// x = d * q + m, q in [0, 15]
struct BlockQ4_1 {
    uint16_t d;                // fp16 scale
    uint16_t m;                // fp16 min
    uint8_t qs[kQK4_1 / 2];
};
// x = d * (q - 16), q in [0, 31]
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];             // 5th bits, little-endian uint32
    uint8_t qs[kQK5_0 / 2];
};
// x = d * q + m, q in [0, 31]
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK5_1 / 2];
};
// x = d * q, q in [-127, 127]
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK8_0];
};
// x = d * q; s = d * sum(q) (used by the Q4_1/Q5_1 dot products)
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[kQK8_1];
};

// 16 sub-blocks of 16: x = d * (scales & 0xF) * q - dmin * (scales >> 4), q in [0, 3]
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];  // low nibble scale, high nibble min
    uint8_t qs[kQK_K / 4];       // 2-bit quants
    uint16_t d;                  // fp16 super-block scale of the scales
    uint16_t dmin;               // fp16 super-block scale of the mins
};
// 16 sub-blocks of 16: x = d * (s - 32) * (q - 4 * !hbit), s 6-bit, q 2 low bits + hmask bit
struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];    // high bit of each quant
    uint8_t qs[kQK_K / 4];       // low 2 bits
    uint8_t scales[12];          // 16 6-bit scales, packed
    uint16_t d;                  // fp16 super-block scale
};
// 8 sub-blocks of 32: x = d * sc * q - dmin * m, sc/m 6-bit, q in [0, 15]
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[kKScaleSize];  // 8 scales + 8 mins, 6 bits each, packed
    uint8_t qs[kQK_K / 2];        // nibbles: qs[32*g + l] low = element 64g + l, high = 64g + 32 + l
};
// 8 sub-blocks of 32: as Q4_K with a 5th bit in qh
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[kKScaleSize];
    uint8_t qh[kQK_K / 8];        // bit 2g (low) / 2g+1 (high) of qh[l] = 5th bit of group g's quant l
    uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q 6-bit (4 low bits in ql, 2 high in qh)
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    uint16_t d;
};
// Q3_KV, the rows of the tq3 KV cache (not a GGUF type): blocks of 32 elements of a rotated head, whose
// values are close to Gaussian, each coded as a sign and one of the four magnitudes of the 8-level
// Lloyd-Max quantizer of the unit Gaussian. x = d * kQ3KVValues[c], c = m | s << 2: the magnitude index
// m of element j in bits 2 (j % 4) of qs[j / 4], its sign s in bit j % 8 of qh[j / 8]. 3.5 bits an element.
struct BlockQ3_KV {
    uint16_t d;     // fp16 scale
    uint8_t qs[8];  // 2-bit magnitude indices
    uint8_t qh[4];  // signs
};
constexpr float kQ3KVValues[8] = {0.2450942f,  0.7560053f,  1.3439093f,  2.1519457f,
                                  -0.2450942f, -0.7560053f, -1.3439093f, -2.1519457f};
// The decision bounds of the magnitudes: the midpoints of neighbouring levels.
constexpr float kQ3KVBounds[3] = {0.5005497f, 1.0499573f, 1.7479275f};

// The 16 levels of IQ4_NL and IQ4_XS: a non-uniform grid, denser near zero where trained weights
// crowd.
constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// x = d * kIQ4NLValues[q], q in [0, 15]
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};
// 8 sub-blocks of 32: x = d * (ls - 32) * kIQ4NLValues[q], ls 6-bit: low 4 bits in nibble (j % 2) of
// scales_l[j / 2], high 2 bits in bits 2j..2j+1 of scales_h; sub-block j's codes in qs[16j .. 16j+15]
// (low nibble element l, high element l + 16)
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQK_K / 64];
    uint8_t qs[kQK_K / 2];
};

// The 16 6-bit scales of a Q3_K block, unpacked (still offset by 32).
inline void unpack_q3_k_scales(const uint8_t* packed, int8_t* out) {
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
        const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = int8_t(low | (high << 4));
    }
}

// The 6-bit scale ls of sub-block j (0..7) of an IQ4_XS block: the sub-block's scale is d * (ls - 32).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int
    iq4_xs_scale(const BlockIQ4_XS& b, int j) {
    return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

// Activations for the K-quant dot products: x = d * q, with per-16 sums of q.
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block size");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block size");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block size");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block size");
// Q4_KV, the value rows of the kivi4 KV cache (not a GGUF type): Q4_0's codes under a one-byte scale,
// 4.25 bits an element. x = q4_kv_scale(e) * (q - 8), the code q of element j (0-15) in the low nibble of
// qs[j], of element j + 16 in the high one. The scale byte e holds the scale's sign in bit 7 and in bits
// 0-6 k, its size 2^((k - 88) / 4) in quarter octaves (about 2.8e-7 to 860), k = 0 meaning 0.
struct BlockQ4_KV {
    uint8_t e;
    uint8_t qs[16];
};
constexpr float q4_kv_scale_of(int e) {
    const int k = e & 127;
    if (k == 0) return 0.0f;
    constexpr float kQuarter[4] = {1.0f, 1.18920712f, 1.41421356f, 1.68179283f};  // 2^(r / 4)
    const int q = k - 88, octave = (q >= 0 ? q : q - 3) / 4;                      // floor(q / 4)
    float v = kQuarter[q - 4 * octave];
    for (int o = octave; o > 0; --o) v *= 2.0f;  // exact: the same floats on every machine
    for (int o = octave; o < 0; ++o) v *= 0.5f;
    return (e & 128) ? -v : v;
}
struct Q4KVScaleTable {
    float v[256];
};
constexpr Q4KVScaleTable kQ4KVScales = [] {
    Q4KVScaleTable t{};
    for (int e = 0; e < 256; ++e) t.v[e] = q4_kv_scale_of(e);
    return t;
}();
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block size");
static_assert(sizeof(BlockQ8_1) == 36, "Q8_1 block size");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block size");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block size");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block size");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block size");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block size");
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block size");
static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block size");
static_assert(sizeof(BlockQ3_KV) == 14, "Q3_KV block size");
static_assert(sizeof(BlockQ4_KV) == 17, "Q4_KV block size");
static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block size");

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

}  // namespace cera
