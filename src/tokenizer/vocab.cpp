// Vocabulary validation and indexing; the table of pre-tokenizer names.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "tokenizer/unicode.h"

namespace cera {
namespace {

struct PreName {
    const char* name;
    PreTokenizer type;
    bool ignore_merges;
    bool add_bos;
    bool clean_spaces;
};

// tokenizer.ggml.pre values, with the flags llama.cpp attaches to each.
constexpr PreName kPreNames[] = {
    {"default", PreTokenizer::kDefault, false, false, true},
    {"llama-bpe", PreTokenizer::kLlama3, true, true, true},
    {"llama3", PreTokenizer::kLlama3, true, true, true},
    {"llama-v3", PreTokenizer::kLlama3, true, true, true},
    {"lfm2", PreTokenizer::kLlama3, true, true, true},
    {"falcon3", PreTokenizer::kLlama3, true, true, true},
    {"falcon-h1", PreTokenizer::kLlama3, true, true, true},
    {"pixtral", PreTokenizer::kLlama3, true, true, true},
    {"midm-2.0", PreTokenizer::kLlama3, true, true, true},
    {"dbrx", PreTokenizer::kLlama3, false, false, true},
    {"smaug-bpe", PreTokenizer::kLlama3, false, false, true},
    {"qwen2", PreTokenizer::kQwen2, false, false, false},
    {"deepseek-r1-qwen", PreTokenizer::kQwen2, false, false, false},
    {"stablelm2", PreTokenizer::kQwen2, false, false, true},
    {"megrez", PreTokenizer::kQwen2, false, false, true},
    {"hunyuan", PreTokenizer::kQwen2, false, false, false},
    {"grok-2", PreTokenizer::kQwen2, false, false, false},
    {"deepseek-llm", PreTokenizer::kDeepseekLlm, false, false, false},
    {"deepseek-coder", PreTokenizer::kDeepseekCoder, false, false, false},
    {"falcon", PreTokenizer::kFalcon, false, false, true},
    {"gpt-2", PreTokenizer::kGpt2, false, false, true},
    {"gpt2", PreTokenizer::kGpt2, false, false, true},
    {"phi-2", PreTokenizer::kGpt2, false, false, true},
    {"gpt-neox", PreTokenizer::kGpt2, false, false, true},
    {"mpt", PreTokenizer::kGpt2, false, false, true},
    {"olmo", PreTokenizer::kGpt2, false, false, true},
    {"jais", PreTokenizer::kGpt2, false, false, true},
    {"exaone4", PreTokenizer::kGpt2, false, false, true},
    {"roberta-bpe", PreTokenizer::kGpt2, false, false, true},
    {"trillion", PreTokenizer::kGpt2, false, false, false},
    {"granite-docling", PreTokenizer::kGpt2, false, false, false},
    {"starcoder", PreTokenizer::kStarcoder, false, false, true},
    {"refact", PreTokenizer::kStarcoder, false, false, true},
    {"command-r", PreTokenizer::kStarcoder, false, false, false},
    {"smollm", PreTokenizer::kStarcoder, false, false, false},
    {"codeshell", PreTokenizer::kStarcoder, false, false, true},
    {"exaone", PreTokenizer::kStarcoder, false, false, true},
    {"minerva-7b", PreTokenizer::kStarcoder, false, false, true},
};

constexpr char kEndOfSentence[] = "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>";  // DeepSeek

// Token texts that end generation (llama.cpp's list, by text).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", kEndOfSentence,
    "[e~[",
};
// Texts that identify the EOT and fill-in-the-middle tokens when the file does not name them.
constexpr const char* kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", kEndOfSentence, "<end_of_utterance>",
};
constexpr const char* kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
                                        "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
constexpr const char* kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>",
                                        "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
constexpr const char* kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>",
                                        "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>"};

void check_id(int32_t id, int32_t n, const char* what) {
    if (id != kNoToken && (id < 0 || id >= n))
        throw_error(ErrorCode::kInvalidFile, "tokenizer: %s token id %d is out of range (vocabulary of %d tokens)",
                    what, id, n);
}

uint64_t hash_text(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t(s.size()) * 0xff51afd7ed558ccdULL);
    const char* p = s.data();
    size_t n = s.size();
    while (n >= 8) {
        uint64_t x;
        std::memcpy(&x, p, 8);
        h = (h ^ x) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    std::memcpy(&x, p, n);
    h = (h ^ x) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h;
}

uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

}  // namespace

