// Vocabulary: token texts, scores, types, merges, special ids and tokenizer flags, validated once.
// Built from GGUF metadata (vocab_gguf.cpp) or a Hugging Face tokenizer.json (vocab_hf.cpp), or
// directly from a VocabData (tests, converters). Bad data throws cera::Error naming what is wrong.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cera {

inline constexpr int32_t kNoToken = -1;
inline constexpr int64_t kMaxVocabSize = 1 << 24;  // anything larger is treated as a corrupt file

// GGUF token types (tokenizer.ggml.token_type), numbered as in the file.
enum class TokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
};

// The tokenization algorithm.
enum class VocabModel {
    kSpm,  // SentencePiece-style: score-driven merges over characters, '▁' for spaces, <0xNN> fallback
    kBpe,  // rank-driven BPE over pre-tokenized words (byte-level or, with escape_whitespace, '▁'-style)
};

// Pre-tokenizer split rules (llama.cpp's names in brackets; several names map to one rule set).
enum class PreTokenizer {
    kNone,           // whole text is one word (SPM, and HF BPE without pre_tokenizer)
    kDefault,        // [default] punctuation runs, GPT-2 rules, digit runs, 3-digit groups
    kGpt2,           // [gpt-2, phi-2, mpt, gpt-neox, ...] GPT-2 regex
    kLlama3,         // [llama3, llama-bpe, lfm2, ...] Llama 3 regex, digits in groups of up to 3
    kQwen2,          // [qwen2, deepseek-r1-qwen, ...] Llama 3 regex with single digits
    kDeepseekLlm,    // [deepseek-llm]
    kDeepseekCoder,  // [deepseek-coder]
    kFalcon,         // [falcon]
    kStarcoder,      // [starcoder, refact, smollm, ...] single digits, then GPT-2 rules
};

// Maps a `tokenizer.ggml.pre` value to its rules and flags. Throws kUnsupported for unknown names.
struct PreTokenizerInfo {
    PreTokenizer type = PreTokenizer::kDefault;
    bool ignore_merges = false;  // a word that is already a token is emitted whole
    bool add_bos = false;        // default for add_bos when the file does not say
    bool clean_spaces = true;    // llama.cpp's clean_up_tokenization_spaces default
};
PreTokenizerInfo pre_tokenizer_from_name(std::string_view name);
const char* pre_tokenizer_name(PreTokenizer p);
// The first `tokenizer.ggml.pre` value whose rules and flags are exactly these (what a converter
// writes), or nullptr when no name reproduces them.
const char* pre_tokenizer_gguf_name(PreTokenizer p, bool ignore_merges, bool clean_spaces);

// Input of the Vocab constructor. Empty vectors mean "absent" (scores 0, types normal).
struct VocabData {
    VocabModel model = VocabModel::kSpm;
    PreTokenizer pre = PreTokenizer::kNone;
    std::vector<std::string> tokens;
    std::vector<float> scores;                             // empty or one per token
    std::vector<TokenType> types;                          // empty or one per token
    std::vector<std::pair<std::string, std::string>> merges;  // BPE merges, highest priority first
    int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken, pad = kNoToken;
    int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;  // fill-in-the-middle
    int32_t fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
    bool add_bos = false;
    bool add_eos = false;
    bool add_space_prefix = false;   // SPM: prefix the text (and text after a special token) with a space
    bool escape_whitespace = false;  // BPE: ' ' -> '▁' before merging, tokens hold '▁' (SPM-style BPE)
    bool byte_encode = true;         // BPE: GPT-2 byte-level encoding of words
    bool byte_fallback = false;      // BPE: a character without a token becomes <0xNN> tokens
    bool fuse_unk = false;           // BPE: consecutive unknown characters become one unknown token
    bool ignore_merges = false;
    bool clean_spaces = false;
    bool nfc = false;                // normalize text to NFC before tokenizing (HF normalizer)
    std::vector<int32_t> lstrip, rstrip;  // special tokens that eat whitespace on their left / right
    std::vector<int32_t> extra_eog;       // more end-of-generation ids
    std::string chat_template;
};

class Vocab {
   public:
    // Validates and indexes `data`: throws kInvalidFile on an empty or oversized vocabulary,
    // arrays of the wrong length, duplicate tokens, malformed merges, or special ids out of range.
    explicit Vocab(VocabData data);
    Vocab(Vocab&&) = default;
    Vocab& operator=(Vocab&&) = default;
    Vocab(const Vocab&) = delete;  // the lookup tables point into the token strings
    Vocab& operator=(const Vocab&) = delete;

