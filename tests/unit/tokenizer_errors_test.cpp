// Bad vocabularies are rejected with a clear error, bad ids are errors rather than crashes, and
// small hand-made vocabularies show the merge rules (rank order, score order, byte fallback).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gguf/gguf.h"
#include "cera/error.h"
#include "gguf/writer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace cera {
namespace {

// A byte-level BPE vocabulary: the 256 byte characters, then "th", "he", "the", "Ġthe".
std::vector<std::string> bpe_tokens() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.emplace_back(unicode::byte_to_unicode(uint8_t(b)));
    for (const char* s : {"th", "he", "the", "\xC4\xA0the", "<|end|>"}) t.emplace_back(s);
    return t;
}

gguf::Writer bpe_writer() {
    gguf::Writer w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "gpt-2");
    const auto tokens = bpe_tokens();
    w.set("tokenizer.ggml.tokens", gguf::value_string_array(tokens));
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = 3;
    w.set("tokenizer.ggml.token_type", gguf::value_i32_array(types));
    w.set("tokenizer.ggml.merges", gguf::value_string_array({"t h", "th e", "\xC4\xA0 the"}));
    w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(tokens.size() - 1));
    w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(tokens.size() - 1));
    return w;
}

// Parses the writer's file from memory and builds a tokenizer (the bytes must outlive the call).
std::unique_ptr<Tokenizer> load(const gguf::Writer& w) {
    const std::vector<uint8_t> bytes = w.to_bytes();
    auto f = gguf::File::from_memory(bytes.data(), bytes.size());
    return Tokenizer::from_gguf(*f);
}

// Expects cera::Error with `code` whose message mentions `needle`.
template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(TokenizerErrors, ValidBaseLoadsAndMerges) {
    auto tok = load(bpe_writer());
    const int32_t the = *tok->find_token("the");
    const int32_t sp_the = *tok->find_token("\xC4\xA0the");
    EXPECT_EQ(tok->encode("the the", false, false), (std::vector<int32_t>{the, sp_the}));
    EXPECT_EQ(tok->decode(tok->encode("the the", false, false)), "the the");
    EXPECT_TRUE(tok->is_eog(*tok->find_token("<|end|>")));
}

TEST(TokenizerErrors, MissingMerges) {
    auto w = bpe_writer();
    w.remove("tokenizer.ggml.merges");
    expect_error([&] { load(w); }, ErrorCode::kMissing, "tokenizer.ggml.merges");
}

TEST(TokenizerErrors, MalformedMerge) {
    auto w = bpe_writer();
    w.set("tokenizer.ggml.merges", gguf::value_string_array({"t h", "nospace"}));
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "merges[1]");
}

TEST(TokenizerErrors, BosOutOfRange) {
    auto w = bpe_writer();
    w.set_u32("tokenizer.ggml.bos_token_id", 100000);
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "bos_token_id");
    w.set_i32("tokenizer.ggml.bos_token_id", -7);  // negative: "no token", but add_bos then fails
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "add_bos_token");
}

TEST(TokenizerErrors, TokenTypesWrongLength) {
    auto w = bpe_writer();
    w.set("tokenizer.ggml.token_type", gguf::value_i32_array(std::vector<int32_t>(10, 1)));
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "token_type");
}

TEST(TokenizerErrors, ScoresWrongLength) {
    auto w = bpe_writer();
    w.set("tokenizer.ggml.scores", gguf::value_f32_array(std::vector<float>(3, 0.0f)));
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "scores");
}

TEST(TokenizerErrors, UnknownPreAndModel) {
    auto w = bpe_writer();
    w.set_string("tokenizer.ggml.pre", "no-such-pre");
    expect_error([&] { load(w); }, ErrorCode::kUnsupported, "no-such-pre");
    w = bpe_writer();
    w.set_string("tokenizer.ggml.model", "wordpiece9");
    expect_error([&] { load(w); }, ErrorCode::kUnsupported, "wordpiece9");
    w = bpe_writer();
    w.remove("tokenizer.ggml.tokens");
    expect_error([&] { load(w); }, ErrorCode::kMissing, "tokenizer.ggml.tokens");
}

TEST(TokenizerErrors, EmptyAndDuplicateTokens) {
    auto w = bpe_writer();
    w.set("tokenizer.ggml.tokens", gguf::value_string_array({}));
    w.remove("tokenizer.ggml.token_type");
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "tokens");
    w = bpe_writer();
    auto tokens = bpe_tokens();
    tokens[300 - 40] = "the";
    w.set("tokenizer.ggml.tokens", gguf::value_string_array(tokens));
    expect_error([&] { load(w); }, ErrorCode::kInvalidFile, "duplicate token 'the'");
}

