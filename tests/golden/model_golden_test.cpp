// Golden tests of the model layer on the fixture models: F32 logits at every
// prompt position against the float64 transformers references, 32-token greedy
// continuations, the final hidden state, batched vs token-by-token prefill,
// quantized files against llama.cpp's greedy output, and stories260K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

using nlohmann::json;

json read_json(const std::string& path) { return json::parse(test::read_text(path)); }

int32_t argmax(const float* v, int64_t n) {
    return int32_t(std::max_element(v, v + n) - v);  // first maximum: ties go to the lower id
}

std::unique_ptr<Model> load(const std::string& path, int n_batch = 512) {
    ModelOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.n_batch = n_batch;
    return load_model(path, o);
}

// Greedy continuation of n tokens after `prompt`; returns the ids and the logits margins seen.
std::vector<int32_t> greedy(ModelState& st, const std::vector<int32_t>& prompt, int n, int64_t n_vocab) {
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    std::vector<int32_t> out;
    st.eval({.tokens = prompt, .logits = logits.data()});
    for (int i = 0; i < n; ++i) {
        const int32_t id = argmax(logits.data(), n_vocab);
        out.push_back(id);
        if (i + 1 < n) st.eval({.tokens = {&id, 1}, .logits = logits.data()});
    }
    return out;
}

const char* const kF32Models[] = {"tiny-lfm2",         "tiny-lfm2moe",      "tiny-qwen3",
                                  "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"};

class F32Fixture : public ::testing::TestWithParam<const char*> {};

TEST_P(F32Fixture, LogitsAndGreedyMatchReference) {
    const std::string dir = test::data_path(std::string("fixtures/") + GetParam());
    auto model = load(dir + "/model.gguf");
    const int64_t n_vocab = model->info().n_vocab;
    for (int p : {0, 2}) {
        const std::string ps = std::to_string(p);
        json prompt = read_json(dir + "/ref/prompt_" + ps + ".json");
        std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
        std::vector<float> ref = test::read_f32(dir + "/ref/logits_" + ps + ".f32");
        ASSERT_EQ(ref.size(), ids.size() * size_t(n_vocab));

        auto st = model->create_state();
        std::vector<float> got(ref.size());
        st->eval({.tokens = ids, .all_logits = true, .logits = got.data()});
        double max_d = 0;
        size_t argmax_eq = 0;
        for (size_t t = 0; t < ids.size(); ++t) {
            const float* g = got.data() + t * n_vocab;
            const float* r = ref.data() + t * n_vocab;
            for (int64_t v = 0; v < n_vocab; ++v) max_d = std::max(max_d, double(std::fabs(g[v] - r[v])));
            argmax_eq += argmax(g, n_vocab) == argmax(r, n_vocab);
        }
        std::printf("[ logits ] %-20s prompt %d: %zu positions, max |dlogit| = %.3g, argmax equal %zu/%zu\n",
                    GetParam(), p, ids.size(), max_d, argmax_eq, ids.size());
        EXPECT_LT(max_d, 1e-2) << GetParam() << " prompt " << p;

        json gj = read_json(dir + "/ref/greedy_" + ps + ".json");
        std::vector<int32_t> want = gj["generated_ids"].get<std::vector<int32_t>>();
        st->reset();
        std::vector<int32_t> have = greedy(*st, ids, int(want.size()), n_vocab);
        size_t match = 0;
        while (match < want.size() && have[match] == want[match]) ++match;
        std::printf("[ greedy ] %-20s prompt %d: %zu/%zu tokens equal\n", GetParam(), p, match, want.size());
        if (match < want.size()) {
            // Only acceptable at a documented near-tie, with our token the reference's runner-up.
            const json& step = gj["steps"][match];
            const double margin = step["margin_top1_top2"].get<double>();
            EXPECT_LT(margin, 5e-3) << GetParam() << " prompt " << p << " diverges at step " << match;
            EXPECT_EQ(have[match], step["top5_ids"][1].get<int32_t>());
        }
    }
}

