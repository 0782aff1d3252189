// `cera run|logits|embed --mmproj F --image PATH` on the tiny LFM2-VL fixture: the greedy text and the
// logits of transformers (float64 references), one embedding row per position of the expanded prompt,
// <image> markers, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace cera {
namespace {

using test::shell_quote;

std::string fx(const std::string& rel) { return test::data_path("fixtures/tiny-lfm2vl/" + rel); }

const std::string kPrompt = "<|im_start|>user\n<image>What is in the picture?<|im_end|>\n<|im_start|>assistant\n";

std::string base(const std::string& cmd) {
    return shell_quote(test::cera_bin()) + " " + cmd + " -m " + shell_quote(fx("model.gguf")) + " --device cpu";
}
std::string vl(const std::string& cmd, const std::string& image = fx("ref/test_image.png")) {
    return base(cmd) + " --mmproj " + shell_quote(fx("mmproj.gguf")) + " --image " + shell_quote(image);
}

TEST(VisionCli, RunGivesTheGreedyContinuation) {
    const nlohmann::json greedy = nlohmann::json::parse(test::read_text(fx("ref/greedy_vl.json")));
    const test::ShellResult r =
        test::run_shell(vl("run") + " -p " + shell_quote(kPrompt) + " -n 32 --temp 0 --ignore-eos");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, greedy["generated_text"].get<std::string>());
}

TEST(VisionCli, LogitsOfEveryPositionMatch) {
    const std::string out = (std::filesystem::temp_directory_path() / "cera_vision_logits.f32").string();
    const test::ShellResult r =
        test::run_shell(vl("logits") + " -p " + shell_quote(kPrompt) + " --all --out " + shell_quote(out));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::vector<float> got = test::read_f32(out);
    std::filesystem::remove(out);
    const size_t n_vocab = 4100, n_tokens = 90;
    ASSERT_EQ(got.size(), n_tokens * n_vocab);
    const std::vector<float> tail = test::read_f32(fx("ref/logits_vl_tail.f32"));  // rows 76..89
    ASSERT_EQ(tail.size(), 14 * n_vocab);
    float worst = 0.0f;
    for (size_t i = 0; i < tail.size(); ++i) worst = std::max(worst, std::abs(got[76 * n_vocab + i] - tail[i]));
    EXPECT_LE(worst, 1e-2f);
}

TEST(VisionCli, EmbedGivesOneRowPerExpandedPosition) {
    const test::ShellResult r = test::run_shell(vl("embed") + " -p " + shell_quote(kPrompt) + " --per-token --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx("ref/prompt_vl.json")));
    EXPECT_EQ(j["tokens"], prompt["ids"]);
    EXPECT_EQ(j["embeddings"].size(), 90u);
}

TEST(VisionCli, BadInputIsOneLineError) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {base("run") + " --image " + shell_quote(fx("ref/test_image.png")) + " -p hi", "--mmproj"},
        {vl("run", fx("ref/prompt_vl.json")) + " -p hi", "not a supported image"},
        {vl("run", fx("missing.png")) + " -p hi", "cannot open"},
        {vl("run") + " -p " + shell_quote("<image> and <image>"), "markers"},
        {base("run") + " --mmproj " + shell_quote(fx("model.gguf")) + " -p hi", "clip"},
    };
    for (const auto& [cmd, what] : cases) {
        const test::ShellResult r = test::run_shell(cmd);
        EXPECT_NE(r.code, 0) << cmd;
        EXPECT_NE(r.err.find(what), std::string::npos) << cmd << "\n" << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
}

}  // namespace
}  // namespace cera