PreTokenizerInfo pre_tokenizer_from_name(std::string_view name) {
    if (name.empty()) return {PreTokenizer::kDefault, false, false, true};
    for (const PreName& p : kPreNames) {
        if (name == p.name) return {p.type, p.ignore_merges, p.add_bos, p.clean_spaces};
    }
    throw_error(ErrorCode::kUnsupported, "tokenizer: unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                int(name.size()), name.data());
}

const char* pre_tokenizer_gguf_name(PreTokenizer p, bool ignore_merges, bool clean_spaces) {
    for (const PreName& n : kPreNames) {
        if (n.type == p && n.ignore_merges == ignore_merges && n.clean_spaces == clean_spaces) return n.name;
    }
    return nullptr;
}

const char* pre_tokenizer_name(PreTokenizer p) {
    switch (p) {
        case PreTokenizer::kNone: return "none";
        case PreTokenizer::kDefault: return "default";
        case PreTokenizer::kGpt2: return "gpt-2";
        case PreTokenizer::kLlama3: return "llama3";
        case PreTokenizer::kQwen2: return "qwen2";
        case PreTokenizer::kDeepseekLlm: return "deepseek-llm";
        case PreTokenizer::kDeepseekCoder: return "deepseek-coder";
        case PreTokenizer::kFalcon: return "falcon";
        case PreTokenizer::kStarcoder: return "starcoder";
    }
    return "?";
}

Vocab::Vocab(VocabData data) : d_(std::move(data)) {
    static std::atomic<uint64_t> next_serial{1};
    serial_ = next_serial.fetch_add(1);
    tokens_ = std::move(d_.tokens);
    scores_ = std::move(d_.scores);
    types_ = std::move(d_.types);
    std::vector<std::pair<std::string, std::string>> merges = std::move(d_.merges);
    d_.tokens.clear();
    d_.merges.clear();

    const int64_t n = int64_t(tokens_.size());
    if (n == 0) throw_error(ErrorCode::kInvalidFile, "tokenizer: the vocabulary is empty");
    if (n > kMaxVocabSize)
        throw_error(ErrorCode::kInvalidFile, "tokenizer: vocabulary of %lld tokens is larger than the limit %lld",
                    (long long)n, (long long)kMaxVocabSize);
    if (!scores_.empty() && int64_t(scores_.size()) != n)
        throw_error(ErrorCode::kInvalidFile, "tokenizer: %zu scores for %lld tokens", scores_.size(), (long long)n);
    if (types_.empty()) types_.assign(size_t(n), TokenType::kNormal);
    if (int64_t(types_.size()) != n)
        throw_error(ErrorCode::kInvalidFile, "tokenizer: %zu token types for %lld tokens", types_.size(),
                    (long long)n);
    for (size_t i = 0; i < types_.size(); ++i) {
        const int32_t t = int32_t(types_[i]);
        if (t < 0 || t > int32_t(TokenType::kByte))
            throw_error(ErrorCode::kInvalidFile, "tokenizer: token %zu has invalid type %d", i, t);
    }
    const int32_t n32 = int32_t(n);
    check_id(d_.bos, n32, "BOS");
    check_id(d_.eos, n32, "EOS");
    check_id(d_.eot, n32, "EOT");
    check_id(d_.eom, n32, "EOM");
    check_id(d_.unk, n32, "unknown");
    check_id(d_.pad, n32, "padding");
    for (int32_t id : {d_.fim_pre, d_.fim_suf, d_.fim_mid, d_.fim_pad, d_.fim_rep, d_.fim_sep}) check_id(id, n32, "FIM");
    for (int32_t id : d_.lstrip) check_id(id, n32, "lstrip");
    for (int32_t id : d_.rstrip) check_id(id, n32, "rstrip");
    for (int32_t id : d_.extra_eog) check_id(id, n32, "end-of-generation");
    if (d_.add_bos && d_.bos == kNoToken)
        throw_error(ErrorCode::kInvalidFile, "tokenizer: add_bos_token is true but there is no BOS token id");
    if (d_.add_eos && d_.eos == kNoToken)
        throw_error(ErrorCode::kInvalidFile, "tokenizer: add_eos_token is true but there is no EOS token id");

    for (int32_t i = 0; i < n32; ++i) {
        std::string& t = tokens_[size_t(i)];
        if (t.empty()) t = "[EMPTY_" + std::to_string(i) + "]";
        max_token_len_ = std::max(max_token_len_, int32_t(t.size()));
    }
    size_t cap = 64;
    while (cap < size_t(n) * 2) cap <<= 1;
    text_table_.assign(cap, TextSlot{0, -1});
    text_mask_ = cap - 1;
    for (int32_t i = 0; i < n32; ++i) {
        const int32_t other = insert(tokens_[size_t(i)], i);
        if (other != kNoToken)
            throw_error(ErrorCode::kInvalidFile, "tokenizer: duplicate token '%s' has ids %d and %d",
                        tokens_[size_t(i)].c_str(), other, i);
    }

    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        int32_t id = find(hex);
        if (id == kNoToken) {
            if (d_.model == VocabModel::kBpe && d_.byte_encode) {
                id = find(unicode::byte_to_unicode(uint8_t(b)));
            } else {
                const char c = char(b);
                id = find(std::string_view(&c, 1));
            }
        }
        byte_tokens_[b] = id;
    }

    attr_.assign(size_t(n), 0);
    for (int32_t id : d_.lstrip) attr_[size_t(id)] |= kAttrLstrip;
    for (int32_t id : d_.rstrip) attr_[size_t(id)] |= kAttrRstrip;

    build_eog();

    for (int32_t i = 0; i < n32; ++i) {
        const TokenType t = types_[size_t(i)];
        if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) special_.push_back(i);
    }
    std::stable_sort(special_.begin(), special_.end(),
                     [&](int32_t a, int32_t b) { return tokens_[size_t(a)].size() > tokens_[size_t(b)].size(); });
    special_prefix_bits_.assign(65536 / 64, 0);
    for (int32_t id : special_) {
        const std::string& t = tokens_[size_t(id)];
        if (t.size() < 2) {
            special_short_.push_back(id);
            continue;
        }
        const uint32_t key = (uint32_t(uint8_t(t[0])) << 8) | uint8_t(t[1]);
        special_prefix_bits_[key >> 6] |= 1ULL << (key & 63);
        special_by_prefix_[key].push_back(id);
    }

    if (d_.model == VocabModel::kBpe) build_merges(merges);
    for (int b = 0; b < 256; ++b) byte_symbols_[b] = find_symbol(unicode::byte_to_unicode(uint8_t(b)));

    static constexpr std::string_view kMark = "\xE2\x96\x81";
    spm_splits_at_spaces_ = true;
    for (const std::string& t : tokens_) {
        for (size_t p = t.find(kMark, 1); p != std::string::npos; p = t.find(kMark, p + 1)) {
            if (p < kMark.size() || t.compare(p - kMark.size(), kMark.size(), kMark) != 0) {
                spm_splits_at_spaces_ = false;
                break;
            }
        }
        if (!spm_splits_at_spaces_) break;
    }
}

