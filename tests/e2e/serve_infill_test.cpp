// Fill in the middle (/v1/completions with `suffix`) on a random model with StarCoder's vocabulary
// (<fim_prefix>, <fim_suffix>, <fim_middle>): the prompt is those tokens around the code's plain-text
// tokens, found here through the vocabulary's special-token texts, and the reply is what a Session
// greedily writes after it, plain and streamed; llama.cpp's /infill likewise. A model without FIM
// tokens, and a suffix after token ids, are refused.
#include "cera/session.h"
#include "serve_util.h"

namespace cera {
namespace {

using json = nlohmann::json;

std::shared_ptr<Engine> fim_engine() {
    static std::shared_ptr<Engine> e = [] {
        const std::string path = std::string(CERA_BINARY_DIR) + "/serve_infill_starcoder.gguf";
        const test::ShellResult r = test::run_shell(
            test::cera_bin() + " synth --arch llama --preset tiny --threads 2 --vocab-from " +
            test::shell_quote(test::data_path("vocab/ggml-vocab-starcoder.gguf")) + " -o " + test::shell_quote(path));
        EXPECT_EQ(r.code, 0) << r.err;
        EngineOptions o;
        o.device = "cpu";
        o.threads = 2;
        o.n_ctx = 256;
        return Engine::load(path, o);
    }();
    return e;
}

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

    std::string greedy;
    {
        Session s(engine);
        s.append_tokens(ids);
        GenerateOptions g;
        g.sampling.temperature = 0.0f;
        g.max_tokens = 12;
        NullSink sink;
        greedy = s.generate(g, sink).text;
    }
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
    std::string greedy;
    {
        Session s(engine);
        s.append_tokens(ids);
        GenerateOptions g;
        g.sampling.temperature = 0.0f;
        g.max_tokens = 10;
        NullSink sink;
        greedy = s.generate(g, sink).text;
    }
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
    const json extra =
        r.post("/infill", {{"input_prefix", "a"}, {"input_extra", {{{"filename", "x.c"}, {"text", "y"}}}}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(extra["error"]["param"], "input_extra");
    r.post("/infill", {{"input_prefix", 3}}, &status);
    EXPECT_EQ(status, 400);
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
