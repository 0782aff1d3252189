// Fill in the middle (/v1/completions with `suffix`) on a random model with StarCoder's vocabulary
// (<fim_prefix>, <fim_suffix>, <fim_middle>): the prompt is those tokens around the code's plain-text
// tokens, found here through the vocabulary's special-token texts, and the reply is what a Session
// greedily writes after it, plain and streamed; llama.cpp's /infill likewise, with other files' text
// (input_extra) before the FIM tokens, in the repository layout where the vocabulary has a file
// separator (Qwen's). A model without FIM tokens, and a suffix after token ids, are refused.
#include "cera/session.h"
#include "serve_util.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::greedy_after;

// A tiny random model with the vocabulary of `vocab` (a GGUF under the test data).
std::shared_ptr<Engine> synth_engine(const std::string& vocab, const std::string& name) {
    const std::string path = std::string(CERA_BINARY_DIR) + "/serve_infill_" + name + ".gguf";
    const test::ShellResult r =
        test::run_shell(test::cera_bin() + " synth --arch llama --preset tiny --threads 2 " + "--vocab-from " +
                        test::shell_quote(test::data_path(vocab)) + " -o " + test::shell_quote(path));
    EXPECT_EQ(r.code, 0) << r.err;
    EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.n_ctx = 256;
    return Engine::load(path, o);
}

std::shared_ptr<Engine> fim_engine() {
    static std::shared_ptr<Engine> e = synth_engine("vocab/ggml-vocab-starcoder.gguf", "starcoder");
    return e;
}

std::vector<int32_t> plain(const Engine& e, const std::string& text) { return e.tokenize(text, false, false); }

int32_t special(const Engine& e, const std::string& text) {
    const std::vector<int32_t> ids = e.tokenize(text, false, true);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.empty() ? -1 : ids[0];
}

