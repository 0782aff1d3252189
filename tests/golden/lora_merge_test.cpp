// `cera convert --lora-merge` (tools/quantize/lora_merge.h): adapters folded into the base weights give the
// transformers + peft float64 references of fixtures/<model>/lora/ (both formats, both scales, two adapters
// summed); adapted weights keep their type and every other tensor its bytes; a quantized base merges to what
// the runtime adapter gives on it, within the requantization's noise; a bad adapter leaves no file.
#include "quantize/lora_merge.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "models/lora.h"
#include "models/model.h"
#include "quantize/quantize.h"
#include "test_util.h"

namespace cera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& model) { return test::data_path("fixtures/" + model); }

std::unique_ptr<Model> load(const std::string& path) {
    ModelOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    return load_model(path, o);
}

std::vector<float> logits_of(Model& model, const std::string& name, const LoraSet& lora = {}) {
    const auto ids = json::parse(test::read_text(fixture(name) + "/ref/prompt_0.json"))["ids"].get<std::vector<int32_t>>();
    std::vector<float> out(ids.size() * size_t(model.info().n_vocab));
    auto st = model.create_state();
    st->set_lora(lora);
    st->eval({.tokens = ids, .all_logits = true, .logits = out.data()});
    return out;
}

class LoraMerge : public ::testing::Test {
 protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("cera_lora_merge_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string merge(const std::string& base, std::vector<quantize::LoraMergeInput> adapters, int threads = 2) {
        quantize::LoraMergeOptions o;
        o.base = base;
        o.output = (dir_ / ("merged" + std::to_string(n_++) + ".gguf")).string();
        o.adapters = std::move(adapters);
        o.n_threads = threads;
        const quantize::LoraMergeSummary s = quantize::merge_lora(o);
        EXPECT_GT(s.n_merged, 0u);
        return o.output;
    }
    fs::path dir_;
    int n_ = 0;
};

TEST_F(LoraMerge, MergedModelsMatchFloat64References) {
    struct Case {
        std::vector<std::pair<const char*, float>> adapters;
        const char* ref;
    };
    const std::vector<Case> cases = {
        {{{"lora.gguf", 1.0f}}, "logits_0.f32"},
        {{{"peft", 1.0f}}, "logits_0.f32"},
        {{{"lora.gguf", 0.5f}}, "logits_0_s05.f32"},
        {{{"peft", 0.5f}}, "logits_0_s05.f32"},
        {{{"lora.gguf", 0.5f}, {"peft", 0.5f}}, "logits_0.f32"},  // two adapters add their deltas
    };
    for (const char* m : {"tiny-lfm2", "tiny-qwen3"}) {
        auto base_file = gguf::File::open(fixture(m) + "/model.gguf");
        for (const Case& c : cases) {
            std::vector<quantize::LoraMergeInput> in;
            std::string what;
            for (const auto& [a, s] : c.adapters) {
                in.push_back({fixture(m) + "/lora/" + a, s});
                what += std::string(a) + ":" + std::to_string(s).substr(0, 3) + " ";
            }
            const std::string out = merge(fixture(m) + "/model.gguf", in);
            auto merged = load(out);
            const double d = test::max_abs_diff(logits_of(*merged, m), test::read_f32(fixture(m) + "/lora/" + c.ref));
            std::printf("[ merge ] %-10s %s: max |dlogit| vs reference = %.3g\n", m, what.c_str(), d);
            EXPECT_LT(d, 1e-2) << m << " " << what;
            // Same tensors, same types; the tensors no adapter touches keep their bytes.
            auto f = gguf::File::open(out);
            const std::vector<LoraTensor> pairs = read_lora(in[0].path, *base_file);
            ASSERT_EQ(f->tensors().size(), base_file->tensors().size());
            for (const auto& t : base_file->tensors()) {
                const gguf::TensorInfo* o = f->find_tensor(t.name);
                ASSERT_NE(o, nullptr) << t.name;
                EXPECT_EQ(o->type, t.type) << t.name;
                EXPECT_EQ(o->ne, t.ne) << t.name;
                const bool adapted = std::any_of(pairs.begin(), pairs.end(),
                                                 [&](const LoraTensor& p) { return p.target == t.name; });
                EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes) == 0, !adapted) << t.name;
            }
        }
    }
}

