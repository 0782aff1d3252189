// TinyStories-656K (a Hugging Face Llama checkpoint) through our converter: `cera convert`
// writes a GGUF, which must reproduce the independent reference (expected_greedy.json, from
// a NumPy forward pass of the HF model with rotate-half RoPE): the top-5 logits of the first
// 8 greedy steps, the greedy ids from BOS up to EOS, and their text.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cera/engine.h"
#include "cera/session.h"
#include "core/fp16.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using cera::test::cera_bin;

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
        state->eval({.tokens = {&token, 1}, .logits = logits.data()});
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

// A synthetic checkpoint in BF16 and F16 (untied, so lm_head becomes output.weight): every converted
// tensor equals its source, reshaped to GGUF order, and the q/k rows are permuted per head exactly as
// permute(w, n_head) of llama.cpp's converter: new row h*d + 2j + s <- old row h*d + s*d/2 + j.
TEST(Convert, Bf16F16CheckpointAndRopePermutation) {
    const fs::path dir = fs::temp_directory_path() / ("cera_convert_synth_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const int64_t n_embd = 8, n_head = 2, n_head_kv = 1, head_dim = 4, n_ff = 16, n_vocab = 6;
    struct Src {
        std::string name, dtype;
        std::vector<int64_t> shape;
    };
    const std::vector<Src> srcs = {
        {"model.embed_tokens.weight", "BF16", {n_vocab, n_embd}},
        {"model.layers.0.input_layernorm.weight", "F16", {n_embd}},
        {"model.layers.0.self_attn.q_proj.weight", "BF16", {n_head * head_dim, n_embd}},
        {"model.layers.0.self_attn.k_proj.weight", "F16", {n_head_kv * head_dim, n_embd}},
        {"model.layers.0.self_attn.v_proj.weight", "BF16", {n_head_kv * head_dim, n_embd}},
        {"model.layers.0.self_attn.o_proj.weight", "BF16", {n_embd, n_head * head_dim}},
        {"model.layers.0.post_attention_layernorm.weight", "F16", {n_embd}},
        {"model.layers.0.mlp.gate_proj.weight", "BF16", {n_ff, n_embd}},
        {"model.layers.0.mlp.up_proj.weight", "BF16", {n_ff, n_embd}},
        {"model.layers.0.mlp.down_proj.weight", "BF16", {n_embd, n_ff}},
        {"model.norm.weight", "F16", {n_embd}},
        {"lm_head.weight", "BF16", {n_vocab, n_embd}},
    };
    // Value k of tensor t: small integers and halves, exact in BF16 and F16.
    auto value = [](size_t t, int64_t k) { return float(int64_t(t) * 3 + k % 37) * 0.5f - 9.0f; };
    nlohmann::json header;
    std::string data;
    for (size_t t = 0; t < srcs.size(); ++t) {
        int64_t n = 1;
        for (int64_t d : srcs[t].shape) n *= d;
        const size_t begin = data.size();
        for (int64_t k = 0; k < n; ++k) {
            const uint16_t h = srcs[t].dtype == "BF16" ? cera::fp32_to_bf16(value(t, k)) : cera::fp32_to_fp16(value(t, k));
            data.append(reinterpret_cast<const char*>(&h), 2);
        }
        header[srcs[t].name] = {{"dtype", srcs[t].dtype}, {"shape", srcs[t].shape}, {"data_offsets", {begin, data.size()}}};
    }
    header["__metadata__"] = {{"format", "pt"}};
    const std::string hj = header.dump();
    {
        std::ofstream f(dir / "model.safetensors", std::ios::binary);
        const uint64_t len = hj.size();
        f.write(reinterpret_cast<const char*>(&len), 8);
        f << hj << data;
    }
    nlohmann::json cfg = {{"model_type", "llama"},         {"hidden_size", n_embd},
                          {"intermediate_size", n_ff},     {"num_hidden_layers", 1},
                          {"num_attention_heads", n_head}, {"num_key_value_heads", n_head_kv},
                          {"vocab_size", n_vocab},         {"max_position_embeddings", 64},
                          {"rms_norm_eps", 1e-5},          {"rope_theta", 500000.0},
                          {"tie_word_embeddings", false},  {"bos_token_id", 1},
                          {"eos_token_id", 2}};
    std::ofstream(dir / "config.json") << cfg.dump();
    nlohmann::json tok = {
        {"model",
         {{"type", "BPE"},
          {"byte_fallback", true},
          {"unk_token", "<unk>"},
          {"vocab", {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xe2\x96\x81", 3}, {"a", 4}, {"\xe2\x96\x81" "a", 5}}},
          {"merges", {"\xe2\x96\x81 a"}}}},
        {"added_tokens",
         {{{"id", 1}, {"content", "<s>"}, {"special", true}}, {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}}}}}};
    std::ofstream(dir / "tokenizer.json") << tok.dump();

    const std::string out = (dir / "out.gguf").string();
    const std::string cmd = "'" + cera_bin() + "' convert --hf '" + dir.string() + "' -o '" + out + "' 2>/dev/null";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
    auto f = cera::gguf::File::open(out);
    EXPECT_EQ(f->get_f32("llama.rope.freq_base"), 500000.0f);
    EXPECT_EQ(f->get_u32("llama.attention.head_count_kv"), 1u);
    EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_space_prefix"));
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores")[5], -1.0f);  // made by merge rank 0
    EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")[1], 3);  // control

    auto check = [&](const std::string& gg, size_t t, int64_t permute_heads) {
        const cera::gguf::TensorInfo* ti = f->find_tensor(gg);
        ASSERT_NE(ti, nullptr) << gg;
        ASSERT_EQ(ti->type, cera::GgmlType::kF32) << gg;
        const std::vector<int64_t>& shape = srcs[t].shape;
        std::vector<int64_t> ne(shape.rbegin(), shape.rend());
        EXPECT_EQ(ti->ne, ne) << gg;
        const float* got = reinterpret_cast<const float*>(ti->data);
        const int64_t cols = shape.size() == 2 ? shape[1] : shape[0], rows = shape.size() == 2 ? shape[0] : 1;
        for (int64_t r = 0; r < rows; ++r) {
            int64_t src_row = r;
            if (permute_heads > 0) {
                const int64_t h = r / head_dim, i = r % head_dim, j = i / 2, s = i % 2;
                src_row = h * head_dim + s * (head_dim / 2) + j;
            }
            for (int64_t col = 0; col < cols; ++col)
                ASSERT_EQ(got[r * cols + col], value(t, src_row * cols + col)) << gg << " row " << r << " col " << col;
        }
    };
    check("token_embd.weight", 0, 0);
    check("blk.0.attn_norm.weight", 1, 0);
    check("blk.0.attn_q.weight", 2, n_head);
    check("blk.0.attn_k.weight", 3, n_head_kv);
    check("blk.0.attn_v.weight", 4, 0);
    check("blk.0.attn_output.weight", 5, 0);
    check("blk.0.ffn_norm.weight", 6, 0);
    check("blk.0.ffn_gate.weight", 7, 0);
    check("blk.0.ffn_up.weight", 8, 0);
    check("blk.0.ffn_down.weight", 9, 0);
    check("output_norm.weight", 10, 0);
    check("output.weight", 11, 0);

    // A missing tensor is one error line naming it, and exit 1.
    nlohmann::json bad = header;
    bad.erase("model.norm.weight");
    {
        const std::string bj = bad.dump();
        std::ofstream f(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
        const uint64_t len = bj.size();
        f.write(reinterpret_cast<const char*>(&len), 8);
        f << bj << data;
    }
    const std::string err = (dir / "err.txt").string();
    const std::string cmd2 = "'" + cera_bin() + "' convert --hf '" + dir.string() + "' -o '" + out + "' 2>'" + err + "'";
    const int status2 = std::system(cmd2.c_str());
    EXPECT_TRUE(WIFEXITED(status2) && WEXITSTATUS(status2) == 1);
    const std::string msg = cera::test::read_text(err);
    EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
    EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
    fs::remove_all(dir);
}

}  // namespace
