// `cera perplexity` end to end: the running estimate and the final line as llama.cpp prints them, the same
// figures as the library, --json, the KL round trip, and one-line errors for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cera/engine.h"
#include "cera/perplexity.h"
#include "test_util.h"

namespace {

using cera::test::data_path;
using cera::test::shell_quote;

cera::test::ShellResult run(const std::string& args) {
    return cera::test::run_shell(shell_quote(cera::test::cera_bin()) + " perplexity --device cpu -t 2 " + args +
                                 " </dev/null");
}

const std::string kModel = data_path("fixtures/tiny-lfm2/model.gguf");

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("cera_pplcli_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

// A text of the reference prompts, a few hundred tokens.
std::string text_file() {
    const std::string path = temp_path("text.txt");
    std::ofstream f(path);
    for (const char* m : {"tiny-lfm2", "tiny-qwen3", "tiny-lfm2moe", "tiny-llama-random"})
        f << nlohmann::json::parse(
                 cera::test::read_text(data_path(std::string("fixtures/") + m + "/ref/prompt_2.json")))["text"]
                 .get<std::string>()
          << "\n";
    return path;
}

TEST(PerplexityCli, PrintsAsLlamaCppAndAgreesWithTheLibrary) {
    const std::string text = text_file();
    const auto r = run("-m " + shell_quote(kModel) + " -f " + shell_quote(text) + " -c 64");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("[1]", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(",[2]"), std::string::npos) << r.out;
    const size_t at = r.out.find("Final estimate: PPL = ");
    ASSERT_NE(at, std::string::npos) << r.out;

    auto engine = cera::Engine::load(kModel, {.device = "cpu", .threads = 2});
    const auto ids = engine->tokenize(cera::test::read_text(text), true);
    const cera::PerplexityResult lib = cera::perplexity(*engine, ids, {.n_ctx = 64});
    char want[64];
    std::snprintf(want, sizeof want, "PPL = %.4f +/- %.5f", lib.ppl, lib.ppl_err);
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out << " want " << want;

    const auto j = run("-m " + shell_quote(kModel) + " -f " + shell_quote(text) + " -c 64 --json");
    ASSERT_EQ(j.code, 0) << j.err;
    const auto doc = nlohmann::json::parse(j.out);
    EXPECT_NEAR(doc["ppl"].get<double>(), lib.ppl, 1e-9 * lib.ppl);
    EXPECT_EQ(doc["chunks"].get<int>(), lib.n_chunks);

    // KL: save, then compare the same model: KL 0, same top 100%.
    const std::string base = temp_path("base.kl");
    ASSERT_EQ(run("-m " + shell_quote(kModel) + " -f " + shell_quote(text) + " -c 64 --kl-divergence-base " +
                  shell_quote(base))
                  .code,
              0);
    const auto k =
        run("-m " + shell_quote(kModel) + " --kl-divergence-base " + shell_quote(base) + " --kl-divergence --json");
    ASSERT_EQ(k.code, 0) << k.err;
    const auto kd = nlohmann::json::parse(k.out);
    EXPECT_LT(kd["kl"]["kld"].get<double>(), 1e-9);
    EXPECT_EQ(kd["kl"]["same_top"].get<double>(), 1.0);
    const auto kt =
        run("-m " + shell_quote(kModel) + " --kl-divergence-base " + shell_quote(base) + " --kl-divergence");
    EXPECT_NE(kt.out.find("Same top p: 100.000"), std::string::npos) << kt.out;
    EXPECT_NE(kt.out.find("Mean    KLD:"), std::string::npos) << kt.out;
    std::filesystem::remove(base);
    std::filesystem::remove(text);
}

TEST(PerplexityCli, BadInputEndsWithOneLine) {
    const std::string text = text_file();
    for (const std::string& args :
         {"-m " + shell_quote(kModel) + " -f /nonexistent/text.txt",
          "-m " + shell_quote(kModel) + " -f " + shell_quote(text) + " -c 4096",
          "-m " + shell_quote(kModel) + " --kl-divergence-base /nonexistent/base.kl --kl-divergence",
          "-m " + shell_quote(kModel) + " --kl-divergence"}) {
        const auto r = run(args);
        EXPECT_NE(r.code, 0) << args;
        EXPECT_NE(r.err.find("error"), std::string::npos) << args << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    }
    std::filesystem::remove(text);
}

}  // namespace
