// Tensor element types as GGUF numbers them (ggml_type), and their block sizes.
// The block layouts and reference (de)quantizers live in src/core/quant/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cera {

enum class GgmlType : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ5_0 = 6,
    kQ5_1 = 7,
    kQ8_0 = 8,
    kQ8_1 = 9,
    kQ2_K = 10,
    kQ3_K = 11,
    kQ4_K = 12,
    kQ5_K = 13,
    kQ6_K = 14,
    kQ8_K = 15,
    kIQ2_XXS = 16,
    kIQ2_XS = 17,
    kIQ3_XXS = 18,
    kIQ1_S = 19,
    kIQ4_NL = 20,
    kIQ3_S = 21,
    kIQ2_S = 22,
    kIQ4_XS = 23,
    kI8 = 24,
    kI16 = 25,
    kI32 = 26,
    kI64 = 27,
    kF64 = 28,
    kIQ1_M = 29,
    kBF16 = 30,
    kTQ1_0 = 34,
    kTQ2_0 = 35,
    kMXFP4 = 39,
    // Cache-only types (no GGUF file holds them; type_info(uint32_t) and type_from_name do not know them);
    // ids below 256 (a saved state packs cache types in 8 bits).
    kQ3_KV = 200,  // the 3-bit rows of the tq3 KV cache (core/quant/blocks.h BlockQ3_KV)
    kQ4_CH = 201,  // the key rows of the kivi4 KV cache, coded per channel over 64 rows (core/quant/kv_groups.h)
    kQ4_KV = 202,  // the value rows of the kivi4 KV cache (core/quant/blocks.h BlockQ4_KV)
};

// Static facts about a type: its GGUF name, elements per block, bytes per block.
struct TypeInfo {
    GgmlType type;
    const char* name;    // as GGUF and llama.cpp spell it: "F32", "Q4_K", ...
    int64_t block_size;  // elements per block (1 for plain types)
    size_t type_size;    // bytes per block
    bool quantized;
};

// The GGUF type of id; nullptr when `id` is not a GGUF type this build knows (unknown or removed ids).
const TypeInfo* type_info(uint32_t id);
const TypeInfo& type_info(GgmlType type);
inline const char* type_name(GgmlType type) { return type_info(type).name; }
std::optional<GgmlType> type_from_name(std::string_view name);  // "Q4_0" -> kQ4_0

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_size(GgmlType type, int64_t n) {
    const TypeInfo& ti = type_info(type);
    return size_t(n / ti.block_size) * ti.type_size;
}

}  // namespace cera
