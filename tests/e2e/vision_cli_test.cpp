// `cera run|logits|embed --mmproj F --image PATH` on the tiny LFM2-VL fixture: the greedy text and the
// logits of transformers (float64 references), one embedding row per position of the expanded prompt,
// <image> markers, and one-line errors for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

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

TEST(VisionCli, ChatImageStaysInTheConversation) {
    // /image attaches the test image to the next message: the chat template renders the fixture's prompt,
    // so the reply is the reference's greedy start; the second turn evaluates only its new tokens.
    const nlohmann::json greedy = nlohmann::json::parse(test::read_text(fx("ref/greedy_vl.json")));
    const std::string input = "/image " + fx("ref/test_image.png") + "\nWhat is in the picture?\nAnd now?\n";
    const test::ShellResult r = test::run_shell("printf '%s' " + shell_quote(input) + " | " + base("chat") +
                                                " --mmproj " + shell_quote(fx("mmproj.gguf")) + " --temp 0 -n 8 -v");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string first = r.out.substr(0, r.out.find('\n'));
    EXPECT_EQ(first, greedy["generated_text"].get<std::string>().substr(0, first.size()));
    EXPECT_EQ(first.size(), 42u);  // " Tommy Tommy" and six "Sorry": the first 8 tokens
    EXPECT_NE(r.err.find("prompt 90 new tokens"), std::string::npos) << r.err;
    const size_t second = r.err.find("prompt ", r.err.find("prompt 90 new tokens") + 10);
    ASSERT_NE(second, std::string::npos) << r.err;
    EXPECT_LT(std::stoi(r.err.substr(second + 7)), 30) << r.err;
}

TEST(VisionCli, ChatSaveAndLoadKeepTheImage) {
    // The same two turns in one process, and split by /save and /load across two: the second reply is
    // the same, and the loaded conversation evaluates only the new turn's tokens (the image stays in the
    // saved state; its marker is not fed as a token).
    const std::string chat = base("chat") + " --mmproj " + shell_quote(fx("mmproj.gguf")) + " --temp 0 -n 8 -v";
    const std::string image = "/image " + fx("ref/test_image.png") + "\n";
    const test::ShellResult whole =
        test::run_shell("printf '%s' " + shell_quote(image + "What is in the picture?\nAnd now?\n") + " | " + chat);
    ASSERT_EQ(whole.code, 0) << whole.err;
    const std::string state =
        (std::filesystem::temp_directory_path() / ("cera_vision_chat_" + std::to_string(::getpid()) + ".state"))
            .string();
    const test::ShellResult first = test::run_shell(
        "printf '%s' " + shell_quote(image + "What is in the picture?\n/save " + state + "\n") + " | " + chat);
    ASSERT_EQ(first.code, 0) << first.err;
    const test::ShellResult second =
        test::run_shell("printf '%s' " + shell_quote("/load " + state + "\nAnd now?\n") + " | " + chat);
    ASSERT_EQ(second.code, 0) << second.err;
    std::filesystem::remove(state);
    std::filesystem::remove(state + ".chat.json");
    const std::string want = whole.out.substr(whole.out.find('\n') + 1);
    EXPECT_EQ(second.out, want);
    const size_t at = second.err.find("prompt ");
    ASSERT_NE(at, std::string::npos) << second.err;
    EXPECT_LT(std::stoi(second.err.substr(at + 7)), 30) << second.err;
}

TEST(VisionCli, SynthMmprojLoadsAndBenchReportsEncodeTime) {
    const std::string out = (std::filesystem::temp_directory_path() / "cera_synth_mmproj_tiny.gguf").string();
    test::ShellResult r =
        test::run_shell(shell_quote(test::cera_bin()) + " synth --mmproj tiny -o " + shell_quote(out));
    ASSERT_EQ(r.code, 0) << r.err;
    r = test::run_shell(base("bench") + " --mmproj " + shell_quote(out) + " --image-size 300x520 -r 1 --json");
    std::filesystem::remove(out);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    // The tall image's prompt: 144 image tokens and its markers, then the text.
    EXPECT_GT(j["prompt_tokens"].get<int>(), 146);
    EXPECT_GT(j["encode_ms"].get<double>(), 0.0);
    EXPECT_GE(j["ttft_ms"].get<double>(), j["encode_ms"].get<double>());
    EXPECT_GT(j["first_encode_ms"].get<double>(), 0.0);
    EXPECT_GE(j["first_ttft_ms"].get<double>(), j["first_encode_ms"].get<double>());
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
