#include "core/dtype.h"

#include <array>

#include "core/check.h"

namespace cera {
namespace {

constexpr std::array kTypes = {
    TypeInfo{GgmlType::kF32, "F32", 1, 4, false},         TypeInfo{GgmlType::kF16, "F16", 1, 2, false},
    TypeInfo{GgmlType::kQ4_0, "Q4_0", 32, 18, true},      TypeInfo{GgmlType::kQ4_1, "Q4_1", 32, 20, true},
    TypeInfo{GgmlType::kQ5_0, "Q5_0", 32, 22, true},      TypeInfo{GgmlType::kQ5_1, "Q5_1", 32, 24, true},
    TypeInfo{GgmlType::kQ8_0, "Q8_0", 32, 34, true},      TypeInfo{GgmlType::kQ8_1, "Q8_1", 32, 36, true},
    TypeInfo{GgmlType::kQ2_K, "Q2_K", 256, 84, true},     TypeInfo{GgmlType::kQ3_K, "Q3_K", 256, 110, true},
    TypeInfo{GgmlType::kQ4_K, "Q4_K", 256, 144, true},    TypeInfo{GgmlType::kQ5_K, "Q5_K", 256, 176, true},
    TypeInfo{GgmlType::kQ6_K, "Q6_K", 256, 210, true},    TypeInfo{GgmlType::kQ8_K, "Q8_K", 256, 292, true},
    TypeInfo{GgmlType::kIQ2_XXS, "IQ2_XXS", 256, 66, true}, TypeInfo{GgmlType::kIQ2_XS, "IQ2_XS", 256, 74, true},
    TypeInfo{GgmlType::kIQ3_XXS, "IQ3_XXS", 256, 98, true}, TypeInfo{GgmlType::kIQ1_S, "IQ1_S", 256, 50, true},
    TypeInfo{GgmlType::kIQ4_NL, "IQ4_NL", 32, 18, true},  TypeInfo{GgmlType::kIQ3_S, "IQ3_S", 256, 110, true},
    TypeInfo{GgmlType::kIQ2_S, "IQ2_S", 256, 82, true},   TypeInfo{GgmlType::kIQ4_XS, "IQ4_XS", 256, 136, true},
    TypeInfo{GgmlType::kI8, "I8", 1, 1, false},           TypeInfo{GgmlType::kI16, "I16", 1, 2, false},
    TypeInfo{GgmlType::kI32, "I32", 1, 4, false},         TypeInfo{GgmlType::kI64, "I64", 1, 8, false},
    TypeInfo{GgmlType::kF64, "F64", 1, 8, false},         TypeInfo{GgmlType::kIQ1_M, "IQ1_M", 256, 56, true},
    TypeInfo{GgmlType::kBF16, "BF16", 1, 2, false},       TypeInfo{GgmlType::kTQ1_0, "TQ1_0", 256, 54, true},
    TypeInfo{GgmlType::kTQ2_0, "TQ2_0", 256, 66, true},   TypeInfo{GgmlType::kMXFP4, "MXFP4", 32, 17, true},
};

// Q4_CH's blocks are nominal (18 bytes for 32 elements of a row): a row's bytes are 4.5 bits an element,
// the codes laid out by groups of 64 rows; the rows of its open groups are Q8_0 rows (kv_groups.h).
constexpr TypeInfo kCacheTypes[] = {TypeInfo{GgmlType::kQ3_KV, "Q3_KV", 32, 14, true},
                                    TypeInfo{GgmlType::kQ4_CH, "Q4_CH", 32, 18, true},
                                    TypeInfo{GgmlType::kQ4_KV, "Q4_KV", 32, 17, true}};

}  // namespace

const TypeInfo* type_info(uint32_t id) {
    for (const TypeInfo& t : kTypes)
        if (uint32_t(t.type) == id) return &t;
    return nullptr;
}

const TypeInfo& type_info(GgmlType type) {
    const TypeInfo* t = type_info(uint32_t(type));
    for (const TypeInfo& c : kCacheTypes)
        if (!t && c.type == type) t = &c;
    CERA_CHECK(t != nullptr, "unknown GgmlType %u", unsigned(type));
    return *t;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
    for (const TypeInfo& t : kTypes)
        if (name == t.name) return t.type;
    return std::nullopt;
}

}  // namespace cera
