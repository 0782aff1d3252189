// Embeddings through the public API (Session::embed) and `cera embed`, checked against every
// fixture's reference: ref/hidden_0.f32 (the final-norm hidden state per token) and
// ref/hidden_0_mean.f32 (its mean over tokens, BOS included), within 1e-3.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

constexpr float kTol = 1e-3f;

std::vector<int32_t> prompt_ids(const std::string& fixture) {
    const auto j = nlohmann::json::parse(cera::test::read_text(cera::test::data_path(fixture + "/ref/prompt_0.json")));
    return j.at("ids").get<std::vector<int32_t>>();
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    return d;
}

class EmbedGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(EmbedGolden, MatchesTheReferenceHiddenStates) {
    const std::string fixture = "fixtures/" + GetParam();
    auto e = cera::Engine::load(cera::test::data_path(fixture + "/model.gguf"), {.device = "cpu", .threads = 1});
    const std::vector<int32_t> ids = prompt_ids(fixture);
    const std::vector<float> want = cera::test::read_f32(cera::test::data_path(fixture + "/ref/hidden_0.f32"));
    const std::vector<float> want_mean =
        cera::test::read_f32(cera::test::data_path(fixture + "/ref/hidden_0_mean.f32"));
    const size_t n_embd = size_t(e->info().n_embd);
    ASSERT_EQ(want.size(), ids.size() * n_embd);

    cera::Session s(e);
    const std::vector<float> per_token = s.embed(ids, cera::Pooling::kNone);
    EXPECT_LE(max_diff(per_token, want), kTol);
    const std::vector<float> mean = s.embed(ids, cera::Pooling::kMean);
    EXPECT_LE(max_diff(mean, want_mean), kTol);
    const std::vector<float> last = s.embed(ids, cera::Pooling::kLast);
    EXPECT_LE(max_diff(last, std::vector<float>(want.end() - std::ptrdiff_t(n_embd), want.end())), kTol);

    // Small chunks give the same rows; the session holds the tokens and can continue.
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    o.n_batch = 3;
    cera::Session chunked(cera::Engine::load(cera::test::data_path(fixture + "/model.gguf"), o));
    EXPECT_LE(max_diff(chunked.embed(ids, cera::Pooling::kNone), want), kTol);
    EXPECT_EQ(chunked.tokens(), ids);
    cera::GenerateOptions g;
    g.max_tokens = 2;
    g.sampling.temperature = 0.0f;
    cera::NullSink sink;
    EXPECT_EQ(chunked.generate(g, sink).generated_tokens, 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EmbedGolden,
                         ::testing::Values("tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3", "tiny-llama-random",
                                           "tiny-qwen2-random", "tiny-granite-random"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             std::string n = info.param;
                             for (char& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

TEST(EmbedApi, BadInput) {
    auto e = cera::Engine::load(cera::test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1});
    cera::Session s(e, 8);
    EXPECT_THROW(s.embed(std::vector<int32_t>{}), cera::Error);
    EXPECT_THROW(s.embed(std::vector<int32_t>{1, 99999}), cera::Error);
    EXPECT_THROW(s.embed(std::vector<int32_t>(9, 1)), cera::Error);  // longer than the context
}

// ---- `cera embed`

using cera::test::cera_bin;

using CliResult = cera::test::ShellResult;

CliResult run(const std::string& args) {
    return cera::test::run_shell(cera_bin() + " embed " + args + " 2>/dev/null </dev/null", false);
}

TEST(EmbedCli, OutputsMatchTheReference) {
    const std::string fixture = "fixtures/tiny-lfm2";
    const std::string model = cera::test::data_path(fixture + "/model.gguf");
    const std::vector<int32_t> ids = prompt_ids(fixture);
    std::string tokens;
    for (int32_t t : ids) tokens += (tokens.empty() ? "" : " ") + std::to_string(t);
    const std::vector<float> want = cera::test::read_f32(cera::test::data_path(fixture + "/ref/hidden_0.f32"));
    const std::vector<float> want_mean =
        cera::test::read_f32(cera::test::data_path(fixture + "/ref/hidden_0_mean.f32"));

    // --out: raw float32 rows.
    const std::string out = (fs::temp_directory_path() / ("cera_embed_" + std::to_string(::getpid()))).string();
    CliResult r = run("-m '" + model + "' --tokens '" + tokens + "' --per-token --threads 1 --out '" + out + "'");
    ASSERT_EQ(r.code, 0);
    EXPECT_TRUE(r.out.empty());
    EXPECT_LE(max_diff(cera::test::read_f32(out), want), kTol);
    r = run("-m '" + model + "' --tokens '" + tokens + "' --threads 1 --out '" + out + "'");
    ASSERT_EQ(r.code, 0);
    EXPECT_LE(max_diff(cera::test::read_f32(out), want_mean), kTol);
    fs::remove(out);

    // --json, and the text prompt (BOS added as the model asks) gives the same tokens.
    r = run("-m '" + model + "' -p 'Once upon a time, there was a little' --json --threads 1");
    ASSERT_EQ(r.code, 0);
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), ids);
    EXPECT_LE(max_diff(j.at("embedding").get<std::vector<float>>(), want_mean), kTol);

    // Text output: one row per line.
    r = run("-m '" + model + "' --tokens '" + tokens + "' --per-token --threads 1");
    ASSERT_EQ(r.code, 0);
    EXPECT_EQ(size_t(std::count(r.out.begin(), r.out.end(), '\n')), ids.size());

    // Errors: no input, both inputs, a bad id.
    EXPECT_NE(run("-m '" + model + "'").code, 0);
    EXPECT_NE(run("-m '" + model + "' -p hi --tokens 1").code, 0);
    EXPECT_NE(run("-m '" + model + "' --tokens '1 x'").code, 0);
    EXPECT_NE(run("-m '" + model + "' --tokens '1 99999'").code, 0);
}

}  // namespace
