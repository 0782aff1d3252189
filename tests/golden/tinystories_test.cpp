// TinyStories-656K (a Hugging Face Llama checkpoint) through our converter: `cera convert`
// writes a GGUF, which must reproduce the independent reference (expected_greedy.json, from
// a NumPy forward pass of the HF model with rotate-half RoPE): the top-5 logits of the first
// 8 greedy steps, the greedy ids from BOS up to EOS, and their text.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cera/engine.h"
#include "cera/session.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string cera_bin() {
    const char* env = std::getenv("CERA_BIN");
    return env && *env ? env : std::string(CERA_BINARY_DIR) + "/bin/cera";
}

class TinyStories : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("cera_tinystories_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        const std::string hf = cera::test::data_path("models/tinystories-656k");
        for (const char* type : {"F32", "Q8_0"}) {
            const std::string out = (dir_ / (std::string(type) + ".gguf")).string();
            const std::string cmd = "'" + cera_bin() + "' convert --hf '" + hf + "' -o '" + out + "' --type " + type +
                                    " 2>/dev/null";
            const int status = std::system(cmd.c_str());
            ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
        }
        expected_ = nlohmann::json::parse(cera::test::read_text(hf + "/expected_greedy.json"));
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }
    static std::string gguf(const char* type) { return (dir_ / (std::string(type) + ".gguf")).string(); }
    static std::vector<int32_t> expected_ids() { return expected_["generated_ids"].get<std::vector<int32_t>>(); }

    static fs::path dir_;
    static nlohmann::json expected_;
};
fs::path TinyStories::dir_;
nlohmann::json TinyStories::expected_;

