// GGUF key names used across cera. `{arch}` keys are built with arch_key().
#pragma once
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace cera::gguf::keys {

inline constexpr std::string_view kArchitecture = "general.architecture";
inline constexpr std::string_view kName = "general.name";
inline constexpr std::string_view kAlignment = "general.alignment";
inline constexpr std::string_view kFileType = "general.file_type";
inline constexpr std::string_view kQuantVersion = "general.quantization_version";

inline constexpr std::string_view kTokModel = "tokenizer.ggml.model";
inline constexpr std::string_view kTokPre = "tokenizer.ggml.pre";
inline constexpr std::string_view kTokTokens = "tokenizer.ggml.tokens";
inline constexpr std::string_view kTokTypes = "tokenizer.ggml.token_type";
inline constexpr std::string_view kTokScores = "tokenizer.ggml.scores";
inline constexpr std::string_view kTokMerges = "tokenizer.ggml.merges";
inline constexpr std::string_view kTokBos = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kTokEos = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kTokEot = "tokenizer.ggml.eot_token_id";
inline constexpr std::string_view kTokEom = "tokenizer.ggml.eom_token_id";
inline constexpr std::string_view kTokUnk = "tokenizer.ggml.unknown_token_id";
inline constexpr std::string_view kTokPad = "tokenizer.ggml.padding_token_id";
inline constexpr std::string_view kTokAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr std::string_view kTokAddEos = "tokenizer.ggml.add_eos_token";
inline constexpr std::string_view kTokAddSep = "tokenizer.ggml.add_sep_token";
inline constexpr std::string_view kTokAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
inline constexpr std::string_view kChatTemplate = "tokenizer.chat_template";

// "{arch}.suffix", e.g. arch_key("lfm2", "block_count") -> "lfm2.block_count".
inline std::string arch_key(std::string_view arch, std::string_view suffix) {
    std::string k(arch);
    k += '.';
    k += suffix;
    return k;
}

// The `general.file_type` value (llama.cpp's llama_ftype) of a file whose weights are mostly
// `t`. K-quants are labelled as the _M mixes when k_medium is set (the embedding and some FFN
// tensors kept at a higher type), else as _S.
inline uint32_t file_type_of(GgmlType t, bool k_medium) {
    switch (t) {
        case GgmlType::kF32: return 0;
        case GgmlType::kF16: return 1;
        case GgmlType::kQ4_0: return 2;
        case GgmlType::kQ4_1: return 3;
        case GgmlType::kQ8_0: return 7;
        case GgmlType::kQ5_0: return 8;
        case GgmlType::kQ5_1: return 9;
        case GgmlType::kQ4_K: return k_medium ? 15 : 14;
        case GgmlType::kQ5_K: return k_medium ? 17 : 16;
        case GgmlType::kQ6_K: return 18;
        case GgmlType::kBF16: return 32;
        default: return 0;
    }
}

}  // namespace cera::gguf::keys
