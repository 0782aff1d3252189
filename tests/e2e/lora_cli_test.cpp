// `--lora PATH[:SCALE]` on the commands that run a model, through the cera binary: `cera logits` with
// each adapter format and scale against the transformers + peft float64 logits, `cera run` greedy
// against the reference continuation's text, several adapters at once, `embed`, `chat` and `bench`
// taking the flag, and an adapter of another model refused with one line naming tensor and shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "test_util.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::run_shell;
using test::shell_quote;

std::string fx(const std::string& rel) { return test::data_path("fixtures/" + rel); }
std::string bin() { return shell_quote(test::cera_bin()); }

std::string prompt_tokens(const std::string& model) {
    const auto ids = json::parse(test::read_text(fx(model + "/ref/prompt_0.json")))["ids"].get<std::vector<int32_t>>();
    std::string s;
    for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
    return s;
}

TEST(LoraCli, LogitsMatchReferenceForEachFormatAndScale) {
    const std::string out = (std::filesystem::temp_directory_path() / ("cera_lora_" + std::to_string(::getpid()))).string();
    for (const char* model : {"tiny-lfm2", "tiny-qwen3"}) {
        const std::string m = model;
        struct Case {
            std::string flags, ref;
        };
        const std::vector<Case> cases = {
            {"--lora " + shell_quote(fx(m + "/lora/lora.gguf")), "logits_0.f32"},
            {"--lora " + shell_quote(fx(m + "/lora/peft") + ":0.5"), "logits_0_s05.f32"},
            {"--lora " + shell_quote(fx(m + "/lora/peft")), "logits_0.f32"},
            {"--lora " + shell_quote(fx(m + "/lora/lora.gguf") + ":0.5"), "logits_0_s05.f32"},
            // two adapters whose deltas add up to the adapter at scale 1
            {"--lora " + shell_quote(fx(m + "/lora/lora.gguf") + ":0.5") + " --lora " +
                 shell_quote(fx(m + "/lora/peft") + ":0.5"),
             "logits_0.f32"},
        };
        for (const Case& c : cases) {
            const auto r = run_shell(bin() + " logits --device cpu -t 2 -m " + shell_quote(fx(m + "/model.gguf")) +
                                     " --tokens " + prompt_tokens(m) + " --all --out " + shell_quote(out) + " " + c.flags);
            ASSERT_EQ(r.code, 0) << r.err;
            const double d = test::max_abs_diff(test::read_f32(out), test::read_f32(fx(m + "/lora/" + c.ref)));
            std::printf("[ lora ] %-10s %s: max |dlogit| = %.3g\n", model, c.flags.c_str(), d);
            EXPECT_LT(d, 1e-2) << c.flags;
        }
    }
    std::filesystem::remove(out);
}

TEST(LoraCli, RunGreedyMatchesReferenceText) {
    for (const char* model : {"tiny-lfm2", "tiny-qwen3"}) {
        const std::string m = model;
        const json g = json::parse(test::read_text(fx(m + "/lora/greedy_0.json")));
        const json p = json::parse(test::read_text(fx(m + "/ref/prompt_0.json")));
        auto e = Engine::load(fx(m + "/model.gguf"), {.device = "cpu", .threads = 1});
        const auto ids = g["generated_ids"].get<std::vector<int32_t>>();
        // The reference continuation as text, up to its first end-of-generation token.
        std::vector<int32_t> upto;
        for (int32_t id : ids) {
            if (e->is_eog(id)) break;
            upto.push_back(id);
        }
        const std::string want = e->detokenize(upto);
        for (const std::string adapter : {fx(m + "/lora/lora.gguf"), fx(m + "/lora/peft")}) {
            const auto r = run_shell(bin() + " run --device cpu -t 2 -m " + shell_quote(fx(m + "/model.gguf")) +
                                     " --temp 0 -n " + std::to_string(upto.size()) + " -p " +
                                     shell_quote(p["text"].get<std::string>()) + " --lora " + shell_quote(adapter));
            ASSERT_EQ(r.code, 0) << r.err;
            EXPECT_EQ(r.out.substr(0, want.size()), want) << adapter;
        }
    }
}

TEST(LoraCli, EmbedChatAndBenchTakeTheFlag) {
    const std::string model = shell_quote(fx("tiny-lfm2/model.gguf"));
    const std::string lora = " --lora " + shell_quote(fx("tiny-lfm2/lora/lora.gguf"));
    const auto base = run_shell(bin() + " embed --device cpu -t 1 -m " + model + " -p hello");
    const auto with = run_shell(bin() + " embed --device cpu -t 1 -m " + model + " -p hello" + lora);
    ASSERT_EQ(base.code, 0) << base.err;
    ASSERT_EQ(with.code, 0) << with.err;
    EXPECT_NE(base.out, with.out);
    const auto bench = run_shell(bin() + " bench --device cpu -t 1 -m " + model + " -p 8 -n 8 -r 1" + lora);
    ASSERT_EQ(bench.code, 0) << bench.err;
    EXPECT_NE(bench.out.find("lora:"), std::string::npos) << bench.out;
    const auto chat = run_shell("printf 'hi\\n' | " + bin() + " chat --device cpu -t 1 -m " + model +
                                " -n 4 --temp 0" + lora);
    EXPECT_EQ(chat.code, 0) << chat.err;
}

TEST(LoraCli, AdapterOfAnotherModelIsOneLineError) {
    const auto r = run_shell(bin() + " run --device cpu -t 1 -m " + shell_quote(fx("tiny-lfm2/model.gguf")) +
                             " -p hi -n 2 --lora " + shell_quote(fx("tiny-qwen3/lora/peft")));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("lora_"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("has ne {"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the base blk."), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    const auto s = run_shell(bin() + " serve --device cpu -t 1 -m " + shell_quote(fx("tiny-lfm2/model.gguf")) +
                             " --port 0 --lora x=" + shell_quote(fx("tiny-qwen3/lora/lora.gguf")));
    EXPECT_NE(s.code, 0);
    EXPECT_NE(s.err.find("qwen3"), std::string::npos) << s.err;
    const auto bad = run_shell(bin() + " serve --device cpu -t 1 -m " + shell_quote(fx("tiny-lfm2/model.gguf")) +
                               " --port 0 --lora nameonly");
    EXPECT_NE(bad.code, 0);
    EXPECT_NE(bad.err.find("NAME=PATH"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace cera
