// Every command that runs a model (run, chat, embed, logits, bench) takes the same engine flags
// (src/cli/engine_flags.h): each lists them in its help, runs on the CPU with --device cpu, and
// turns a bad --device or --lora into one stderr line and exit 1.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace {

using cera::test::cera_bin;
using cera::test::shell_quote;
using Result = cera::test::ShellResult;

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");

// A command with the arguments that make it run (a prompt, no output files), stdin closed.
struct Cmd {
    const char* name;
    const char* args;
};
const Cmd kCommands[] = {
    {"run", "-p hi -n 2 --temp 0"},
    {"chat", "-n 2 --temp 0"},
    {"embed", "-p hi"},
    {"logits", "--tokens '1 2 3'"},
    {"bench", "-p 4 -n 2 -r 1 --bandwidth 10"},
};

Result cera(const Cmd& c, const std::string& extra) {
    return cera::test::run_shell(shell_quote(cera_bin()) + " " + c.name + " -m " + shell_quote(kModel) + " " +
                                 c.args + " " + extra + " </dev/null");
}

size_t lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

TEST(EngineFlags, EveryModelCommandListsThem) {
    for (const Cmd& c : kCommands) {
        SCOPED_TRACE(c.name);
        const Result r = cera::test::run_shell(shell_quote(cera_bin()) + " " + c.name + " --help");
        EXPECT_EQ(r.code, 0) << r.err;
        for (const char* flag : {"--device", "--threads", "--kv-type", "--batch", "--lora"})
            EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
    }
}

TEST(EngineFlags, DeviceCpuRuns) {
    for (const Cmd& c : kCommands) {
        SCOPED_TRACE(c.name);
        const Result r = cera(c, "--device cpu --threads 1");
        EXPECT_EQ(r.code, 0) << r.err;
    }
}

TEST(EngineFlags, BadDeviceIsOneLineAndNonZero) {
    for (const Cmd& c : kCommands) {
        for (const char* device : {"tpu", "cuda:x"}) {
            SCOPED_TRACE(std::string(c.name) + " --device " + device);
            const Result r = cera(c, std::string("--threads 1 --device ") + device);
            EXPECT_EQ(r.code, 1);
            EXPECT_EQ(lines(r.err), 1u) << r.err;
            EXPECT_EQ(r.err.rfind(std::string("cera ") + c.name + ": error: ", 0), 0u) << r.err;
            EXPECT_NE(r.err.find(device), std::string::npos) << r.err;
        }
    }
}

TEST(EngineFlags, BadLoraIsOneLineAndNonZero) {
    for (const Cmd& c : kCommands) {
        SCOPED_TRACE(c.name);
        const Result r = cera(c, "--device cpu --threads 1 --lora /no/such/adapter.gguf:0.5");
        EXPECT_EQ(r.code, 1);
        EXPECT_EQ(lines(r.err), 1u) << r.err;
        EXPECT_EQ(r.err.rfind(std::string("cera ") + c.name + ": error: ", 0), 0u) << r.err;
        EXPECT_NE(r.err.find("/no/such/adapter.gguf"), std::string::npos) << r.err;
    }
}

}  // namespace