// A token count far beyond the file (patched into a valid file) is rejected, never allocated.
TEST(TokenizerErrors, AbsurdTokenCount) {
    std::vector<uint8_t> bytes = bpe_writer().to_bytes();
    const std::string key = "tokenizer.ggml.tokens";
    auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
    ASSERT_NE(it, bytes.end());
    const size_t count_at = size_t(it - bytes.begin()) + key.size() + 4 + 4;  // value type, element type
    const uint64_t absurd = 1ULL << 60;
    std::memcpy(&bytes[count_at], &absurd, 8);
    EXPECT_THROW(
        {
            auto f = gguf::File::from_memory(bytes.data(), bytes.size());
            Tokenizer::from_gguf(*f);
        },
        Error);
}

TEST(TokenizerErrors, VocabDataChecks) {
    VocabData d;
    d.model = VocabModel::kSpm;
    d.tokens = {"<unk>", "<s>", "</s>", "a"};
    d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
    expect_error([&] { Vocab v(d); }, ErrorCode::kInvalidFile, "token types");
    d.types.clear();
    d.eos = 4;
    expect_error([&] { Vocab v(d); }, ErrorCode::kInvalidFile, "EOS token id 4");
    d.eos = 2;
    d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType(42)};
    expect_error([&] { Vocab v(d); }, ErrorCode::kInvalidFile, "invalid type 42");
    d.types.clear();
    d.tokens.clear();
    expect_error([&] { Vocab v(d); }, ErrorCode::kInvalidFile, "empty");
}

TEST(TokenizerErrors, OutOfRangeIds) {
    auto tok = load(bpe_writer());
    const int32_t n = tok->n_vocab();
    for (int32_t bad : {n, n + 1000, -1, -2147483647 - 1}) {
        expect_error([&] { tok->decode(std::vector<int32_t>{0, bad}); }, ErrorCode::kOutOfRange, "out of range");
        expect_error([&] { tok->token_to_piece(bad); }, ErrorCode::kOutOfRange, "out of range");
        expect_error([&] { tok->token_piece(bad); }, ErrorCode::kOutOfRange, "out of range");
        StreamingDetokenizer d(*tok);
        expect_error([&] { d.push(bad); }, ErrorCode::kOutOfRange, "out of range");
        EXPECT_FALSE(tok->is_eog(bad));
    }
}

TEST(TokenizerErrors, HfJson) {
    const auto dir = std::filesystem::temp_directory_path() / ("cera_tok_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto write = [&](const std::string& name, const std::string& text) {
        std::ofstream(dir / name) << text;
        return (dir / name).string();
    };
    expect_error([&] { Tokenizer::from_hf_json(write("a.json", "{not json")); }, ErrorCode::kParse, "JSON");
    expect_error([&] { Tokenizer::from_hf_json((dir / "missing.json").string()); }, ErrorCode::kIo, "missing.json");
    expect_error(
        [&] { Tokenizer::from_hf_json(write("b.json", R"({"model": {"type": "WordPiece", "vocab": {}}})")); },
        ErrorCode::kUnsupported, "WordPiece");
    expect_error(
        [&] {
            Tokenizer::from_hf_json(
                write("c.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": -5}, "merges": []}})"));
        },
        ErrorCode::kInvalidFile, "id -5");
    expect_error(
        [&] {
            Tokenizer::from_hf_json(write(
                "d.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 99999999999}, "merges": []}})"));
        },
        ErrorCode::kInvalidFile, "99999999999");
    expect_error(
        [&] {
            Tokenizer::from_hf_json(write("e.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}})"));
        },
        ErrorCode::kUnsupported, "\\w+");
    expect_error(
        [&] {
            Tokenizer::from_hf_json(write("f.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})"));
        },
        ErrorCode::kInvalidFile, "merge 0");
    std::filesystem::remove_all(dir);
}

// Rank order decides BPE merges, not length: with "h e" ranked first, "the" is t + he.
TEST(TokenizerMerges, RankOrder) {
    VocabData d;
    d.model = VocabModel::kBpe;
    d.pre = PreTokenizer::kGpt2;
    d.tokens = bpe_tokens();
    d.merges = {{"h", "e"}, {"t", "h"}, {"th", "e"}};
    Tokenizer tok{Vocab(d)};
    EXPECT_EQ(tok.encode("the", false, false), (std::vector<int32_t>{'t', *tok.find_token("he")}));
    d.merges = {{"t", "h"}, {"h", "e"}, {"th", "e"}};
    Tokenizer tok2{Vocab(d)};
    EXPECT_EQ(tok2.encode("the", false, false), (std::vector<int32_t>{*tok2.find_token("the")}));
}

