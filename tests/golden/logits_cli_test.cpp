// `cera logits` end to end: text through the model's tokenizer and the model, raw f32 logits at
// every position compared with the transformers reference; --tokens gives the same bytes; bad
// input exits non-zero with one line on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

const auto& bin = cera::test::cera_bin;
const auto& quote = cera::test::shell_quote;

int run(const std::string& cmd) {
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(LogitsCli, TextPromptMatchesReference) {
    const std::string dir = cera::test::data_path("fixtures/tiny-lfm2");
    nlohmann::json pj = nlohmann::json::parse(cera::test::read_text(dir + "/ref/prompt_0.json"));
    const std::string text = pj["text"].get<std::string>();
    const std::vector<int32_t> ids = pj["ids"].get<std::vector<int32_t>>();
    const std::string out = std::string(CERA_BINARY_DIR) + "/logits_cli_test_p.f32";
    ASSERT_EQ(run(bin() + " logits -m " + dir + "/model.gguf -p " + quote(text) + " --all --threads 1 --out " + out),
              0);
    std::vector<float> got = cera::test::read_f32(out);
    std::vector<float> ref = cera::test::read_f32(dir + "/ref/logits_0.f32");
    ASSERT_EQ(got.size(), ref.size()) << "the text must tokenize to the reference's " << ids.size() << " ids";
    double max_d = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_d = std::max(max_d, double(std::fabs(got[i] - ref[i])));
    std::printf("[ cli    ] cera logits -p on tiny-lfm2 prompt 0: max |dlogit| = %.3g\n", max_d);
    EXPECT_LT(max_d, 1e-2);

    std::string id_list;
    for (int32_t id : ids) id_list += std::to_string(id) + " ";
    const std::string out2 = std::string(CERA_BINARY_DIR) + "/logits_cli_test_t.f32";
    ASSERT_EQ(run(bin() + " logits -m " + dir + "/model.gguf --tokens " + quote(id_list) + " --all --threads 1 --out " +
                  out2),
              0);
    EXPECT_EQ(cera::test::read_f32(out2), got);
}

TEST(LogitsCli, BadInputFails) {
    const std::string model = cera::test::data_path("fixtures/tiny-lfm2/model.gguf");
    EXPECT_EQ(run(bin() + " logits -m /nonexistent.gguf --tokens 1 2>/dev/null"), 1);
    EXPECT_EQ(run(bin() + " logits -m " + model + " --tokens '1 5000' 2>/dev/null"), 1);
    EXPECT_EQ(run(bin() + " logits -m " + model + " 2>/dev/null"), 2);  // neither -p nor --tokens
    EXPECT_EQ(run(bin() + " logits -m " + model + " --tokens '1 x' 2>/dev/null"), 1);
}

}  // namespace