TEST_F(TinyStories, ConvertedFileHasLlamaLayout) {
    auto f = cera::gguf::File::open(gguf("F32"));
    EXPECT_EQ(f->architecture(), "llama");
    EXPECT_EQ(f->get_u32("llama.attention.head_count"), 8u);
    EXPECT_EQ(f->get_u32("llama.attention.head_count_kv"), 4u);
    EXPECT_EQ(f->get_u32("llama.rope.dimension_count"), 16u);
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f->get_u32("tokenizer.ggml.bos_token_id"), 1u);
    EXPECT_EQ(f->get_u32("tokenizer.ggml.eos_token_id"), 2u);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 2048u);
    ASSERT_NE(f->find_tensor("token_embd.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied: the model reuses token_embd
    EXPECT_EQ(f->tensors().size(), 2u + 2u * 9u);
    auto q = cera::gguf::File::open(gguf("Q8_0"));
    EXPECT_EQ(q->find_tensor("blk.0.attn_q.weight")->type, cera::GgmlType::kQ8_0);
    EXPECT_EQ(q->find_tensor("blk.0.attn_norm.weight")->type, cera::GgmlType::kF32);
}

// Teacher-forced on the reference ids, the top-5 logits of the first 8 steps match to 1e-3.
// (A missing or wrong Q/K permutation moves them by far more.)
TEST_F(TinyStories, FirstStepsLogitsMatchReference) {
    auto model = cera::load_model(gguf("F32"), {.n_threads = 1});
    auto state = model->create_state();
    const auto ids = expected_ids();
    const auto& top5 = expected_["top5_logits_first8"];
    std::vector<float> logits(size_t(model->info().n_vocab));
    int32_t token = 1;
    for (size_t step = 0; step < top5.size(); ++step) {
        state->eval({&token, 1}, logits.data(), false);
        for (const auto& pair : top5[step]) {
            const int32_t id = pair[0].get<int32_t>();
            EXPECT_NEAR(logits[size_t(id)], pair[1].get<double>(), 1e-3) << "step " << step << " id " << id;
        }
        token = ids[step];
    }
}

struct Collect : cera::Sink {
    std::vector<int32_t> ids;
    std::string text;
    void on_text(std::string_view t) override { text += t; }
    void on_token(int32_t id) override { ids.push_back(id); }
};

TEST_F(TinyStories, GreedyFromBosReproducesReference) {
    auto engine = cera::Engine::load(gguf("F32"), {.device = "cpu", .threads = 2});
    EXPECT_EQ(engine->eos_token(), 2);
    cera::Session s(engine);
    const int32_t bos = 1;
    s.append_tokens({&bos, 1});
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 200;
    Collect sink;
    const auto r = s.generate(g, sink);
    std::vector<int32_t> want = expected_ids();
    want.push_back(2);  // the reference stops when the model emits EOS
    EXPECT_EQ(sink.ids, want);
    EXPECT_EQ(r.finish, cera::FinishReason::kEos);
    EXPECT_EQ(r.generated_tokens, int32_t(want.size()));
    // The streamed text is the reference text; EOS (a control token) adds nothing.
    std::string want_text = expected_["text"].get<std::string>();
    EXPECT_EQ(sink.text, want_text);
    EXPECT_EQ(r.text, want_text);
}

// The converted vocabulary (SPM-style, scores from the merge ranks) tokenizes like the HF BPE
// it came from. Reference ids: a direct implementation of HF BPE over tokenizer.json (prepend
// '▁', ' ' -> '▁', then repeatedly merge the adjacent pair of lowest merge rank), no BOS.
TEST_F(TinyStories, TokenizerMatchesHfBpe) {
    const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
        {"Once upon a time, there was a little girl named Lily. She had a toy car that she loved very much. One day, she went to the park to play with her toy car in the park. Lily was very happy with her toy car because she had no one to play with.",
         {80, 147, 201, 282, 215, 286, 598, 1662, 356, 499, 826, 1363, 1145, 1652, 615, 242, 1482, 951, 628, 499, 826, 872, 921, 318, 385, 628, 499, 826, 617, 242, 198, 1047, 425, 1939, 10}},
        {"Once upon a time",
         {80, 147, 201, 282, 57}},
        {"Hello world",
         {80, 1288, 139, 410, 555}},
        {"The cat sat on the mat.",
         {80, 247, 411, 1214, 337, 175, 72, 10}},
        {"Tom and Sue",
         {80, 875, 1066}},
        {"  two  spaces",
         {80, 80, 80, 1209, 80, 415, 53, 1499}},
        {"Lily's dog, Max, said \"hi!\"",
         {80, 1837, 604, 94, 349, 94, 2031, 60, 61, 4, 5}},
        {"numbers 12345 and 3.14",
         {80, 66, 359, 934, 89, 12, 13, 14, 15, 16, 100, 14, 10, 12, 15}},
        {"Once upon a time, there was a little girl named Lily.",
         {80, 147, 201, 282, 215, 286, 598, 629, 10}},
    };
    auto engine = cera::Engine::load(gguf("F32"), {.device = "cpu", .threads = 1});
    for (const auto& [text, ids] : cases) {
        EXPECT_EQ(engine->tokenize(text, false, false), ids) << text;
        EXPECT_EQ(engine->detokenize(ids), text);
    }
    std::vector<int32_t> with_bos = engine->tokenize("Tom and Sue", true, false);
    EXPECT_EQ(with_bos, (std::vector<int32_t>{1, 80, 875, 1066}));
}

// Q8_0 weights: greedy follows the F32 reference for the opening words at least.
TEST_F(TinyStories, Q8GreedyFollowsReferenceStart) {
    auto engine = cera::Engine::load(gguf("Q8_0"), {.device = "cpu", .threads = 2});
    cera::Session s(engine);
    const int32_t bos = 1;
    s.append_tokens({&bos, 1});
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 16;
    Collect sink;
    s.generate(g, sink);
    const auto want = expected_ids();
    ASSERT_GE(sink.ids.size(), 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(sink.ids[i], want[i]) << "step " << i;
}

}  // namespace
