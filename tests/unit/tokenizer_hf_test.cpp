// Tokenizers loaded from Hugging Face tokenizer.json files: the real Qwen3 tokenizer against the
// qwen2 test vectors and the equivalent GGUF vocabulary, TinyStories-656K (BPE with byte fallback
// and a '▁' normalizer) against its recorded generation, and the fixture tokenizer.json against
// the fixture GGUF.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace cera {
namespace {

std::vector<std::string> read_inputs(const std::string& inp_path) {
    const std::string inp = test::read_text(inp_path);
    static const std::string kSep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    for (size_t pos = 0;;) {
        const size_t p = inp.find(kSep, pos);
        if (p == std::string::npos) break;
        texts.push_back(inp.substr(pos, p - pos));
        pos = p + kSep.size();
    }
    return texts;
}

std::vector<std::vector<int32_t>> read_outputs(const std::string& out_path) {
    std::vector<std::vector<int32_t>> ids;
    std::istringstream lines(test::read_text(out_path));
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream ls(line);
        std::vector<int32_t> v;
        int64_t x;
        while (ls >> x) v.push_back(int32_t(x));
        ids.push_back(std::move(v));
    }
    return ids;
}

TEST(TokenizerHf, Qwen3JsonMatchesVectorsAndGguf) {
    const auto t0 = std::chrono::steady_clock::now();
    auto json_tok = Tokenizer::from_hf_json(test::data_path("models/qwen3-tokenizer/tokenizer.json"));
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[hf] qwen3 tokenizer.json loaded in %.3f s\n", load_s);
    auto f = gguf::File::open(test::data_path("vocab-extra/qwen3-vocab-qwen2.gguf"));
    auto gguf_tok = Tokenizer::from_gguf(*f);
    EXPECT_EQ(json_tok->n_vocab(), gguf_tok->n_vocab());

    const auto texts = read_inputs(test::data_path("vocab/ggml-vocab-qwen2.gguf.inp"));
    const auto want = read_outputs(test::data_path("vocab/ggml-vocab-qwen2.gguf.out"));
    ASSERT_EQ(texts.size(), want.size());
    int ok = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto a = json_tok->encode(texts[i], false, false);
        EXPECT_EQ(a, want[i]) << "text '" << texts[i] << "'";
        EXPECT_EQ(a, gguf_tok->encode(texts[i], false, false)) << "text '" << texts[i] << "'";
        ok += a == want[i];
    }
    std::printf("[hf] qwen3 tokenizer.json on qwen2 vectors: %d/%zu\n", ok, texts.size());

    // Special tokens: parsed only when asked; decode renders them only when asked.
    const std::string chat = "<|im_start|>user\nHi<|im_end|>";
    const auto with = json_tok->encode(chat, false, true);
    ASSERT_GE(with.size(), 3u);
    EXPECT_EQ(with.front(), *json_tok->find_token("<|im_start|>"));
    EXPECT_EQ(with.back(), *json_tok->find_token("<|im_end|>"));
    EXPECT_EQ(json_tok->decode(with, true), chat);
    EXPECT_EQ(json_tok->decode(with, false), "user\nHi");
    const auto without = json_tok->encode(chat, false, false);
    for (int32_t id : without) EXPECT_FALSE(json_tok->is_control(id));
    EXPECT_EQ(json_tok->decode(without), chat);
    EXPECT_TRUE(json_tok->is_eog(*json_tok->find_token("<|im_end|>")));
    EXPECT_TRUE(json_tok->is_eog(*json_tok->find_token("<|endoftext|>")));
    EXPECT_FALSE(json_tok->add_bos());

    // llama.cpp's end-of-generation set: FIM pad / repo / file separator too, and those tokens (and
    // <|fim_prefix|>) count as control tokens; <think> stays user-defined and is always matched.
    for (const Tokenizer* t : {json_tok.get(), gguf_tok.get()}) {
        EXPECT_TRUE(t->is_eog(*t->find_token("<|fim_pad|>")));
        EXPECT_TRUE(t->is_eog(*t->find_token("<|repo_name|>")));
        EXPECT_TRUE(t->is_eog(*t->find_token("<|file_sep|>")));
        EXPECT_FALSE(t->is_eog(*t->find_token("<|fim_prefix|>")));
        EXPECT_FALSE(t->is_eog(*t->find_token("<think>")));
        EXPECT_TRUE(t->is_control(*t->find_token("<|fim_prefix|>")));
        EXPECT_EQ(t->token_type(*t->find_token("<think>")), TokenType::kUserDefined);
        EXPECT_EQ(t->encode("<think>", false, false), std::vector<int32_t>{*t->find_token("<think>")});
        EXPECT_GT(t->encode("<|fim_prefix|>", false, false).size(), 1u);
        EXPECT_EQ(t->encode("<|fim_prefix|>", false, true), std::vector<int32_t>{*t->find_token("<|fim_prefix|>")});
    }
}