// A quantized base (the fixture quantized to Q8_0 here): adapted weights are requantized to their type, so
// the merged model gives what the runtime adapter gives on that base up to one more rounding of those
// weights (4% of the adapter's own effect on the logits when measured; the bound is 10%).
TEST_F(LoraMerge, QuantizedBaseKeepsItsTypes) {
    const std::string m = "tiny-lfm2";
    quantize::QuantizeOptions q;
    q.input = fixture(m) + "/model.gguf";
    q.output = (dir_ / "q8_0.gguf").string();
    q.file_type = quantize::FileType::kQ8_0;
    quantize::quantize_model(q);
    const std::string base = q.output;
    const std::string adapter = fixture(m) + "/lora/lora.gguf";
    const std::string out = merge(base, {{adapter, 1.0f}});
    auto f = gguf::File::open(out);
    auto b = gguf::File::open(base);
    for (const auto& t : b->tensors()) EXPECT_EQ(f->find_tensor(t.name)->type, t.type) << t.name;
    auto base_model = load(base);
    const auto runtime = logits_of(*base_model, m, {{load_lora(adapter, *base_model), 1.0f}});
    const auto plain = logits_of(*base_model, m);
    auto merged = load(out);
    const double d = test::max_abs_diff(logits_of(*merged, m), runtime), effect = test::max_abs_diff(plain, runtime);
    std::printf("[ merge ] Q8_0 base: merged vs runtime adapter %.3g, the adapter's effect %.3g\n", d, effect);
    EXPECT_LT(d, 0.1 * effect);
}

TEST_F(LoraMerge, BytesDoNotDependOnThreads) {
    const std::string base = fixture("tiny-qwen3") + "/model.gguf";
    const std::vector<quantize::LoraMergeInput> in = {{fixture("tiny-qwen3") + "/lora/peft", 0.7f}};
    EXPECT_EQ(test::read_text(merge(base, in, 1)), test::read_text(merge(base, in, 3)));
}

TEST_F(LoraMerge, BadAdaptersLeaveNoFile) {
    quantize::LoraMergeOptions o;
    o.base = fixture("tiny-lfm2") + "/model.gguf";
    o.output = (dir_ / "bad.gguf").string();
    for (const std::string& a : {fixture("tiny-qwen3") + "/lora/lora.gguf", fixture("tiny-qwen3") + "/lora/peft",
                                 fixture("tiny-lfm2") + "/model.gguf", fixture("tiny-lfm2") + "/no-such-adapter"}) {
        o.adapters = {{a, 1.0f}};
        try {
            quantize::merge_lora(o);
            ADD_FAILURE() << "merged " << a;
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
        }
        EXPECT_FALSE(fs::exists(o.output)) << a;
        EXPECT_FALSE(fs::exists(o.output + ".tmp")) << a;
    }
    o.adapters.clear();
    EXPECT_THROW(quantize::merge_lora(o), Error);
}

// The command line: `cera convert --lora-merge` writes what merge_lora writes; a bad call is one line.
TEST_F(LoraMerge, CommandLine) {
    const std::string m = fixture("tiny-lfm2");
    const std::string out = (dir_ / "cli.gguf").string();
    const std::string cmd = test::shell_quote(test::cera_bin()) + " convert --lora-merge -m " +
                            test::shell_quote(m + "/model.gguf") + " --lora " + test::shell_quote(m + "/lora/peft:0.5");
    const auto r = test::run_shell(cmd + " -o " + test::shell_quote(out));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(test::read_text(out), test::read_text(merge(m + "/model.gguf", {{m + "/lora/peft", 0.5f}})));
    for (const std::string& bad : {cmd, cmd + " --hf x -o y.gguf",
                                   test::shell_quote(test::cera_bin()) + " convert --hf x --lora a -o y.gguf",
                                   cmd + " --lora " + test::shell_quote(m + "/lora/peft:nan") + " -o y.gguf"}) {
        const auto b = test::run_shell(bad);
        EXPECT_NE(b.code, 0) << bad;
        EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << bad << ": " << b.err;
    }
}

}  // namespace
}  // namespace cera
