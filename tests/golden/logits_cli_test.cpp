// `cera logits` end to end: text through the model's tokenizer and the model, raw f32 logits at
// every position compared with the transformers reference; --tokens gives the same bytes; the
// shared engine flags (--device cpu, and cuda where a GPU is present) reach the model; bad input
// exits non-zero with one line on stderr.
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

size_t lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

// The reference run of a device: tiny-lfm2 prompt 0 as token ids, every position, raw f32.
struct DeviceRun {
    cera::test::ShellResult r;
    std::vector<float> logits, ref;
};
DeviceRun run_on(const std::string& device_flags, const std::string& tag) {
    const std::string dir = cera::test::data_path("fixtures/tiny-lfm2");
    nlohmann::json pj = nlohmann::json::parse(cera::test::read_text(dir + "/ref/prompt_0.json"));
    std::string id_list;
    for (int32_t id : pj["ids"].get<std::vector<int32_t>>()) id_list += std::to_string(id) + " ";
    const std::string out = std::string(CERA_BINARY_DIR) + "/logits_cli_test_" + tag + ".f32";
    std::remove(out.c_str());
    DeviceRun d;
    d.r = cera::test::run_shell(bin() + " logits -m " + dir + "/model.gguf --tokens " + quote(id_list) +
                                " --all --threads 1 " + device_flags + " --out " + out);
    if (d.r.code == 0) d.logits = cera::test::read_f32(out);
    d.ref = cera::test::read_f32(dir + "/ref/logits_0.f32");
    return d;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

TEST(LogitsCli, DeviceCpuIsTheDefault) {
    const DeviceRun cpu = run_on("--device cpu", "cpu");
    ASSERT_EQ(cpu.r.code, 0) << cpu.r.err;
    ASSERT_EQ(cpu.logits.size(), cpu.ref.size());
    EXPECT_LT(max_diff(cpu.logits, cpu.ref), 1e-2);
    const DeviceRun def = run_on("", "default");
    ASSERT_EQ(def.r.code, 0) << def.r.err;
    EXPECT_EQ(def.logits, cpu.logits);
    // The other engine flags are taken too.
    const DeviceRun f16 = run_on("--device cpu --kv-type f16 --batch 3 --ctx 64", "f16");
    ASSERT_EQ(f16.r.code, 0) << f16.r.err;
    ASSERT_EQ(f16.logits.size(), cpu.ref.size());
    EXPECT_LT(max_diff(f16.logits, cpu.ref), 1e-1);
}

TEST(LogitsCli, CudaMatchesReference) {
    const DeviceRun gpu = run_on("--device cuda", "cuda");
    if (gpu.r.code != 0 && gpu.r.err.find("no CUDA device") != std::string::npos)
        GTEST_SKIP() << gpu.r.err;
    ASSERT_EQ(gpu.r.code, 0) << gpu.r.err;
    ASSERT_EQ(gpu.logits.size(), gpu.ref.size());
    const double d = max_diff(gpu.logits, gpu.ref);
    std::printf("[ cli    ] cera logits --device cuda on tiny-lfm2 prompt 0: max |dlogit| = %.3g\n", d);
    EXPECT_LT(d, 1e-2);
}

TEST(LogitsCli, BadEngineFlagsAreOneLine) {
    const std::string model = cera::test::data_path("fixtures/tiny-lfm2/model.gguf");
    const std::string cmd = bin() + " logits -m " + model + " --tokens 1 ";
    for (const char* flags :
         {"--device tpu", "--device cuda:x", "--kv-type q8", "--batch 0", "--threads -1", "--ctx -5"}) {
        SCOPED_TRACE(flags);
        const cera::test::ShellResult r = cera::test::run_shell(cmd + flags);
        EXPECT_EQ(r.code, 1);
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(lines(r.err), 1u) << r.err;
        EXPECT_EQ(r.err.rfind("cera logits: error: ", 0), 0u) << r.err;
    }
    const cera::test::ShellResult dev = cera::test::run_shell(cmd + "--device tpu");
    EXPECT_NE(dev.err.find("tpu"), std::string::npos) << dev.err;
}

}  // namespace