TEST(TokenizerHf, TinyStoriesRecordedGeneration) {
    auto tok = Tokenizer::from_hf_json(test::data_path("models/tinystories-656k/tokenizer.json"));
    EXPECT_EQ(tok->n_vocab(), 2048);
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    EXPECT_TRUE(tok->add_bos());
    const auto j = nlohmann::json::parse(test::read_text(test::data_path("models/tinystories-656k/expected_greedy.json")));
    const auto ids = j.at("generated_ids").get<std::vector<int32_t>>();
    const std::string text = j.at("text").get<std::string>();
    // The text is a continuation of BOS; the normalizer still prepends '▁' to it, which comes out as
    // the lone '▁' token. Everything after it must be the recorded ids (the text ends with the
    // literal "<|end_story|>", which the model wrote as plain text inside multi-word tokens).
    const auto got = tok->encode(text, false, false);
    const int32_t space = *tok->find_token("\xE2\x96\x81");
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.front(), space);
    EXPECT_EQ(std::vector<int32_t>(got.begin() + 1, got.end()), ids);
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_EQ(tok->decode(got), text);
    // With BOS: the post-processor's <|start_story|> comes first.
    const auto with_bos = tok->encode("Once upon a time", true, false);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos.front(), 1);
    EXPECT_EQ(tok->decode(with_bos), "Once upon a time");
    // This vocabulary has no <0xNN> tokens, so byte fallback cannot apply: a character outside it is
    // <unk> (and fuse_unk joins neighbours), which decodes to nothing.
    const auto rare_ids = tok->encode("caf\xC3\xA9 \xE2\x9C\x93\xE2\x9C\x93!", false, false);
    EXPECT_EQ(std::count(rare_ids.begin(), rare_ids.end(), tok->unk()), 2);
    EXPECT_EQ(tok->decode(rare_ids), "caf !");
}

TEST(TokenizerHf, FixtureJsonMatchesVectors) {
    auto tok = Tokenizer::from_hf_json(test::data_path("fixtures/tokenizer/tokenizer.json"));
    EXPECT_TRUE(tok->add_bos());
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    const auto texts = read_inputs(test::data_path("fixtures/tokenizer/tokenizer_tests.inp"));
    const auto want = read_outputs(test::data_path("fixtures/tokenizer/tokenizer_tests.out"));
    ASSERT_EQ(texts.size(), want.size());
    int ok = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto got = tok->encode(texts[i], false, false);
        EXPECT_EQ(got, want[i]) << "text '" << texts[i] << "'";
        ok += got == want[i];
    }
    std::printf("[hf] fixture tokenizer.json on tokenizer_tests: %d/%zu\n", ok, texts.size());
    for (int i : {0, 2}) {
        const auto j = nlohmann::json::parse(
            test::read_text(test::data_path("fixtures/tiny-lfm2/ref/prompt_" + std::to_string(i) + ".json")));
        EXPECT_EQ(tok->encode(j.at("text").get<std::string>(), true, false), j.at("ids").get<std::vector<int32_t>>());
    }
}

}  // namespace
}  // namespace cera
