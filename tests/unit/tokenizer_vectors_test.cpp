// Tokenizer test vectors: llama.cpp's ggml-vocab-*.gguf.inp/.out (ids from the original tokenizers),
// the extra vocabularies, the fixture tokenizer cases, and the recorded fixture prompts.
// Encoding follows llama.cpp's test-tokenizer-0: no BOS, special tokens not parsed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace cera {
namespace {

struct Case {
    std::string text;
    std::vector<int32_t> ids;
};

std::vector<Case> read_cases(const std::string& inp_path, const std::string& out_path) {
    const std::string inp = test::read_text(inp_path);
    const std::string out = test::read_text(out_path);
    static const std::string kSep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    size_t pos = 0;
    while (true) {
        const size_t p = inp.find(kSep, pos);
        if (p == std::string::npos) break;
        texts.push_back(inp.substr(pos, p - pos));
        pos = p + kSep.size();
    }
    std::vector<std::vector<int32_t>> ids;
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream ls(line);
        std::vector<int32_t> v;
        int64_t x;
        while (ls >> x) v.push_back(int32_t(x));
        ids.push_back(std::move(v));
    }
    EXPECT_EQ(texts.size(), ids.size()) << inp_path;
    std::vector<Case> cases;
    for (size_t i = 0; i < std::min(texts.size(), ids.size()); ++i) cases.push_back({texts[i], ids[i]});
    return cases;
}

std::string show(const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t x : v) s += std::to_string(x) + " ";
    return s;
}

// Runs every case; returns the number that match.
int run_cases(const Tokenizer& tok, const std::vector<Case>& cases, const std::string& name) {
    int ok = 0;
    for (const Case& c : cases) {
        const std::vector<int32_t> got = tok.encode(c.text, false, false);
        if (got == c.ids) {
            ++ok;
        } else {
            ADD_FAILURE() << name << ": text '" << c.text << "'\n  want " << show(c.ids) << "\n  got  " << show(got);
        }
    }
    std::printf("[vectors] %-34s %d/%zu\n", name.c_str(), ok, cases.size());
    return ok;
}

std::unique_ptr<Tokenizer> load_gguf(const std::string& rel) {
    auto f = gguf::File::open(test::data_path(rel));
    return Tokenizer::from_gguf(*f);
}

void check_vocab(const std::string& gguf_rel, const std::string& vectors_rel) {
    auto tok = load_gguf(gguf_rel);
    const auto cases = read_cases(test::data_path(vectors_rel + ".inp"), test::data_path(vectors_rel + ".out"));
    ASSERT_FALSE(cases.empty());
    EXPECT_EQ(run_cases(*tok, cases, vectors_rel.substr(vectors_rel.find('/') + 1)), int(cases.size()));
}

TEST(TokenizerVectors, LlamaSpm) { check_vocab("vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerVectors, Phi3) { check_vocab("vocab/ggml-vocab-phi-3.gguf", "vocab/ggml-vocab-phi-3.gguf"); }
TEST(TokenizerVectors, Gpt2) { check_vocab("vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-gpt-2.gguf"); }
TEST(TokenizerVectors, Mpt) { check_vocab("vocab/ggml-vocab-mpt.gguf", "vocab/ggml-vocab-mpt.gguf"); }
TEST(TokenizerVectors, Falcon) { check_vocab("vocab/ggml-vocab-falcon.gguf", "vocab/ggml-vocab-falcon.gguf"); }
TEST(TokenizerVectors, Starcoder) { check_vocab("vocab/ggml-vocab-starcoder.gguf", "vocab/ggml-vocab-starcoder.gguf"); }
TEST(TokenizerVectors, Refact) { check_vocab("vocab/ggml-vocab-refact.gguf", "vocab/ggml-vocab-refact.gguf"); }
TEST(TokenizerVectors, DeepseekCoder) {
    check_vocab("vocab/ggml-vocab-deepseek-coder.gguf", "vocab/ggml-vocab-deepseek-coder.gguf");
}
TEST(TokenizerVectors, DeepseekLlm) {
    check_vocab("vocab/ggml-vocab-deepseek-llm.gguf", "vocab/ggml-vocab-deepseek-llm.gguf");
}
TEST(TokenizerVectors, Qwen2) { check_vocab("vocab-extra/qwen3-vocab-qwen2.gguf", "vocab/ggml-vocab-qwen2.gguf"); }
TEST(TokenizerVectors, Qwen2Extra) {
    check_vocab("vocab-extra/qwen3-vocab-qwen2.gguf", "vocab-extra/qwen3-vocab-qwen2.gguf");
}
TEST(TokenizerVectors, Llama3) {
    check_vocab("vocab-extra/gpt2-vocab-llama3.gguf", "vocab-extra/gpt2-vocab-llama3.gguf");
}
TEST(TokenizerVectors, Lfm2) { check_vocab("vocab-extra/gpt2-vocab-lfm2.gguf", "vocab-extra/gpt2-vocab-lfm2.gguf"); }

TEST(TokenizerVectors, FixtureTokenizerCases) {
    check_vocab("fixtures/tiny-lfm2/model.gguf", "fixtures/tokenizer/tokenizer_tests");
}

// The recorded prompts of every fixture model: our ids (BOS added as the file says) equal the
// ids the reference tokenizer produced.
TEST(TokenizerVectors, FixturePrompts) {
    const char* models[] = {"tiny-lfm2",           "tiny-qwen3",         "tiny-lfm2moe",      "tiny-llama-random",
                            "tiny-qwen2-random",   "tiny-granite-random", "tiny-lfm2vl-random"};
    int checked = 0;
    for (const char* m : models) {
        auto tok = load_gguf(std::string("fixtures/") + m + "/model.gguf");
        for (int i : {0, 2}) {
            const std::string path = test::data_path(std::string("fixtures/") + m + "/ref/prompt_" +
                                                     std::to_string(i) + ".json");
            std::ifstream probe(path);
            if (!probe) continue;
            const auto j = nlohmann::json::parse(test::read_text(path));
            const auto want = j.at("ids").get<std::vector<int32_t>>();
            EXPECT_EQ(tok->encode(j.at("text").get<std::string>(), true, false), want) << m << " prompt " << i;
            ++checked;
        }
    }
    EXPECT_GE(checked, 12);
}

}  // namespace
}  // namespace cera
