// Embedding models' pooling: a GGUF that names the last token's pooling (qwen3.pooling_type 3, as
// llama.cpp's converter writes Qwen3-Embedding) and asks for EOS after the text is embedded by
// /v1/embeddings, `cera embed` and the Python-facing default as Session::embed's last-token row of the
// text with its EOS (scaled to length 1 by the server); a pooling cera does not do is refused by name.
#include <cmath>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "serve_util.h"

namespace cera {
namespace {

using json = nlohmann::json;

// tiny-qwen3 with its pooling type set and EOS added after a tokenized text.
std::string with_pooling(uint32_t type) {
    auto f = gguf::File::open(test::data_path("fixtures/tiny-qwen3/model.gguf"));
    gguf::Writer w;
    for (const auto& [key, value] : f->metadata())
        if (key != "tokenizer.ggml.add_eos_token") w.set(key, value);
    w.set("qwen3.pooling_type", gguf::value_u32(type));
    w.set("tokenizer.ggml.add_eos_token", gguf::value_bool(true));
    for (const gguf::TensorInfo& t : f->tensors())
        w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(t.data, t.n_bytes));
    const std::string path = std::string(CERA_BINARY_DIR) + "/embed_pooling_" + std::to_string(type) + ".gguf";
    w.write(path);
    return path;
}

std::shared_ptr<Engine> load(const std::string& path) {
    EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.n_ctx = 128;
    return Engine::load(path, o);
}

TEST(EmbedPooling, LastTokenModel) {
    const std::string path = with_pooling(3);
    auto engine = load(path);
    EXPECT_EQ(engine->info().pooling, Pooling::kLast);
    const std::string text = "The quick brown fox";
    const std::vector<int32_t> ids = engine->tokenize(text, true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids.back(), engine->eos_token());
    std::vector<float> want;
    {
        Session s(engine);
        const std::vector<float> rows = s.embed(ids, Pooling::kNone);  // every token's row
        const size_t n = size_t(engine->info().n_embd);
        want.assign(rows.end() - std::ptrdiff_t(n), rows.end());
    }

    // The CLI: the last row, as it is.
    const test::ShellResult r = test::run_shell(test::cera_bin() + " embed -m " + test::shell_quote(path) +
                                                " --threads 2 --json -p " + test::shell_quote(text));
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["pooling"], "last");
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ids);
    const std::vector<float> cli = j["embedding"].get<std::vector<float>>();
    ASSERT_EQ(cli.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(cli[k], want[k], 1e-5 * (1.0 + std::fabs(want[k])));

    // The server: the same row scaled to length 1.
    double ss = 0.0;
    for (float x : want) ss += double(x) * x;
    test::RunningServer server({}, 2, engine);
    int status = 0;
    const json e = server.post("/v1/embeddings", {{"input", text}}, &status);
    ASSERT_EQ(status, 200) << e.dump();
    const std::vector<float> got = e["data"][0]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size());
    double norm = 0.0;
    for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_NEAR(got[k], want[k] / std::sqrt(ss), 1e-6);
        norm += double(got[k]) * got[k];
    }
    EXPECT_NEAR(norm, 1.0, 1e-5);
    EXPECT_EQ(e["usage"]["prompt_tokens"], ids.size());
}

TEST(EmbedPooling, PoolingThatIsNotDoneIsRefusedByName) {
    const std::string path = with_pooling(2);  // cls
    auto engine = load(path);
    EXPECT_FALSE(engine->info().pooling_unsupported.empty());
    test::RunningServer server({}, 2, engine);
    int status = 0;
    const json e = server.post("/v1/embeddings", {{"input", "hello"}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("cls"), std::string::npos) << e.dump();
    const test::ShellResult r =
        test::run_shell(test::cera_bin() + " embed -m " + test::shell_quote(path) + " --threads 2 -p hello");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("cls"), std::string::npos) << r.err;
    // Every token's rows are still there.
    EXPECT_EQ(
        test::run_shell(test::cera_bin() + " embed -m " + test::shell_quote(path) + " --threads 2 --per-token -p hi")
            .code,
        0);
}

}  // namespace
}  // namespace cera
