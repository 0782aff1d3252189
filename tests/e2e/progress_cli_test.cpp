// Progress of long work on stderr: `cera quantize` and `cera convert` print a plain line at each tenth
// when stderr is not a terminal (monotonic, ending at 100%), and redraw one bar in place on a terminal
// (run under script(1), which gives the command a pseudo-terminal); `perplexity`, `bench` and `imatrix`
// count their windows, runs and chunks the same way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

using cera::test::cera_bin;
using cera::test::data_path;
using cera::test::shell_quote;

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("cera_progress_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

// The plain progress lines of `label` in err: their percentages, in order; fails on a malformed one.
std::vector<int> plain_lines(const std::string& err, const std::string& label) {
    const std::regex line("^" + label + R"(: (\d+)% \((\d+\.\d)/(\d+\.\d) MiB, \d+\.\d s\)$)");
    std::vector<int> pct;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) {
        if (l.rfind(label + ":", 0) != 0) continue;
        std::smatch m;
        EXPECT_TRUE(std::regex_match(l, m, line)) << l;
        if (m.empty()) continue;
        pct.push_back(std::stoi(m[1]));
        EXPECT_LE(std::stod(m[2]), std::stod(m[3])) << l;
    }
    return pct;
}

void expect_tenths(const std::vector<int>& pct) {
    ASSERT_FALSE(pct.empty());
    EXPECT_LE(pct.size(), 11u);
    for (size_t i = 0; i < pct.size(); ++i) {
        EXPECT_EQ(pct[i] % 10, 0) << pct[i];
        if (i > 0) EXPECT_GT(pct[i], pct[i - 1]);
    }
    EXPECT_EQ(pct.back(), 100);
}

TEST(ProgressCli, QuantizePrintsTenthsWhenNotATerminal) {
    const std::string out = temp_path("q8.gguf");
    const auto r = cera::test::run_shell(shell_quote(cera_bin()) + " quantize " +
                                         shell_quote(data_path("fixtures/tiny-lfm2/model.gguf")) + " " +
                                         shell_quote(out) + " Q8_0");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("wrote "), std::string::npos) << r.out;  // the summary stays on stdout
    expect_tenths(plain_lines(r.err, "quantize"));
    EXPECT_EQ(r.err.find('\r'), std::string::npos);
    std::filesystem::remove(out);
}

TEST(ProgressCli, ConvertPrintsTenthsWhenNotATerminal) {
    const std::string out = temp_path("conv.gguf");
    const auto r = cera::test::run_shell(shell_quote(cera_bin()) + " convert --hf " +
                                         shell_quote(data_path("fixtures/tiny-qwen3/hf")) + " -o " + shell_quote(out));
    ASSERT_EQ(r.code, 0) << r.err;
    expect_tenths(plain_lines(r.err, "convert"));
    std::filesystem::remove(out);
}

// Plain lines of work counted in units (windows, runs, chunks): increasing, ending at all of them.
void expect_counted(const std::string& err, const std::string& label, const std::string& unit, int total) {
    const std::regex line("^" + label + R"(: (\d+)% \((\d+)/(\d+) )" + unit + R"(, \d+\.\d s\)$)");
    std::vector<int> pct, done;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) {
        if (l.rfind(label + ": ", 0) != 0 || l.find('%') == std::string::npos) continue;
        std::smatch m;
        EXPECT_TRUE(std::regex_match(l, m, line)) << l;
        if (m.empty()) continue;
        pct.push_back(std::stoi(m[1]));
        done.push_back(std::stoi(m[2]));
        EXPECT_EQ(std::stoi(m[3]), total) << l;
    }
    ASSERT_FALSE(done.empty()) << err;
    for (size_t i = 1; i < done.size(); ++i) EXPECT_GT(done[i], done[i - 1]);
    EXPECT_EQ(done.back(), total);
    EXPECT_EQ(pct.back(), 100);
}

TEST(ProgressCli, PerplexityBenchAndImatrixCountTheirWork) {
    const std::string model = shell_quote(data_path("fixtures/tiny-lfm2/model.gguf"));
    const std::string text = temp_path("text.txt"), im = temp_path("im.gguf");
    {
        std::ofstream f(text);
        for (int i = 0; i < 200; ++i) f << "Once upon a time there was a little girl who liked to play in the park. ";
    }
    auto r = cera::test::run_shell(shell_quote(cera_bin()) + " perplexity -m " + model + " -f " + shell_quote(text) +
                                   " -c 64 --chunks 12");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("[12]"), std::string::npos) << r.out;  // the per-window figures stay on stdout
    expect_counted(r.err, "perplexity", "windows", 12);
    r = cera::test::run_shell(shell_quote(cera_bin()) + " bench -m " + model + " -p 32 -n 8 -r 2");
    ASSERT_EQ(r.code, 0) << r.err;
    expect_counted(r.err, "bench", "runs", 6);  // two tests, each a warm-up and two repetitions
    r = cera::test::run_shell(shell_quote(cera_bin()) + " imatrix -m " + model + " -f " + shell_quote(text) +
                              " -c 64 --chunks 5 -o " + shell_quote(im));
    ASSERT_EQ(r.code, 0) << r.err;
    expect_counted(r.err, "imatrix", "chunks", 5);
    std::filesystem::remove(text);
    std::filesystem::remove(im);
}

TEST(ProgressCli, QuantizeRedrawsOneBarOnATerminal) {
    if (cera::test::run_shell("command -v script >/dev/null").code != 0) GTEST_SKIP() << "no script(1)";
    const std::string out = temp_path("q4.gguf");
    const std::string cmd = shell_quote(cera_bin()) + " quantize " +
                            shell_quote(data_path("fixtures/tiny-lfm2/model.gguf")) + " " + shell_quote(out) + " Q4_0";
    const auto r = cera::test::run_shell("script -qec " + shell_quote(cmd) + " /dev/null");
    ASSERT_EQ(r.code, 0) << r.out;
    // Every drawing starts at the line's start and clears what is left of it; the last one is full and
    // ends its line before the summary.
    EXPECT_NE(r.out.find("\rquantize ["), std::string::npos) << r.out;
    const size_t last = r.out.rfind("\rquantize [");
    const size_t end = r.out.find('\n', last);
    ASSERT_NE(end, std::string::npos);
    const std::string bar = r.out.substr(last + 1, end - last - 1);
    EXPECT_NE(bar.find("[==============================] 100% "), std::string::npos) << bar;
    EXPECT_NE(bar.find("\x1b[K"), std::string::npos) << bar;
    EXPECT_EQ(r.out.find("quantize: "), std::string::npos) << "plain lines on a terminal";
    EXPECT_NE(r.out.find("wrote ", end), std::string::npos) << r.out;
    std::filesystem::remove(out);
}

}  // namespace