TEST_P(F32Fixture, BatchedPrefillEqualsTokenByToken) {
    const std::string dir = test::data_path(std::string("fixtures/") + GetParam());
    json prompt = read_json(dir + "/ref/prompt_2.json");
    std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    auto batched = load(dir + "/model.gguf", 64);  // 184 tokens: chunks of 64, 64, 56
    const int64_t n_vocab = batched->info().n_vocab;
    std::vector<float> a(ids.size() * n_vocab), b(ids.size() * n_vocab);
    batched->create_state()->eval({.tokens = ids, .all_logits = true, .logits = a.data()});
    auto st = batched->create_state();
    for (size_t t = 0; t < ids.size(); ++t) st->eval({.tokens = {&ids[t], 1}, .logits = b.data() + t * n_vocab});
    double max_rel = 0;
    for (size_t i = 0; i < a.size(); ++i)
        max_rel = std::max(max_rel, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
    std::printf("[ batch  ] %-20s batched vs token-by-token: max rel diff %.3g\n", GetParam(), max_rel);
    EXPECT_LT(max_rel, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, F32Fixture, ::testing::ValuesIn(kF32Models), [](const auto& info) {
    std::string s = info.param;
    std::replace(s.begin(), s.end(), '-', '_');
    return s;
});

TEST(Hidden, FinalNormOutputMatchesReference) {
    const std::string dir = test::data_path("fixtures/tiny-lfm2");
    auto model = load(dir + "/model.gguf");
    std::vector<int32_t> ids = read_json(dir + "/ref/prompt_0.json")["ids"].get<std::vector<int32_t>>();
    std::vector<float> ref = test::read_f32(dir + "/ref/hidden_0.f32");
    const int64_t n_embd = model->info().n_embd;
    ASSERT_EQ(ref.size(), ids.size() * n_embd);
    std::vector<float> got(ref.size());
    model->create_state()->eval({.tokens = ids, .all_logits = true, .hidden = got.data()});
    double max_d = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_d = std::max(max_d, double(std::fabs(got[i] - ref[i])));
    std::printf("[ hidden ] tiny-lfm2 prompt 0: max |dh| = %.3g\n", max_d);
    EXPECT_LT(max_d, 1e-3);
}

// Quantized files: the greedy continuation of llama.cpp on the same file, equal up to a near-tie.
struct QuantCase {
    const char* model;
    const char* file;
};

class QuantFixture : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantFixture, GreedyMatchesLlamaCpp) {
    const QuantCase& c = GetParam();
    const std::string dir = test::data_path(std::string("fixtures/") + c.model);
    std::string stem = c.file;
    stem = stem.substr(0, stem.size() - 5);  // drop ".gguf"
    const std::string gguf_path =
        std::string(c.file).rfind("models/", 0) == 0 ? test::source_path(c.file) : dir + "/" + c.file;
    const std::string base = gguf_path.substr(gguf_path.rfind('/') + 1);
    json lj = read_json(dir + "/llamacpp/" +
                        (base == "tiny-lfm2-Q8_0.gguf" ? std::string("model-Q8_0") : base.substr(0, base.size() - 5)) +
                        ".json");
    auto model = load(gguf_path);
    const int64_t n_vocab = model->info().n_vocab;
    const cpu::Isa saved = cpu::active_isa();
    for (cpu::Isa isa : {cpu::Isa::kRef, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
        if (!cpu::isa_supported(isa)) continue;
        cpu::force_isa(isa);
        for (const json& pr : lj["prompts"]) {
            std::vector<int32_t> ids = pr["llamacpp_token_ids"].get<std::vector<int32_t>>();
            std::vector<int32_t> want = pr["llamacpp_greedy_ids"].get<std::vector<int32_t>>();
            auto st = model->create_state();
            std::vector<int32_t> have = greedy(*st, ids, int(want.size()), n_vocab);
            size_t match = 0;
            while (match < want.size() && have[match] == want[match]) ++match;
            std::printf("[ quant  ] %-14s %-22s %-6s prompt %d: %zu/%zu greedy tokens equal llama.cpp\n", c.model,
                        base.c_str(), cpu::isa_name(isa), pr["prompt"].get<int>(), match, want.size());
            if (match < want.size()) {
                const json& top = match == 0 ? pr["llamacpp_top5_last_prompt_position"]
                                             : pr["llamacpp_top5_per_greedy_step"][match - 1];
                const double margin = top[0][1].get<double>() - top[1][1].get<double>();
                std::printf("           diverges at step %zu: llama.cpp margin top1-top2 %.4g, ours %d (theirs %d)\n",
                            match, margin, have[match], want[match]);
                EXPECT_LT(margin, 0.05) << c.file << " prompt " << pr["prompt"] << " step " << match;
                EXPECT_EQ(have[match], top[1][0].get<int32_t>());
            }
        }
    }
    cpu::force_isa(saved);
}

INSTANTIATE_TEST_SUITE_P(Files, QuantFixture,
                         ::testing::Values(QuantCase{"tiny-lfm2", "model-Q4_0.gguf"},
                                           QuantCase{"tiny-lfm2", "model-Q4_K_M.gguf"},
                                           QuantCase{"tiny-lfm2", "models/tiny-lfm2-Q8_0.gguf"},
                                           QuantCase{"tiny-lfm2moe", "model-Q4_K_M.gguf"},
                                           QuantCase{"tiny-qwen3", "model-Q4_0.gguf"}),
                         [](const auto& info) {
                             std::string s = std::string(info.param.model) + "_" + info.param.file;
                             for (char& ch : s)
                                 if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return s;
                         });

TEST(Stories260K, GreedyFromBos) {
    json ej = read_json(test::data_path("models/stories260K/expected_greedy.json"));
    std::vector<int32_t> prompt = ej["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> want = ej["generated_ids"].get<std::vector<int32_t>>();
    auto model = load(test::source_path("models/stories260K.gguf"));
    EXPECT_EQ(model->info().n_ctx_train, 2048);
    auto st = model->create_state();
    const int64_t n_vocab = model->info().n_vocab;
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    st->eval({.tokens = prompt, .logits = logits.data()});
    std::vector<int32_t> have;
    while (have.size() < want.size()) {
        const int32_t id = argmax(logits.data(), n_vocab);
        have.push_back(id);
        if (have.size() < want.size()) st->eval({.tokens = {&id, 1}, .logits = logits.data()});
    }
    size_t match = 0;
    while (match < want.size() && have[match] == want[match]) ++match;
    std::printf("[ story  ] stories260K: %zu/%zu greedy tokens equal\n", match, want.size());
    EXPECT_EQ(have, want);
}

// Every CPU kernel table gives the same greedy tokens on the F32 models (and on the quantized files
// the same tokens as llama.cpp up to a near-tie, checked by QuantFixture under each ISA in CI).
TEST(AllIsas, SameGreedyTokens) {
    const cpu::Isa saved = cpu::active_isa();
    std::vector<cpu::Isa> isas;
    for (cpu::Isa isa : {cpu::Isa::kRef, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx})
        if (cpu::isa_supported(isa)) isas.push_back(isa);
    for (const char* m : kF32Models) {
        const std::string dir = test::data_path(std::string("fixtures/") + m);
        auto model = load(dir + "/model.gguf");
        std::vector<int32_t> ids = read_json(dir + "/ref/prompt_2.json")["ids"].get<std::vector<int32_t>>();
        std::vector<int32_t> first;
        for (cpu::Isa isa : isas) {
            cpu::force_isa(isa);
            auto st = model->create_state();
            std::vector<int32_t> got = greedy(*st, ids, 32, model->info().n_vocab);
            if (first.empty()) first = got;
            EXPECT_EQ(got, first) << m << " under " << cpu::isa_name(isa);
        }
        std::printf("[ isa    ] %-20s %zu kernel tables agree on 32 greedy tokens\n", m, isas.size());
    }
    cpu::force_isa(saved);
}

}  // namespace
}  // namespace cera
