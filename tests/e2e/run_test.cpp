// `cera run` end to end: greedy output is deterministic and is exactly what the library
// generates, stdout carries only the generated text, timings go to stderr, and bad input
// (a missing model, an over-long prompt, bad options) ends with one stderr line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cera/engine.h"
#include "cera/session.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using cera::test::cera_bin;
using cera::test::shell_quote;
using Result = cera::test::ShellResult;

Result run(const std::string& args, const std::string& env = "") {
    return cera::test::run_shell(env + " " + shell_quote(cera_bin()) + " run " + args + " </dev/null");
}

size_t lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");

TEST(CeraRun, GreedyIsDeterministicAndStdoutIsOnlyTheGeneratedText) {
    const std::string args = "-m " + shell_quote(kModel) + " -p 'Once upon a time' -n 32 --temp 0 --threads 1";
    const Result a = run(args), b = run(args);
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(a.out.empty());

    // The library, driven directly with the same settings, produces the same text.
    auto engine = cera::Engine::load(kModel, {.device = "cpu", .threads = 1});
    cera::Session s(engine);
    s.append_text("Once upon a time");
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 32;
    cera::NullSink sink;
    const auto r = s.generate(g, sink);
    EXPECT_EQ(a.out, r.text);  // no prompt echo, no timings, no trailing newline on stdout

    // Timings go to stderr, one line.
    EXPECT_NE(a.err.find("prefill"), std::string::npos) << a.err;
    EXPECT_NE(a.err.find("decode"), std::string::npos) << a.err;
    EXPECT_NE(a.err.find("tok/s"), std::string::npos) << a.err;
    EXPECT_EQ(lines(a.err), 1u) << a.err;
}

TEST(CeraRun, DefaultModelIsTheBundledOne) {
    const Result with_m = run("-m " + shell_quote(kModel) + " -p 'The cat' -n 8 --temp 0 --threads 1");
    const Result without = run("-p 'The cat' -n 8 --temp 0 --threads 1");
    ASSERT_EQ(without.code, 0) << without.err;
    EXPECT_EQ(with_m.out, without.out);
    // CERA_MODEL_DIR points at the model directory too.
    const Result env = run("-p 'The cat' -n 8 --temp 0 --threads 1",
                           "CERA_MODEL_DIR=" + shell_quote(cera::test::source_path("models")));
    EXPECT_EQ(env.out, with_m.out);
}

TEST(CeraRun, SeedMakesSamplingReproducible) {
    const std::string args = "-m " + shell_quote(kModel) + " -p 'Once upon a time' -n 24 --temp 1.0 --threads 1 --seed ";
    const Result a = run(args + "11"), b = run(args + "11"), c = run(args + "12");
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.out, c.out);
}

TEST(CeraRun, ZeroTokensPrintsNothing) {
    const Result r = run("-m " + shell_quote(kModel) + " -p 'Once upon a time' -n 0 --threads 1");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("generated 0 tokens"), std::string::npos) << r.err;
}

TEST(CeraRun, StopStringCutsTheOutput) {
    const std::string base = "-m " + shell_quote(kModel) + " -p 'Once upon a time' -n 48 --temp 0 --threads 1";
    const Result full = run(base);
    ASSERT_GT(full.out.size(), 40u);
    const std::string stop = full.out.substr(25, 5);
    const Result cut = run(base + " --stop " + shell_quote(stop));
    ASSERT_EQ(cut.code, 0) << cut.err;
    EXPECT_EQ(cut.out, full.out.substr(0, full.out.find(stop)));
}

TEST(CeraRun, MissingModelIsOneLineAndExitOne) {
    const Result r = run("-m /no/such/model.gguf -p hi");
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("/no/such/model.gguf"), std::string::npos) << r.err;
}

TEST(CeraRun, MissingDefaultModelIsOneLine) {
    // A copy of the binary where no models directory can be found.
    const fs::path dir = fs::temp_directory_path() / ("cera_run_nomodel_" + std::to_string(::getpid()));
    fs::create_directories(dir / "a" / "b");
    const fs::path exe = dir / "a" / "b" / "cera";
    fs::copy_file(cera_bin(), exe, fs::copy_options::overwrite_existing);
    const std::string cmd = "CERA_MODEL_DIR=" + shell_quote(dir.string()) + " " + shell_quote(exe.string()) +
                            " run -p hi 2>&1 >/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string err;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) err.append(buf, n);
    const int status = ::pclose(p);
    fs::remove_all(dir);
    EXPECT_EQ(WEXITSTATUS(status), 1);
    EXPECT_EQ(lines(err), 1u) << err;
    EXPECT_NE(err.find("tiny-lfm2-Q8_0.gguf"), std::string::npos) << err;
}