TEST(ServeInfill, PromptAroundTheCodeAndTheReplyAfterIt) {
    auto engine = fim_engine();
    const std::string prefix = "def add(a, b):\n    # <fim_middle> stays text\n    return ",
                      suffix = "\n\nprint(add(1, 2))\n";
    std::vector<int32_t> want;
    if (engine->add_bos() && engine->bos_token() >= 0) want.push_back(engine->bos_token());
    want.push_back(special(*engine, "<fim_prefix>"));
    for (int32_t t : engine->tokenize(prefix, false, false)) want.push_back(t);
    want.push_back(special(*engine, "<fim_suffix>"));
    for (int32_t t : engine->tokenize(suffix, false, false)) want.push_back(t);
    want.push_back(special(*engine, "<fim_middle>"));
    const std::vector<int32_t> ids = engine->infill_prompt(prefix, suffix);
    EXPECT_EQ(ids, want);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), special(*engine, "<fim_middle>")), 1);

    const std::string greedy = greedy_after(engine, ids, 12);
    test::RunningServer r({}, 2, engine);
    const json body = {{"prompt", prefix}, {"suffix", suffix}, {"max_tokens", 12}, {"temperature", 0}};
    int status = 0;
    const json j = r.post("/v1/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], greedy);
    EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
    json streamed = body;
    streamed["stream"] = true;
    auto res = r.client->Post("/v1/completions", streamed.dump(), "application/json");
    ASSERT_TRUE(res);
    std::string text;
    for (const json& e : test::sse_events(res->body))
        if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, greedy);

    r.post("/v1/completions", {{"prompt", {1, 2, 3}}, {"suffix", "x"}}, &status);
    EXPECT_EQ(status, 400);
    const json bad = r.post("/v1/completions", {{"prompt", "x"}, {"suffix", 5}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(bad["error"]["param"], "suffix");
}

// llama.cpp's /infill: input_prefix and input_suffix around the insertion, prompt the middle's start.
TEST(ServeInfill, LlamaCppInfillEndpoint) {
    auto engine = fim_engine();
    const std::string prefix = "int main() {\n    ", suffix = "\n}\n", middle = "return";
    std::vector<int32_t> ids = engine->infill_prompt(prefix, suffix);
    for (int32_t t : engine->tokenize(middle, false, false)) ids.push_back(t);
    const std::string greedy = greedy_after(engine, ids, 10);
    test::RunningServer r({}, 2, engine);
    int status = 0;
    const json j = r.post("/infill",
                          {{"input_prefix", prefix},
                           {"input_suffix", suffix},
                           {"prompt", middle},
                           {"n_predict", 10},
                           {"temperature", 0},
                           {"input_extra", json::array()}},
                          &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["content"], greedy);
    EXPECT_EQ(j["tokens_evaluated"], ids.size());
    EXPECT_EQ(j["stop"], true);
    // Other files' text (input_extra): this vocabulary has no file separator, so it goes before the
    // FIM-prefix token as plain text, each file ending in a newline.
    const std::vector<InfillFile> files = {{"util.h", "int helper(void);"}, {"", "#define N 4\n"}};
    std::vector<int32_t> with_files;
    const bool bos = engine->add_bos() && engine->bos_token() >= 0;
    if (bos) with_files.push_back(engine->bos_token());
    for (const std::string t : {"int helper(void);\n", "#define N 4\n"})
        for (int32_t id : plain(*engine, t)) with_files.push_back(id);
    const std::vector<int32_t> bare = engine->infill_prompt(prefix, suffix);
    with_files.insert(with_files.end(), bare.begin() + (bos ? 1 : 0), bare.end());
    EXPECT_EQ(engine->infill_prompt(prefix, suffix, files), with_files);
    for (int32_t t : plain(*engine, middle)) with_files.push_back(t);
    const std::string greedy_files = greedy_after(engine, with_files, 10);
    const json extra = r.post(
        "/infill",
        {{"input_prefix", prefix},
         {"input_suffix", suffix},
         {"prompt", middle},
         {"n_predict", 10},
         {"temperature", 0},
         {"input_extra", {{{"filename", "util.h"}, {"text", "int helper(void);"}}, {{"text", "#define N 4\n"}}}}},
        &status);
    ASSERT_EQ(status, 200) << extra.dump();
    EXPECT_EQ(extra["content"], greedy_files);
    EXPECT_EQ(extra["tokens_evaluated"], with_files.size());
    for (const json& bad : {json("x"), json({1}), json({{{"filename", "a"}}}), json({{{"text", 2}}})}) {
        const json e = r.post("/infill", {{"input_prefix", "a"}, {"input_extra", bad}}, &status);
        EXPECT_EQ(status, 400) << bad;
        EXPECT_EQ(e["error"]["param"], "input_extra") << bad;
    }
    r.post("/infill", {{"input_prefix", 3}}, &status);
    EXPECT_EQ(status, 400);
}

// With a file separator (Qwen2.5-Coder's vocabulary): the repository layout before FIM-prefix.
TEST(ServeInfill, OtherFilesInTheRepositoryLayout) {
    auto engine = synth_engine("vocab-extra/qwen3-vocab-qwen2.gguf", "qwen");
    auto id = [&](const char* t) {
        const std::vector<int32_t> ids = engine->tokenize(t, false, true);
        EXPECT_EQ(ids.size(), 1u) << t;
        return ids.empty() ? -1 : ids[0];
    };
    std::vector<int32_t> want;
    auto add = [&](const std::vector<int32_t>& v) { want.insert(want.end(), v.begin(), v.end()); };
    if (engine->add_bos() && engine->bos_token() >= 0) want.push_back(engine->bos_token());
    want.push_back(id("<|repo_name|>"));
    add(plain(*engine, "project\n"));
    want.push_back(id("<|file_sep|>"));
    add(plain(*engine, "lib/a.py\ndef f():\n    return 1\n"));
    want.push_back(id("<|file_sep|>"));
    add(plain(*engine, "b.py\nimport a\n"));
    want.push_back(id("<|fim_prefix|>"));
    add(plain(*engine, "x = "));
    want.push_back(id("<|fim_suffix|>"));
    add(plain(*engine, "\n"));
    want.push_back(id("<|fim_middle|>"));
    const std::vector<InfillFile> files = {{"lib/a.py", "def f():\n    return 1"}, {"b.py", "import a\n"}};
    EXPECT_EQ(engine->infill_prompt("x = ", "\n", files), want);
}

TEST(ServeInfill, ModelWithoutFimTokensIsRefused) {
    test::RunningServer r;  // the bundled LFM2 model
    int status = 0;
    const json j = r.post("/v1/completions", {{"prompt", "a"}, {"suffix", "b"}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(j["error"]["param"], "suffix");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("fill-in-the-middle"), std::string::npos) << j.dump();
    const json i = r.post("/infill", {{"input_prefix", "a"}, {"input_suffix", "b"}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(i["error"]["param"], "input_suffix");
}

}  // namespace
}  // namespace cera
