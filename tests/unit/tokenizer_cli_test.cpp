// `cera tokenize`: --ids prints exactly one line of ids equal to the recorded prompt ids; the
// default output is one `id<TAB>piece` line per token; bad input exits non-zero with one message.
// Runs the built `cera` binary ($CERA_BIN, else <build>/bin/cera); skipped when it is absent.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace {

using cera::test::cera_bin;
const auto& quote = cera::test::shell_quote;

// Runs a shell command; returns stdout and sets the exit status.
std::string run(const std::string& cmd, int* status) {
    cera::test::ShellResult r = cera::test::run_shell(cmd, false);
    *status = r.code;
    return r.out;
}

class TokenizeCli : public ::testing::Test {
   protected:
    void SetUp() override {
        if (!std::filesystem::exists(cera_bin())) GTEST_SKIP() << "no cera binary at " << cera_bin();
    }
    std::string model_ = cera::test::data_path("fixtures/tiny-lfm2/model.gguf");
};

TEST_F(TokenizeCli, IdsMatchRecordedPrompt) {
    const auto j = nlohmann::json::parse(cera::test::read_text(cera::test::data_path("fixtures/tiny-lfm2/ref/prompt_2.json")));
    const std::string text = j.at("text").get<std::string>();
    std::string want;
    for (int id : j.at("ids").get<std::vector<int>>()) {
        if (!want.empty()) want += ' ';
        want += std::to_string(id);
    }
    int st = 0;
    EXPECT_EQ(run(cera_bin() + " tokenize -m " + quote(model_) + " --ids " + quote(text), &st), want + "\n");
    EXPECT_EQ(st, 0);
    // The same text from a file, without BOS.
    const std::string path = std::filesystem::temp_directory_path() / ("cera_tok_cli_" + std::to_string(getpid()));
    std::ofstream(path, std::ios::binary) << text;
    EXPECT_EQ(run(cera_bin() + " tokenize -m " + quote(model_) + " --ids --no-bos -f " + quote(path), &st),
              want.substr(want.find(' ') + 1) + "\n");
    std::filesystem::remove(path);
}

TEST_F(TokenizeCli, PiecesAndSpecialTokens) {
    int st = 0;
    const std::string out = run(cera_bin() + " tokenize -m " + quote(model_) + " " + quote("<|im_start|>Hi\nthere"), &st);
    EXPECT_EQ(st, 0);
    std::istringstream lines(out);
    std::string line;
    std::vector<std::string> rows;
    while (std::getline(lines, line)) rows.push_back(line);
    ASSERT_GE(rows.size(), 4u);
    EXPECT_EQ(rows[0], "1\t<|startoftext|>");
    EXPECT_EQ(rows[1], "3\t<|im_start|>");
    bool newline_escaped = false;
    for (const auto& r : rows) {
        EXPECT_NE(r.find('\t'), std::string::npos) << r;
        newline_escaped = newline_escaped || r.find("\\n") != std::string::npos;
    }
    EXPECT_TRUE(newline_escaped);
    // --no-special: the control token's text is plain text.
    const std::string plain = run(cera_bin() + " tokenize -m " + quote(model_) + " --ids --no-special --no-bos " +
                                      quote("<|im_start|>"), &st);
    EXPECT_EQ(st, 0);
    EXPECT_NE(plain, "3\n");
    EXPECT_GT(std::count(plain.begin(), plain.end(), ' '), 0);
}

TEST_F(TokenizeCli, Errors) {
    int st = 0;
    run(cera_bin() + " tokenize -m /nonexistent.gguf hello 2>/dev/null", &st);
    EXPECT_EQ(st, 1);
    run(cera_bin() + " tokenize -m " + quote(model_) + " 2>/dev/null", &st);
    EXPECT_EQ(st, 2);
}

}  // namespace
