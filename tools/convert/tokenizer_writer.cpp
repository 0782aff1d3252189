#include "convert/tokenizer_writer.h"

#include <cctype>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "gguf/keys.h"
#include "tokenizer/vocab_io.h"

namespace cera::convert {

namespace fs = std::filesystem;

// The tokenizer is read by the same reader that runs HF tokenizers (vocab_data_from_hf_json), which
// refuses what it cannot reproduce; here it is written in the GGUF form that tokenizes the same way,
// or refused when GGUF has no such form.
void write_tokenizer(const fs::path& dir, const HfConfig& config, int64_t n_vocab, gguf::Writer& w) {
    const fs::path tok_path = dir / "tokenizer.json";
    if (!fs::exists(tok_path)) throw_error(ErrorCode::kMissing, "%s not found", tok_path.c_str());
    const fs::path cfg_path = dir / "tokenizer_config.json";
    VocabData d = vocab_data_from_hf_json(tok_path.string(), fs::exists(cfg_path) ? cfg_path.string() : "");
    auto refuse = [&](const char* what) {
        throw_error(ErrorCode::kUnsupported, "%s: %s; a GGUF tokenizer cannot reproduce it", tok_path.c_str(), what);
    };
    if (d.nfc) refuse("the NFC normalizer");
    if (!d.lstrip.empty() || !d.rstrip.empty()) refuse("added tokens with lstrip/rstrip");
    if (d.add_eos && d.eos == kNoToken) refuse("add_eos_token without an EOS token");
    if (int64_t(d.tokens.size()) > n_vocab)
        throw_error(ErrorCode::kInvalidFile, "%s: %zu tokens, but config.json's vocab_size is %lld", tok_path.c_str(),
                    d.tokens.size(), (long long)n_vocab);

    // Ids that no token uses (holes, or a vocab_size larger than the tokenizer) are padding tokens.
    std::vector<std::string> tokens = std::move(d.tokens);
    std::vector<int32_t> types(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        types[i] = int32_t(d.types[i]);
        if (d.types[i] == TokenType::kUnused) tokens[i] = "[PAD" + std::to_string(i) + "]";
    }
    for (int64_t i = int64_t(tokens.size()); i < n_vocab; ++i) {
        tokens.push_back("[PAD" + std::to_string(i) + "]");
        types.push_back(int32_t(TokenType::kUnused));
    }
    if (d.unk != kNoToken) types[size_t(d.unk)] = int32_t(TokenType::kUnknown);
    std::unordered_map<std::string, int64_t> id_of;
    for (size_t i = 0; i < tokens.size(); ++i) id_of.emplace(tokens[i], int64_t(i));
    std::vector<std::string> merges;
    merges.reserve(d.merges.size());
    for (const auto& [a, b] : d.merges) merges.push_back(a + " " + b);

    namespace k = gguf::keys;
    if (d.byte_encode) {
        // Byte-level BPE: llama.cpp's gpt2 model, the pre-tokenizer named by its rules and flags.
        if (d.byte_fallback) refuse("byte-level BPE with byte_fallback");
        if (d.pre == PreTokenizer::kNone) refuse("byte-level BPE without a split regex");
        const char* pre = pre_tokenizer_gguf_name(d.pre, d.ignore_merges, d.clean_spaces);
        if (!pre) refuse("this split regex with these ignore_merges / clean_up_tokenization_spaces flags");
        w.set_string(k::kTokModel, "gpt2");
        w.set_string(k::kTokPre, pre);
        w.set(k::kTokTokens, gguf::value_string_array(tokens));
        w.set(k::kTokTypes, gguf::value_i32_array(types));
        w.set(k::kTokMerges, gguf::value_string_array(merges));
    } else {
        // BPE over '▁'-escaped text with byte fallback: a SentencePiece-style vocabulary (llama.cpp's
        // `llama` model). llama.cpp writes every score as -1000, which loses the merge order; here a token
        // made by merge rank r scores -(r + 1) (base symbols 0), so an SPM encoder that merges the
        // highest-scoring pair first follows the BPE merge order. The merges are written too.
        if (!d.escape_whitespace) refuse("BPE over unescaped text without byte-level encoding");
        if (!d.byte_fallback) refuse("'\xE2\x96\x81'-style BPE without byte_fallback");
        if (d.ignore_merges) refuse("'\xE2\x96\x81'-style BPE with ignore_merges");
        std::vector<float> scores(tokens.size(), 0.0f);
        for (size_t r = 0; r < merges.size(); ++r) {
            auto it = id_of.find(d.merges[r].first + d.merges[r].second);
            if (it != id_of.end() && scores[size_t(it->second)] == 0.0f) scores[size_t(it->second)] = -float(r + 1);
        }
        for (size_t i = 0; i < tokens.size(); ++i) {
            const std::string& t = tokens[i];
            if (types[i] == int32_t(TokenType::kNormal) && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' &&
                std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
                types[i] = int32_t(TokenType::kByte);
        }
        w.set_string(k::kTokModel, "llama");
        w.set_string(k::kTokPre, "default");
        w.set(k::kTokTokens, gguf::value_string_array(tokens));
        w.set(k::kTokScores, gguf::value_f32_array(scores));
        w.set(k::kTokTypes, gguf::value_i32_array(types));
        if (!merges.empty()) w.set(k::kTokMerges, gguf::value_string_array(merges));
        w.set_bool(k::kTokAddSpacePrefix, d.add_space_prefix);
    }

    // Special ids: the tokenizer's, else config.json's.
    auto special = [&](int32_t id, const char* cfg_key) -> std::optional<int64_t> {
        if (id != kNoToken) return id;
        const nlohmann::json& c = config.raw();
        if (c.contains(cfg_key) && c[cfg_key].is_number_integer()) {
            const int64_t v = c[cfg_key].get<int64_t>();
            if (v >= 0 && v < n_vocab) return v;
        }
        return std::nullopt;
    };
    if (auto id = special(d.bos, "bos_token_id")) w.set_u32(k::kTokBos, uint32_t(*id));
    if (auto id = special(d.eos, "eos_token_id")) w.set_u32(k::kTokEos, uint32_t(*id));
    if (d.unk != kNoToken) w.set_u32(k::kTokUnk, uint32_t(d.unk));
    if (auto id = special(d.pad, "pad_token_id")) w.set_u32(k::kTokPad, uint32_t(*id));
    w.set_bool(k::kTokAddBos, d.add_bos);
    w.set_bool(k::kTokAddSep, false);
    w.set_bool(k::kTokAddEos, d.add_eos);
    if (!d.chat_template.empty()) w.set_string(k::kChatTemplate, d.chat_template);
}

}  // namespace cera::convert
