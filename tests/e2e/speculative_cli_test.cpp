// `cera run` and `cera bench` with speculative decoding: greedy output equal to plain greedy output (prompt
// lookup and a draft model), the acceptance figures in -v and bench output, and one-line errors for bad
// speculative flags and a draft model of another vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace {

using cera::test::data_path;
using cera::test::shell_quote;

cera::test::ShellResult cera(const std::string& args) {
    return cera::test::run_shell(shell_quote(cera::test::cera_bin()) + " " + args + " </dev/null");
}

const std::string kModel = data_path("fixtures/tiny-lfm2/model.gguf");
const std::string kDraft = data_path("fixtures/tiny-qwen3/model.gguf");

std::string story() {
    return nlohmann::json::parse(cera::test::read_text(data_path("fixtures/tiny-lfm2/ref/prompt_2.json")))["text"]
        .get<std::string>();
}

TEST(SpeculativeCli, RunGivesThePlainGreedyText) {
    const std::string s = story();
    const std::string base = "run --device cpu -t 2 --temp 0 -n 48 --ignore-eos -m " + shell_quote(kModel) + " -p " +
                             shell_quote(s + "\n" + s.substr(0, s.size() / 3));
    const auto plain = cera(base);
    ASSERT_EQ(plain.code, 0) << plain.err;
    const auto lookup = cera(base + " --lookup-ngram 3 --draft-max 6 -v");
    ASSERT_EQ(lookup.code, 0) << lookup.err;
    EXPECT_EQ(lookup.out, plain.out);
    EXPECT_NE(lookup.err.find("speculative: "), std::string::npos) << lookup.err;
    EXPECT_NE(lookup.err.find("tokens a pass"), std::string::npos) << lookup.err;
    const auto draft = cera(base + " --draft-model " + shell_quote(kDraft) + " --draft-max 4");
    ASSERT_EQ(draft.code, 0) << draft.err;
    EXPECT_EQ(draft.out, plain.out);
}

TEST(SpeculativeCli, BenchReportsAcceptance) {
    const std::string text =
        (std::filesystem::temp_directory_path() / ("cera_spec_" + std::to_string(::getpid()) + ".txt")).string();
    {
        const std::string s = story();
        std::ofstream(text) << s << "\n" << s << "\n" << s.substr(0, s.size() / 3);
    }
    const auto r = cera("bench --device cpu -t 2 -m " + shell_quote(kModel) + " -f " + shell_quote(text) +
                        " -p 0 -n 16 -r 1 --bandwidth 1 --lookup-ngram 3 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("speculative")) << r.out;
    EXPECT_GT(j["speculative"]["drafted"].get<int>(), 0);
    EXPECT_GT(j["speculative"]["tokens_per_pass"].get<double>(), 1.0);
    std::filesystem::remove(text);
}

// bench --parallel: every sequence prompted with the text, the batcher speculating for all of them.
TEST(SpeculativeCli, BenchParallelReportsAcceptance) {
    const std::string text =
        (std::filesystem::temp_directory_path() / ("cera_spec_par_" + std::to_string(::getpid()) + ".txt")).string();
    {
        const std::string s = story();
        std::ofstream(text) << s << "\n" << s.substr(0, s.size() / 2);
    }
    const auto r = cera("bench --device cpu -t 2 -m " + shell_quote(kModel) + " -f " + shell_quote(text) +
                        " -p 1 -n 16 -r 1 --parallel 1,2 --lookup-ngram 3 --draft-max 6 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("speculative")) << r.out;
    EXPECT_GT(j["speculative"]["drafted"].get<int>(), 0);
    EXPECT_GT(j["speculative"]["accepted"].get<int>(), 0);
    EXPECT_GT(j["speculative"]["tokens_per_pass"].get<double>(), 1.0);
    EXPECT_NE(r.err.find("2 sequences: speculative: "), std::string::npos) << r.err;
    std::filesystem::remove(text);
}

TEST(SpeculativeCli, BadFlagsEndWithOneLine) {
    const std::string base = "run --device cpu -t 2 -n 4 -m " + shell_quote(kModel) + " -p 'Once upon a time'";
    for (const std::string& extra :
         {std::string(" --draft-max 0 --lookup-ngram 2"), std::string(" --lookup-ngram -1"),
          std::string(" --draft-min 9 --draft-max 4 --lookup-ngram 2"),
          " --draft-model " + shell_quote(data_path("fixtures/tiny-lfm2vl-random/model.gguf")),
          std::string(" --draft-model /nonexistent/draft.gguf")}) {
        const auto r = cera(base + extra);
        EXPECT_NE(r.code, 0) << extra;
        EXPECT_NE(r.err.find("error"), std::string::npos) << extra << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << extra << ": " << r.err;
    }
}

}  // namespace