// SPM: the highest-scoring token wins; characters without a token fall back to <0xNN>.
TEST(TokenizerMerges, SpmScoresAndByteFallback) {
    VocabData d;
    d.model = VocabModel::kSpm;
    d.add_space_prefix = true;
    d.tokens = {"<unk>", "<s>", "</s>"};
    d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
    char hex[8];
    for (int b = 0; b < 256; ++b) {
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        d.tokens.emplace_back(hex);
        d.types.push_back(TokenType::kByte);
    }
    for (const char* s : {"\xE2\x96\x81", "a", "b", "c", "ab", "bc", "\xE2\x96\x81" "a"}) {
        d.tokens.emplace_back(s);
        d.types.push_back(TokenType::kNormal);
    }
    d.scores.assign(d.tokens.size(), 0.0f);
    auto id = [&](const std::string& s) { return int32_t(std::find(d.tokens.begin(), d.tokens.end(), s) - d.tokens.begin()); };
    d.scores[size_t(id("ab"))] = -1.0f;
    d.scores[size_t(id("bc"))] = -2.0f;
    d.scores[size_t(id("\xE2\x96\x81" "a"))] = -3.0f;
    d.bos = 1;
    d.eos = 2;
    d.unk = 0;
    d.add_bos = true;
    Tokenizer tok{Vocab(d)};
    // "▁abc": ab (-1) beats bc (-2) and ▁a (-3); then ▁ + ab + c.
    EXPECT_EQ(tok.encode("abc", true, false), (std::vector<int32_t>{1, id("\xE2\x96\x81"), id("ab"), id("c")}));
    // "é" is not a token: two byte tokens.
    EXPECT_EQ(tok.encode("\xC3\xA9", false, false),
              (std::vector<int32_t>{id("\xE2\x96\x81"), id("<0xC3>"), id("<0xA9>")}));
    EXPECT_EQ(tok.decode(tok.encode("a \xC3\xA9", true, false)), "a \xC3\xA9");
    // add_space_prefix = false (tokenizer.ggml.add_space_prefix): no '▁' in front, none stripped.
    d.add_space_prefix = false;
    Tokenizer plain{Vocab(d)};
    EXPECT_EQ(plain.encode("abc", true, false), (std::vector<int32_t>{1, id("ab"), id("c")}));
    EXPECT_EQ(plain.decode(plain.encode(" abc", false, false)), " abc");
}

// Special tokens: longest first, control tokens only when parse_special, user-defined always,
// rstrip eats the whitespace after a token, and text after a special token gets the space prefix.
TEST(TokenizerMerges, SpecialTokenPartition) {
    VocabData d;
    d.model = VocabModel::kSpm;
    d.add_space_prefix = true;
    d.tokens = {"<unk>", "<s>", "</s>", "<|x|>", "<|x|><|y|>", "<u>"};
    d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl,
               TokenType::kControl, TokenType::kControl, TokenType::kUserDefined};
    char hex[8];
    for (int b = 0; b < 256; ++b) {
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        d.tokens.emplace_back(hex);
        d.types.push_back(TokenType::kByte);
    }
    const int32_t mark = int32_t(d.tokens.size());
    d.tokens.emplace_back("\xE2\x96\x81");
    d.types.push_back(TokenType::kNormal);
    const int32_t a = int32_t(d.tokens.size());
    d.tokens.emplace_back("a");
    d.types.push_back(TokenType::kNormal);
    d.bos = 1;
    d.eos = 2;
    d.unk = 0;
    d.rstrip = {3};
    Tokenizer tok{Vocab(d)};
    auto byte = [&](int b) { return 6 + b; };
    // "<|x|><|y|>" is matched before "<|x|>"; "<|x|>" eats the two spaces after it.
    EXPECT_EQ(tok.encode("a<|x|><|y|><|x|>  a", false, true),
              (std::vector<int32_t>{mark, a, 4, 3, mark, a}));
    // Not parsing special tokens: the control text is bytes, the user-defined token still matches.
    const auto plain = tok.encode("<|x|><u>", false, false);
    ASSERT_EQ(plain.size(), 1 + 5 + 1u);
    EXPECT_EQ(plain[0], mark);
    EXPECT_EQ(plain[1], byte('<'));
    EXPECT_EQ(plain.back(), 5);
    EXPECT_EQ(tok.decode(plain), "<|x|><u>");
}

}  // namespace
}  // namespace cera
