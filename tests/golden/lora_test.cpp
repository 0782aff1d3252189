// LoRA adapters on the model layer (models/lora.h), on the CPU and on CUDA (where a device is present), against
// transformers + peft float64 references (fixtures/<model>/lora/): logits of prompt 0 with the adapter at scale 1 and
// 0.5, from the PEFT folder and from llama.cpp's GGUF conversion of it; the greedy continuation; two adapters at once
// adding their deltas; a batch mixing base and adapter sequences giving each what it gives alone; an adapter for
// another model refused with the tensor and both shapes named.
#include "models/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "backends/device.h"
#include "cera/error.h"
#include "lora_batch.h"
#include "models/model.h"
#include "test_devices.h"
#include "test_util.h"

namespace cera {
namespace {

using nlohmann::json;

std::string fixture(const std::string& model) { return test::data_path("fixtures/" + model); }

// Skips the calling test when it asks for CUDA and no device is there.
#define SKIP_WITHOUT(device)                                             \
    do {                                                                 \
        std::string why;                                                 \
        if ((device) == DeviceKind::kCuda && cuda_devices(&why).empty()) \
            GTEST_SKIP() << "no CUDA device (" << why << ")";            \
    } while (0)

std::unique_ptr<Model> load(const std::string& name, DeviceKind device = DeviceKind::kCpu) {
    ModelOptions o;
    o.device = device;
    o.n_threads = 2;
    o.n_ctx = 128;
    return load_model(fixture(name) + "/model.gguf", o);
}

std::vector<int32_t> prompt0(const std::string& model) {
    return json::parse(test::read_text(fixture(model) + "/ref/prompt_0.json"))["ids"].get<std::vector<int32_t>>();
}

std::vector<float> all_logits(ModelState& st, const std::vector<int32_t>& ids, int64_t n_vocab) {
    std::vector<float> out(ids.size() * size_t(n_vocab));
    st.eval({.tokens = ids, .all_logits = true, .logits = out.data()});
    return out;
}

struct Case {
    const char* model;
    const char* adapter;  // under fixtures/<model>/lora/
    float scale;
    const char* ref;  // the reference logits
};

class LoraLogits : public ::testing::TestWithParam<std::tuple<Case, DeviceKind>> {};

TEST_P(LoraLogits, MatchFloat64Reference) {
    const auto [c, device] = GetParam();
    SKIP_WITHOUT(device);
    auto model = load(c.model, device);
    const int64_t n_vocab = model->info().n_vocab;
    auto st = model->create_state();
    const auto adapter = load_lora(fixture(c.model) + "/lora/" + c.adapter, *model);
    st->set_lora({{adapter, c.scale}});
    const std::vector<float> got = all_logits(*st, prompt0(c.model), n_vocab);
    const std::vector<float> ref = test::read_f32(fixture(c.model) + "/lora/" + c.ref);
    const double d = test::max_abs_diff(got, ref);
    std::printf("[ lora ] %-4s %-10s %-9s scale %.1f: max |dlogit| = %.3g\n", device_kind_name(device), c.model,
                c.adapter, c.scale, d);
    EXPECT_LT(d, 1e-2);
    // And the adapter makes a difference the test can see.
    st->set_lora({});
    st->reset();
    EXPECT_GT(test::max_abs_diff(all_logits(*st, prompt0(c.model), n_vocab), ref), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraLogits,
                         ::testing::Combine(::testing::Values(Case{"tiny-lfm2", "lora.gguf", 1.0f, "logits_0.f32"},
                                                              Case{"tiny-lfm2", "lora.gguf", 0.5f, "logits_0_s05.f32"},
                                                              Case{"tiny-lfm2", "peft", 1.0f, "logits_0.f32"},
                                                              Case{"tiny-lfm2", "peft", 0.5f, "logits_0_s05.f32"},
                                                              Case{"tiny-qwen3", "lora.gguf", 1.0f, "logits_0.f32"},
                                                              Case{"tiny-qwen3", "lora.gguf", 0.5f, "logits_0_s05.f32"},
                                                              Case{"tiny-qwen3", "peft", 1.0f, "logits_0.f32"},
                                                              Case{"tiny-qwen3", "peft", 0.5f, "logits_0_s05.f32"}),
                                            ::testing::ValuesIn(test::devices())));

class LoraModel : public ::testing::TestWithParam<std::tuple<const char*, DeviceKind>> {};

TEST_P(LoraModel, GreedyContinuationMatchesReference) {
    const auto [name, device] = GetParam();
    SKIP_WITHOUT(device);
    const std::string m = name;
    auto model = load(m, device);
    const int64_t n_vocab = model->info().n_vocab;
    const json g = json::parse(test::read_text(fixture(m) + "/lora/greedy_0.json"));
    const auto want = g["generated_ids"].get<std::vector<int32_t>>();
    for (const char* file : {"lora.gguf", "peft"}) {
        auto st = model->create_state();
        st->set_lora({{load_lora(fixture(m) + "/lora/" + file, *model), 1.0f}});
        std::vector<float> logits(static_cast<size_t>(n_vocab));
        const std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
        st->eval({.tokens = prompt, .logits = logits.data()});
        size_t match = 0;
        for (int32_t ref : want) {
            const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
            if (id != ref) break;
            ++match;
            st->eval({.tokens = {&id, 1}, .logits = logits.data()});
        }
        std::printf("[ lora ] %-10s %-9s greedy: %zu/%zu tokens equal\n", m.c_str(), file, match, want.size());
        if (match < want.size()) {
            // A divergence is acceptable only where the reference's top two were nearly tied.
            EXPECT_LT(g["steps"][match]["margin_top1_top2"].get<double>(), 5e-3) << file << " step " << match;
        }
    }
}

// The deltas of two adapters add: the adapter twice at scale 0.5 (once from each format) is the
// adapter at scale 1, whose reference is independent of this code.
TEST_P(LoraModel, TwoAdaptersAddTheirDeltas) {
    const auto [name, device] = GetParam();
    SKIP_WITHOUT(device);
    const std::string m = name;
    auto model = load(m, device);
    const int64_t n_vocab = model->info().n_vocab;
    auto st = model->create_state();
    const auto a1 = load_lora(fixture(m) + "/lora/lora.gguf", *model);
    const auto a2 = load_lora(fixture(m) + "/lora/peft", *model);
    st->set_lora({{a1, 0.5f}, {a2, 0.5f}});
    const double d = test::max_abs_diff(all_logits(*st, prompt0(m), n_vocab), test::read_f32(fixture(m) + "/lora/logits_0.f32"));
    std::printf("[ lora ] %-10s two adapters at 0.5: max |dlogit| vs the adapter at 1.0 = %.3g\n", m.c_str(), d);
    EXPECT_LT(d, 1e-2);
}

// Base and adapter sequences in one batch: each sequence's logits (prompt, then decode steps) equal
// those of the sequence alone: bit for bit on the CPU, whose kernels reduce each row alike whatever the
// batch; within 1e-4 on CUDA, where a batch of rows takes other matrix kernels (tensor-core tiles) than
// one row does, and so sums in another order.
TEST_P(LoraModel, MixedBatchMatchesEachAlone) {
    const auto [name, device] = GetParam();
    SKIP_WITHOUT(device);
    const std::string m = name;
    auto model = load(m, device);
    const auto a1 = load_lora(fixture(m) + "/lora/lora.gguf", *model);
    const auto a2 = load_lora(fixture(m) + "/lora/peft", *model);
    const std::vector<LoraSet> sets = {{}, {{a1, 1.0f}}, {{a2, 0.5f}}, {{a1, 0.5f}, {a2, 0.25f}}, {{a1, 1.0f}}};
    const std::vector<int32_t> decode = {5, 77, 300, 12};
    const test::MixedBatchLogits r = test::mixed_batch_logits(*model, sets, prompt0(m), decode);
    for (size_t i = 0; i < sets.size(); ++i)
        for (size_t step = 0; step <= decode.size(); ++step)
            EXPECT_LE(test::max_abs_diff(r.batched[i][step], r.alone[i][step]),
                      device == DeviceKind::kCuda ? 1e-4 : 0.0)
                << m << " sequence " << i << " step " << step;
}

// Decode steps are recorded and replayed per adapter grouping (CUDA graphs): a session that switches its
// adapters between single-token steps gets, step for step, what multi-token evaluations (never recorded)
// of the same tokens under the same adapters give.
TEST_P(LoraModel, SwitchingAdaptersBetweenDecodeSteps) {
    const auto [name, device] = GetParam();
    SKIP_WITHOUT(device);
    const std::string m = name;
    auto model = load(m, device);
    const int64_t n_vocab = model->info().n_vocab;
    const auto a1 = load_lora(fixture(m) + "/lora/lora.gguf", *model);
    const auto a2 = load_lora(fixture(m) + "/lora/peft", *model);
    const std::vector<LoraSet> phases = {{{a1, 1.0f}}, {{a2, 0.5f}}, {}, {{a1, 1.0f}}, {{a1, 0.5f}, {a2, 1.0f}}};
    const std::vector<int32_t> p = prompt0(m);
    const std::vector<int32_t> toks = {5, 77, 300, 12, 9, 41, 250, 3};  // each phase decodes all of them
    auto one = model->create_state();
    auto chunked = model->create_state();
    std::vector<float> got(static_cast<size_t>(n_vocab));
    for (auto* st : {one.get(), chunked.get()}) st->eval({.tokens = p, .logits = got.data()});
    double worst = 0;
    for (size_t ph = 0; ph < phases.size(); ++ph) {
        one->set_lora(phases[ph]);
        chunked->set_lora(phases[ph]);
        std::vector<float> want(toks.size() * size_t(n_vocab));
        chunked->eval({.tokens = toks, .all_logits = true, .logits = want.data()});
        for (size_t i = 0; i < toks.size(); ++i) {
            one->eval({.tokens = {&toks[i], 1}, .logits = got.data()});
            const std::vector<float> w(want.begin() + int64_t(i) * n_vocab, want.begin() + int64_t(i + 1) * n_vocab);
            const double d = test::max_abs_diff(got, w);
            worst = std::max(worst, d);
            EXPECT_LT(d, 1e-3) << m << " phase " << ph << " token " << i;
        }
    }
    std::printf("[ lora ] %-4s %-10s adapters switched between decode steps: max |dlogit| = %.3g\n",
                device_kind_name(device), m.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraModel,
                         ::testing::Combine(::testing::Values("tiny-lfm2", "tiny-qwen3"),
                                            ::testing::ValuesIn(test::devices())));

// An adapter made for another model: a one-line error naming the tensor and both shapes.
TEST(LoraLoad, AnotherModelIsRefusedWithTensorAndShapes) {
    auto qwen2 = load("tiny-qwen2-random");
    try {
        load_lora(fixture("tiny-qwen3") + "/lora/peft", *qwen2);
        FAIL() << "loaded a tiny-qwen3 adapter into tiny-qwen2-random";
    } catch (const Error& e) {
        const std::string msg = e.what();
        std::printf("[ lora ] %s\n", msg.c_str());
        EXPECT_NE(msg.find("blk.0."), std::string::npos) << msg;
        EXPECT_NE(msg.find("has ne {"), std::string::npos) << msg;
        EXPECT_NE(msg.find("the base"), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    auto lfm2 = load("tiny-lfm2");
    try {
        load_lora(fixture("tiny-qwen3") + "/lora/lora.gguf", *lfm2);
        FAIL() << "loaded a qwen3 GGUF adapter into an lfm2 model";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("qwen3"), std::string::npos) << e.what();
    }
    // Not an adapter at all.
    EXPECT_THROW(load_lora(fixture("tiny-lfm2") + "/model.gguf", *lfm2), Error);
    EXPECT_THROW(load_lora(fixture("tiny-lfm2") + "/no-such-adapter", *lfm2), Error);
}

}  // namespace
}  // namespace cera