size_t Vocab::find_special_tokens(std::string_view text, std::vector<uint8_t>& present) const {
    present.assign(tokens_.size(), 0);
    size_t found = 0;
    for (int32_t id : special_short_) {
        if (text.find(tokens_[size_t(id)]) != std::string_view::npos) {
            present[size_t(id)] = 1;
            ++found;
        }
    }
    if (special_by_prefix_.empty()) return found;
    for (size_t i = 0; i + 1 < text.size(); ++i) {
        const uint32_t key = (uint32_t(uint8_t(text[i])) << 8) | uint8_t(text[i + 1]);
        if (!(special_prefix_bits_[key >> 6] & (1ULL << (key & 63)))) continue;
        for (int32_t id : special_by_prefix_.at(key)) {
            const std::string& t = tokens_[size_t(id)];
            if (!present[size_t(id)] && text.compare(i, t.size(), t) == 0) {
                present[size_t(id)] = 1;
                ++found;
            }
        }
    }
    return found;
}

// End-of-generation tokens as llama.cpp decides them: EOS, EOT, EOM, the FIM pad/repo/separator
// tokens, and tokens with an EOG text. A token found by its text is treated as a control token.
void Vocab::build_eog() {
    auto force_control = [&](int32_t id) {
        TokenType& t = types_[size_t(id)];
        if (t != TokenType::kControl && t != TokenType::kUnknown) t = TokenType::kControl;
    };
    auto detect = [&](int32_t& slot, auto& texts) {
        if (slot != kNoToken) return;
        for (const char* s : texts) {
            const int32_t id = find(s);
            if (id != kNoToken) {
                slot = id;
                force_control(id);
                return;
            }
        }
    };
    static constexpr const char* kEom[] = {"<|eom_id|>"};
    detect(d_.eot, kEotTexts);
    detect(d_.eom, kEom);
    detect(d_.fim_pre, kFimPreTexts);
    detect(d_.fim_suf, kFimSufTexts);
    detect(d_.fim_mid, kFimMidTexts);
    detect(d_.fim_pad, kFimPadTexts);
    detect(d_.fim_rep, kFimRepTexts);
    detect(d_.fim_sep, kFimSepTexts);

    eog_.assign(tokens_.size(), false);
    for (const char* s : kEogTexts) {
        const int32_t id = find(s);
        if (id != kNoToken) {
            eog_[size_t(id)] = true;
            force_control(id);
        }
    }
    for (int32_t id : {d_.fim_pad, d_.fim_rep, d_.fim_sep, d_.eos, d_.eot, d_.eom}) {
        if (id != kNoToken) eog_[size_t(id)] = true;
    }
    for (int32_t id : d_.extra_eog) eog_[size_t(id)] = true;

    // gpt-oss / solar-open: with <|return|> and <|call|> (or <|calls|> and <|flush|>), <|end|> is not EOG.
    auto eog_text = [&](const char* s) {
        const int32_t id = find(s);
        return id != kNoToken && eog_[size_t(id)];
    };
    const int32_t end = find("<|end|>");
    if (end != kNoToken && eog_[size_t(end)] &&
        ((eog_text("<|return|>") && (eog_text("<|call|>") || eog_text("<|calls|>"))) ||
         (eog_text("<|flush|>") && (eog_text("<|call|>") || eog_text("<|calls|>"))))) {
        eog_[size_t(end)] = false;
        types_[size_t(end)] = TokenType::kUserDefined;
    }
    // gemma4 / paddleocr: with <|tool_response>, </s> is an ordinary token.
    const int32_t s_end = find("</s>");
    if (s_end != kNoToken && eog_[size_t(s_end)] && eog_text("<|tool_response>") && s_end != d_.eos) {
        eog_[size_t(s_end)] = false;
        types_[size_t(s_end)] = TokenType::kNormal;
    }
}

