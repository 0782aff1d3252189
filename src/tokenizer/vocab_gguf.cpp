// Vocabulary from GGUF metadata, with llama.cpp's defaults for keys a file leaves out.
#include <algorithm>
#include <cctype>

#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/keys.h"
#include "tokenizer/vocab_io.h"

namespace cera {
namespace {

// A special token id from the file: absent, negative or 0xFFFFFFFF mean "none" (keeps `fallback`).
int32_t read_id(const gguf::File& f, std::string_view key, int32_t fallback, int32_t n_tokens) {
    const gguf::Value* v = f.find(key);
    if (!v) return (fallback >= 0 && fallback < n_tokens) ? fallback : kNoToken;
    if (!v->is_integer())
        throw_error(ErrorCode::kInvalidFile, "%s: %.*s must be an integer, got %s", f.path().c_str(),
                    int(key.size()), key.data(), gguf::value_type_name(v->type));
    int64_t id;
    if (v->type == gguf::ValueType::kU64 || v->type == gguf::ValueType::kU32 || v->type == gguf::ValueType::kU16 ||
        v->type == gguf::ValueType::kU8) {
        const uint64_t u = v->as_uint();
        if (u == 0xFFFFFFFFULL || u == ~0ULL) return kNoToken;
        id = u > uint64_t(INT32_MAX) ? INT64_MAX : int64_t(u);
    } else {
        id = v->as_int();
        if (id < 0) return kNoToken;
    }
    if (id >= n_tokens)
        throw_error(ErrorCode::kInvalidFile, "%s: %.*s = %lld is out of range (vocabulary of %d tokens)",
                    f.path().c_str(), int(key.size()), key.data(), (long long)id, n_tokens);
    return int32_t(id);
}

}  // namespace

VocabData vocab_data_from_gguf(const gguf::File& f) {
    namespace k = gguf::keys;
    VocabData d;
    const std::string model = f.get_string(k::kTokModel);
    const std::string pre = f.get_string(k::kTokPre, "");
    int32_t def_bos, def_eos, def_unk;
    if (model == "llama") {
        d.model = VocabModel::kSpm;
        d.pre = PreTokenizer::kNone;
        d.add_space_prefix = true;
        d.add_bos = true;
        d.clean_spaces = false;
        def_bos = 1, def_eos = 2, def_unk = 0;
    } else if (model == "gpt2") {
        d.model = VocabModel::kBpe;
        const PreTokenizerInfo info = pre_tokenizer_from_name(pre);
        d.pre = info.type;
        d.ignore_merges = info.ignore_merges;
        d.add_bos = info.add_bos;
        d.clean_spaces = info.clean_spaces;
        d.byte_encode = true;
        def_bos = 11, def_eos = 11, def_unk = kNoToken;
    } else {
        throw_error(ErrorCode::kUnsupported, "%s: unsupported tokenizer model '%s' (tokenizer.ggml.model)",
                    f.path().c_str(), model.c_str());
    }

    d.tokens = f.get_string_array(k::kTokTokens);
    const int64_t n = int64_t(d.tokens.size());
    if (n == 0 || n > kMaxVocabSize)
        throw_error(ErrorCode::kInvalidFile, "%s: tokenizer.ggml.tokens has %lld entries", f.path().c_str(),
                    (long long)n);
    const int32_t n32 = int32_t(n);
    if (f.has(k::kTokScores)) {
        d.scores = f.get_f32_array(k::kTokScores);
        if (int64_t(d.scores.size()) != n)
            throw_error(ErrorCode::kInvalidFile, "%s: tokenizer.ggml.scores has %zu entries for %lld tokens",
                        f.path().c_str(), d.scores.size(), (long long)n);
    }
    if (f.has(k::kTokTypes)) {
        const std::vector<int64_t> types = f.get_int_array(k::kTokTypes);
        if (int64_t(types.size()) != n)
            throw_error(ErrorCode::kInvalidFile, "%s: tokenizer.ggml.token_type has %zu entries for %lld tokens",
                        f.path().c_str(), types.size(), (long long)n);
        d.types.resize(types.size());
        for (size_t i = 0; i < types.size(); ++i) {
            const int64_t t = types[i];
            // Unknown type values read as "undefined", like llama.cpp.
            d.types[i] = (t >= 1 && t <= 6) ? TokenType(t) : TokenType::kUndefined;
        }
    }
    if (d.model == VocabModel::kBpe) {
        if (!f.has(k::kTokMerges))
            throw_error(ErrorCode::kMissing, "%s: a gpt2 tokenizer needs tokenizer.ggml.merges", f.path().c_str());
        std::vector<std::string> merges = f.get_string_array(k::kTokMerges);
        d.merges.reserve(merges.size());
        for (size_t i = 0; i < merges.size(); ++i) {
            const std::string& m = merges[i];
            const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
            if (sp == std::string::npos || sp + 1 >= m.size())
                throw_error(ErrorCode::kInvalidFile, "%s: tokenizer.ggml.merges[%zu] = '%s' is not 'left right'",
                            f.path().c_str(), i, m.c_str());
            d.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
        }
    }

    d.bos = read_id(f, k::kTokBos, def_bos, n32);
    d.eos = read_id(f, k::kTokEos, def_eos, n32);
    d.eot = read_id(f, k::kTokEot, kNoToken, n32);
    d.eom = read_id(f, k::kTokEom, kNoToken, n32);
    d.unk = read_id(f, k::kTokUnk, def_unk, n32);
    d.pad = read_id(f, k::kTokPad, kNoToken, n32);
    // Fill-in-the-middle ids; the older key names are the fallback.
    d.fim_pre = read_id(f, "tokenizer.ggml.fim_pre_token_id",
                        read_id(f, "tokenizer.ggml.prefix_token_id", kNoToken, n32), n32);
    d.fim_suf = read_id(f, "tokenizer.ggml.fim_suf_token_id",
                        read_id(f, "tokenizer.ggml.suffix_token_id", kNoToken, n32), n32);
    d.fim_mid = read_id(f, "tokenizer.ggml.fim_mid_token_id",
                        read_id(f, "tokenizer.ggml.middle_token_id", kNoToken, n32), n32);
    d.fim_pad = read_id(f, "tokenizer.ggml.fim_pad_token_id", kNoToken, n32);
    d.fim_rep = read_id(f, "tokenizer.ggml.fim_rep_token_id", kNoToken, n32);
    d.fim_sep = read_id(f, "tokenizer.ggml.fim_sep_token_id", kNoToken, n32);
    d.add_bos = f.get_bool(k::kTokAddBos, d.add_bos);
    d.add_eos = f.get_bool(k::kTokAddEos, d.add_eos);
    d.add_space_prefix = f.get_bool(k::kTokAddSpacePrefix, d.add_space_prefix);
    d.chat_template = f.get_string(k::kChatTemplate, "");

    // Phi-3 files: special tokens eat the whitespace after them (llama.cpp keys this on the name).
    std::string name = f.get_string(k::kName, "");
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t i = 0; i < n32; ++i) {
            const std::string& t = d.tokens[size_t(i)];
            const TokenType ty = d.types.empty() ? TokenType::kNormal : d.types[size_t(i)];
            const bool special =
                ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown;
            if ((special || t == "</s>") && t != "<unk>" && t != "<s>" && t != "<|endoftext|>") d.rstrip.push_back(i);
        }
    }
    return d;
}

}  // namespace cera