TEST(CeraRun, OverlongPromptIsOneLineAndNonZero) {
    std::string prompt;
    for (int i = 0; i < 200; ++i) prompt += "the little dog ran ";
    const Result r = run("-m " + shell_quote(kModel) + " -p " + shell_quote(prompt) + " --ctx 64 --threads 1");
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

TEST(CeraRun, BadOptionsFail) {
    EXPECT_EQ(run("-m " + shell_quote(kModel)).code, 2);  // no prompt
    const Result dev = run("-m " + shell_quote(kModel) + " -p hi --device tpu");
    EXPECT_EQ(dev.code, 1);
    EXPECT_EQ(lines(dev.err), 1u) << dev.err;
    const Result pen = run("-m " + shell_quote(kModel) + " -p hi --repeat-penalty 0");
    EXPECT_EQ(pen.code, 1);
    EXPECT_EQ(lines(pen.err), 1u) << pen.err;
}

}  // namespace

namespace {

// `cera bench --json` on the bundled model: the tests it ran, consistent statistics, and the
// roofline arithmetic from a given bandwidth.
TEST(CeraBench, JsonReportIsConsistent) {
    const std::string cmd = shell_quote(cera_bin()) + " bench -m " + shell_quote(kModel) +
                            " -p 32 -n 8 -r 3 --threads 1 --bandwidth 20 --json 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    const auto j = nlohmann::json::parse(out);
    ASSERT_EQ(j["tests"].size(), 2u);
    EXPECT_EQ(j["tests"][0]["name"], "pp32");
    EXPECT_EQ(j["tests"][1]["name"], "tg8");
    for (const auto& t : j["tests"]) {
        EXPECT_EQ(t["samples"].size(), 3u);
        const double med = t["tokens_per_second"]["median"], p10 = t["tokens_per_second"]["p10"],
                     p90 = t["tokens_per_second"]["p90"];
        EXPECT_GT(p10, 0.0);
        EXPECT_LE(p10, med);
        EXPECT_LE(med, p90);
        std::vector<double> s = t["samples"].get<std::vector<double>>();
        std::sort(s.begin(), s.end());
        EXPECT_DOUBLE_EQ(med, s[1]);
    }
    const double bytes = j["decode_bytes_per_token"];
    auto engine = cera::Engine::load(kModel, {.device = "cpu", .threads = 1});
    EXPECT_EQ(bytes, double(engine->info().decode_bytes_per_token));
    EXPECT_FALSE(j["bandwidth_measured"].get<bool>());
    EXPECT_NEAR(j["decode_roofline_tokens_per_second"].get<double>(), 20e9 / bytes, 1e-6 * 20e9 / bytes);
    EXPECT_NEAR(j["decode_roofline_fraction"].get<double>(),
                j["tests"][1]["tokens_per_second"]["median"].get<double>() / (20e9 / bytes), 1e-9);
    EXPECT_GT(j["peak_rss_bytes"].get<double>(), bytes);
}

// `cera bench -d N`: the tests start from N tokens of context and say so in their names; a depth the
// negative depth is refused with a one-line error naming the flag.
TEST(CeraBench, DepthNamesTheTestsAndIsChecked) {
    auto run = [](const std::string& flags, std::string& out) {
        const std::string cmd = shell_quote(cera_bin()) + " bench -m " + shell_quote(kModel) + " " + flags + " 2>&1";
        FILE* p = ::popen(cmd.c_str(), "r");
        if (!p) return -1;
        char buf[4096];
        size_t n;
        out.clear();
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        return WEXITSTATUS(::pclose(p));
    };
    std::string out;
    ASSERT_EQ(run("-p 16 -n 4 -d 40 -r 1 --threads 1 --bandwidth 20 --json", out), 0) << out;
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    ASSERT_EQ(j["tests"].size(), 2u);
    EXPECT_EQ(j["tests"][0]["name"], "pp16 @ d40");
    EXPECT_EQ(j["tests"][1]["name"], "tg4 @ d40");
    EXPECT_EQ(j["tests"][1]["depth"], 40);
    EXPECT_GT(j["tests"][1]["tokens_per_second"]["median"].get<double>(), 0.0);
    EXPECT_NE(run("-p 0 -n 4 -d -3 -r 1 --threads 1", out), 0);
    EXPECT_NE(out.find("-d"), std::string::npos) << out;
}

}  // namespace