int32_t Vocab::lookup(std::string_view text) const {
    const uint64_t h = hash_text(text);
    const uint32_t tag = uint32_t(h >> 32);
    for (uint64_t i = h & text_mask_;; i = (i + 1) & text_mask_) {
        const TextSlot& s = text_table_[i];
        if (s.id < 0) return kNoToken;
        if (s.tag == tag && symbol_text(s.id) == text) return s.id;
    }
}

int32_t Vocab::insert(std::string_view text, int32_t id) {
    if ((text_count_ + 1) * 2 > text_table_.size()) {  // keep the load under one half
        std::vector<TextSlot> old(text_table_.size() * 2, TextSlot{0, -1});
        old.swap(text_table_);
        text_mask_ = text_table_.size() - 1;
        for (const TextSlot& s : old) {
            if (s.id < 0) continue;
            uint64_t i = hash_text(symbol_text(s.id)) & text_mask_;
            while (text_table_[i].id >= 0) i = (i + 1) & text_mask_;
            text_table_[i] = s;
        }
    }
    const uint64_t h = hash_text(text);
    const uint32_t tag = uint32_t(h >> 32);
    for (uint64_t i = h & text_mask_;; i = (i + 1) & text_mask_) {
        TextSlot& s = text_table_[i];
        if (s.id < 0) {
            s = {tag, id};
            ++text_count_;
            return kNoToken;
        }
        if (s.tag == tag && symbol_text(s.id) == text) return s.id;
    }
}

void Vocab::build_merges(std::vector<std::pair<std::string, std::string>>& merges) {
    n_merges_ = int32_t(merges.size());
    size_t cap = 16;
    while (cap < merges.size() * 2) cap <<= 1;
    merge_table_.assign(cap, Slot{~0ULL, {0, 0}});
    merge_mask_ = cap - 1;

    // Symbols that are not tokens get ids after the vocabulary.
    auto symbol = [&](std::string_view s) -> int32_t {
        int32_t id = lookup(s);
        if (id != kNoToken) return id;
        id = n_tokens() + int32_t(extra_symbols_.size());
        extra_symbols_.emplace_back(s);
        insert(extra_symbols_.back(), id);
        return id;
    };
    std::string joined;
    for (size_t i = 0; i < merges.size(); ++i) {
        auto& [left, right] = merges[i];
        if (left.empty() || right.empty())
            throw_error(ErrorCode::kInvalidFile, "tokenizer: merge %zu ('%s' '%s') has an empty part", i, left.c_str(),
                        right.c_str());
        joined.assign(left).append(right);
        const int32_t l = symbol(left);
        const int32_t r = symbol(right);
        const int32_t res = symbol(joined);
        const uint64_t key = (uint64_t(uint32_t(l)) << 32) | uint32_t(r);
        for (uint64_t h = mix(key) & merge_mask_;; h = (h + 1) & merge_mask_) {
            Slot& s = merge_table_[h];
            if (s.key == key) break;  // the first (highest-priority) occurrence wins
            if (s.key == ~0ULL) {
                s.key = key;
                s.merge = {int32_t(i), res};
                break;
            }
        }
    }
}

bool Vocab::find_merge(int32_t left, int32_t right, Merge& out) const {
    if (merge_table_.empty() || left < 0 || right < 0) return false;
    const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    for (uint64_t h = mix(key) & merge_mask_;; h = (h + 1) & merge_mask_) {
        const Slot& s = merge_table_[h];
        if (s.key == key) {
            out = s.merge;
            return true;
        }
        if (s.key == ~0ULL) return false;
    }
}

}  // namespace cera