    int32_t n_tokens() const { return int32_t(tokens_.size()); }
    const std::string& text(int32_t id) const { return tokens_[size_t(id)]; }
    float score(int32_t id) const { return scores_.empty() ? 0.0f : scores_[size_t(id)]; }
    TokenType type(int32_t id) const { return types_[size_t(id)]; }
    bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }

    // Token id of an exact text, or kNoToken.
    int32_t find(std::string_view text) const {
        const int32_t id = lookup(text);
        return id < n_tokens() ? id : kNoToken;
    }
    // Token of a byte: "<0xNN>" when present, else the byte itself (SPM) or its GPT-2 character (BPE).
    int32_t byte_token(uint8_t byte) const { return byte_tokens_[byte]; }
    // BPE symbol id of a byte's GPT-2 character (byte-level vocabularies), or kNoToken.
    int32_t byte_symbol(uint8_t byte) const { return byte_symbols_[byte]; }

    uint64_t serial() const { return serial_; }  // unique per constructed vocabulary (caches key on it)
    const VocabData& data() const { return d_; }  // flags and special ids (tokens/merges moved out)
    int32_t max_token_len() const { return max_token_len_; }
    // True when no token holds '▁' right after another character (SPM may split before '▁' runs).
    bool spm_splits_at_spaces() const { return spm_splits_at_spaces_; }
    const std::vector<int32_t>& special_tokens() const { return special_; }  // by length, longest first
    // Marks in `present` (sized n_tokens()) the special tokens that occur in `text`; one pass over
    // the text with a filter on the first two bytes. Returns how many were found.
    size_t find_special_tokens(std::string_view text, std::vector<uint8_t>& present) const;
    bool is_eog(int32_t id) const { return valid(id) && eog_[size_t(id)]; }
    bool lstrip(int32_t id) const { return valid(id) && (attr_[size_t(id)] & kAttrLstrip); }
    bool rstrip(int32_t id) const { return valid(id) && (attr_[size_t(id)] & kAttrRstrip); }

    // BPE merge table over symbol ids. Symbols are token ids, plus ids >= n_tokens() for merge
    // parts that are not tokens. Returns false when (left, right) does not merge.
    struct Merge {
        int32_t rank;
        int32_t result;
    };
    bool find_merge(int32_t left, int32_t right, Merge& out) const;
    // Symbol id of a text (token or merge part), or kNoToken.
    int32_t find_symbol(std::string_view text) const { return lookup(text); }
    int32_t n_merges() const { return n_merges_; }

   private:
    static constexpr uint8_t kAttrLstrip = 1, kAttrRstrip = 2;
    void build_merges(std::vector<std::pair<std::string, std::string>>& merges);
    std::string_view symbol_text(int32_t id) const {
        return id < n_tokens() ? std::string_view(tokens_[size_t(id)])
                               : std::string_view(extra_symbols_[size_t(id - n_tokens())]);
    }
    int32_t lookup(std::string_view text) const;
    int32_t insert(std::string_view text, int32_t id);  // returns the id already there, or kNoToken
    void build_eog();

    VocabData d_;
    uint64_t serial_ = 0;
    std::vector<std::string> tokens_;
    std::vector<float> scores_;
    std::vector<TokenType> types_;
    std::vector<uint8_t> attr_;
    std::vector<bool> eog_;
    // Open-addressing index text -> symbol id: 32 bits of the hash and the id (-1 = empty).
    struct TextSlot {
        uint32_t tag;
        int32_t id;
    };
    std::vector<TextSlot> text_table_;
    uint64_t text_mask_ = 0;
    size_t text_count_ = 0;
    int32_t byte_tokens_[256];
    int32_t byte_symbols_[256];
    int32_t max_token_len_ = 0;
    bool spm_splits_at_spaces_ = false;
    std::vector<int32_t> special_;
    std::vector<int32_t> special_short_;            // one-byte special tokens
    std::vector<uint64_t> special_prefix_bits_;     // 65536 bits: first two bytes of a special token
    std::unordered_map<uint32_t, std::vector<int32_t>> special_by_prefix_;

    // Merge parts that are not tokens (rare), with their own symbol ids.
    std::deque<std::string> extra_symbols_;
    // Open-addressing table (left << 32 | right) -> Merge.
    struct Slot {
        uint64_t key;
        Merge merge;
    };
    std::vector<Slot> merge_table_;
    uint64_t merge_mask_ = 0;
    int32_t n_merges_ = 0;
};

}  // namespace cera
