// The C example (examples/c, plain C11 on libcera.so) prints exactly what `cera run --temp 0`
// prints for the same prompt (also with a LoRA adapter), answers chat messages, and its batched requests
// all match.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace {

using cera::test::shell_quote;

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");
const std::string kExample = std::string(CERA_BINARY_DIR) + "/bin/cera_c_example";

cera::test::ShellResult example(const std::string& args) {
    return cera::test::run_shell(shell_quote(kExample) + " " + shell_quote(kModel) + " " + args + " </dev/null");
}

TEST(CExample, GreedyOutputEqualsCeraRun) {
    const auto run = cera::test::run_shell(shell_quote(cera::test::cera_bin()) + " run -m " + shell_quote(kModel) +
                                           " -p 'Once upon a time' -n 40 --temp 0 --threads 1 </dev/null");
    ASSERT_EQ(run.code, 0) << run.err;
    const auto c = example("'Once upon a time' -n 40");
    ASSERT_EQ(c.code, 0) << c.err;
    EXPECT_FALSE(c.out.empty());
    EXPECT_EQ(c.out, run.out);
    EXPECT_NE(c.err.find("finish: length"), std::string::npos) << c.err;
}

TEST(CExample, LoraOutputEqualsCeraRun) {
    const std::string model = cera::test::data_path("fixtures/tiny-lfm2/model.gguf");
    const std::string lora = cera::test::data_path("fixtures/tiny-lfm2/lora/lora.gguf");
    const auto run =
        cera::test::run_shell(shell_quote(cera::test::cera_bin()) + " run -m " + shell_quote(model) + " --lora " +
                              shell_quote(lora) + " -p 'Once upon a time' -n 24 --temp 0 --threads 1 </dev/null");
    ASSERT_EQ(run.code, 0) << run.err;
    const auto c = cera::test::run_shell(shell_quote(kExample) + " " + shell_quote(model) +
                                         " 'Once upon a time' -n 24 --lora " + shell_quote(lora) + " </dev/null");
    ASSERT_EQ(c.code, 0) << c.err;
    EXPECT_FALSE(c.out.empty());
    EXPECT_EQ(c.out, run.out);
    const auto base = cera::test::run_shell(shell_quote(kExample) + " " + shell_quote(model) +
                                            " 'Once upon a time' -n 24 </dev/null");
    EXPECT_NE(base.out, c.out);
}

TEST(CExample, ChatAndBatch) {
    const auto chat = example("'What is a cat?' -n 16 --chat");
    ASSERT_EQ(chat.code, 0) << chat.err;
    EXPECT_FALSE(chat.out.empty());
    const auto single = example("'The cat' -n 24");
    const auto batch = example("'The cat' -n 24 --batch 3");
    ASSERT_EQ(batch.code, 0) << batch.err;
    EXPECT_EQ(batch.out, single.out);
}

TEST(CExample, ErrorsAreOneLineWithTheMessage) {
    const auto r = cera::test::run_shell(shell_quote(kExample) + " /nonexistent.gguf 'x' </dev/null");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("i/o error"), std::string::npos) << r.err;
}

}  // namespace
