// Every weight type on every CPU kernel table, on the tiny-lfm2 fixture quantized to that type by
// `cera quantize`, gives the greedy continuation of llama.cpp on the same file and of the scalar
// reference table (which dequantizes each weight row to f32: the slow path the fast kernels
// replace). The fast kernels quantize the activations to 8 bits where the scalar path keeps them in
// f32: on the common prefix the two paths' logits differ by 0.12-0.19 at the median step and by 0.42
// at most (every quantized type, AVX2, 2026-12-05), so the fast path's logits must stay within 0.6 of
// the scalar path's, and the tokens may part only where the reference's top logits are within 0.3 (a
// near-tie for 8-bit activations), and then at one of those tied tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "models/model.h"
#include "quantize/quantize.h"
#include "test_util.h"

namespace cera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Greedy {
    std::vector<int32_t> ids;
    std::vector<float> margin;    // top1 - top2 logit at each step
    std::vector<std::vector<float>> logits;
};

Greedy greedy(Model& model, const std::vector<int32_t>& prompt, int n) {
    const int64_t n_vocab = model.info().n_vocab;
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    auto st = model.create_state();
    st->eval({.tokens = prompt, .logits = logits.data()});
    Greedy g;
    for (int i = 0; i < n; ++i) {
        std::vector<int32_t> order(static_cast<size_t>(n_vocab));
        for (int32_t j = 0; j < int32_t(n_vocab); ++j) order[size_t(j)] = j;
        std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&](int32_t a, int32_t b) {
            return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
        });
        const int32_t id = order[0];
        g.ids.push_back(id);
        g.margin.push_back(logits[size_t(order[0])] - logits[size_t(order[1])]);
        g.logits.push_back(logits);
        if (i + 1 < n) st->eval({.tokens = {&id, 1}, .logits = logits.data()});
    }
    return g;
}

std::unique_ptr<Model> load(const std::string& path) {
    ModelOptions o;
    o.n_threads = 2;
    o.n_ctx = 256;
    return load_model(path, o);  // the CPU backend takes the active kernel table
}

// file type, and the weight type most of its matrices get
struct TypeCase {
    const char* file_type;
    GgmlType type;
};

class WeightType : public ::testing::TestWithParam<TypeCase> {};

// tiny-lfm2 quantized to a file type by `cera quantize` (llama-quantize's bytes: golden/quantize_test).
std::string quantized_fixture(const char* file_type) {
    quantize::QuantizeOptions qo;
    qo.input = test::data_path("fixtures/tiny-lfm2/model.gguf");
    qo.output =
        (fs::temp_directory_path() / ("cera_wtypes_" + std::to_string(::getpid()) + "_" + file_type + ".gguf"))
            .string();
    qo.file_type = quantize::parse_file_type(file_type);
    qo.n_threads = 2;
    quantize::quantize_model(qo);
    return qo.output;
}

TEST_P(WeightType, GreedyMatchesTheScalarPath) {
    const TypeCase& c = GetParam();
    const std::string dir = test::data_path("fixtures/tiny-lfm2");
    const std::string path = quantized_fixture(c.file_type);

    const cpu::Isa saved = cpu::active_isa();
    constexpr int kSteps = 32;
    for (int p : {0, 2}) {
        const std::vector<int32_t> prompt =
            json::parse(test::read_text(dir + "/ref/prompt_" + std::to_string(p) + ".json"))["ids"]
                .get<std::vector<int32_t>>();
        cpu::force_isa(cpu::Isa::kRef);
        const Greedy ref = greedy(*load(path), prompt, kSteps);
        for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
            if (!cpu::isa_supported(isa)) continue;
            const cpu::KernelTable& tab = cpu::kernel_table(isa);
            // the case exercises a kernel of the type, not the dequantizing fallback
            const bool fast = tab.matmul[int(c.type)].fn != nullptr || tab.packed[int(c.type)].fn != nullptr;
            EXPECT_TRUE(tab.packed[int(c.type)].fn != nullptr) << c.file_type << " " << cpu::isa_name(isa);
            cpu::force_isa(isa);
            const Greedy got = greedy(*load(path), prompt, kSteps);
            size_t match = 0;
            while (match < ref.ids.size() && got.ids[match] == ref.ids[match]) ++match;
            float noise = 0.0f;  // the largest logit difference over the steps both paths saw the same tokens
            for (size_t st = 0; st <= std::min(match, ref.ids.size() - 1); ++st)
                for (size_t v = 0; v < ref.logits[st].size(); ++v)
                    noise = std::max(noise, std::fabs(ref.logits[st][v] - got.logits[st][v]));
            std::printf("[ wtype  ] %-7s %-6s%s prompt %d: %zu/%d greedy tokens equal the scalar path, logits within %.3g\n",
                        c.file_type, cpu::isa_name(isa), fast ? "" : " (fallback)", p, match, kSteps, noise);
            EXPECT_LT(noise, 0.6) << c.file_type << " " << cpu::isa_name(isa) << " prompt " << p;
            if (match < ref.ids.size()) {
                // the reference's own logit for the token taken: within the tie margin of its top
                const float gap = ref.logits[match][size_t(ref.ids[match])] - ref.logits[match][size_t(got.ids[match])];
                std::printf("           diverges at step %zu: scalar margin top1-top2 %.4g, to a token %.4g below\n",
                            match, ref.margin[match], gap);
                EXPECT_LT(gap, 0.3) << c.file_type << " " << cpu::isa_name(isa) << " prompt " << p;
            }
        }
    }
    cpu::force_isa(saved);
    fs::remove(path);
}

// llama.cpp's greedy continuation of the same file (tests/data/llamacpp/make_greedy.py: llama-server
// with an F32 KV cache, the top 5 log-probabilities of every step), on every kernel table: equal, or
// parting where llama.cpp's top two are within 0.05 and then at a token of its top 5 within 0.05 of
// its first.
TEST_P(WeightType, GreedyMatchesLlamaCpp) {
    const TypeCase& c = GetParam();
    const json ref =
        json::parse(test::read_text(test::source_path(std::string("tests/data/llamacpp/tiny-lfm2-") + c.file_type + ".json")));
    ASSERT_EQ(ref["type"], c.file_type);
    const std::string path = quantized_fixture(c.file_type);
    const std::string dir = test::data_path("fixtures/tiny-lfm2");
    const cpu::Isa saved = cpu::active_isa();
    for (cpu::Isa isa : {cpu::Isa::kRef, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
        if (!cpu::isa_supported(isa)) continue;
        cpu::force_isa(isa);
        auto model = load(path);
        for (const json& pr : ref["prompts"]) {
            const int p = pr["prompt"].get<int>();
            const std::vector<int32_t> prompt = pr["token_ids"].get<std::vector<int32_t>>();
            ASSERT_EQ(prompt, json::parse(test::read_text(dir + "/ref/prompt_" + std::to_string(p) + ".json"))["ids"]
                                  .get<std::vector<int32_t>>());
            const std::vector<int32_t> want = pr["greedy_ids"].get<std::vector<int32_t>>();
            const Greedy got = greedy(*model, prompt, int(want.size()));
            size_t match = 0;
            while (match < want.size() && got.ids[match] == want[match]) ++match;
            std::printf("[ llama  ] %-7s %-6s prompt %d: %zu/%zu greedy tokens equal llama.cpp\n", c.file_type,
                        cpu::isa_name(isa), p, match, want.size());
            if (match == want.size()) continue;
            const json& top = pr["top5_logprobs"][match];
            const double margin = top[0][1].get<double>() - top[1][1].get<double>();
            double gap = 1e9;  // llama.cpp's log-probability of our token below its first
            for (const json& t : top)
                if (t[0].get<int32_t>() == got.ids[match]) gap = top[0][1].get<double>() - t[1].get<double>();
            std::printf("           diverges at step %zu: llama.cpp margin top1-top2 %.4g, ours %.4g below\n", match,
                        margin, gap);
            EXPECT_LT(margin, 0.05) << c.file_type << " " << cpu::isa_name(isa) << " prompt " << p;
            EXPECT_LT(gap, 0.05) << c.file_type << " " << cpu::isa_name(isa) << " prompt " << p;
        }
    }
    cpu::force_isa(saved);
    fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightType,
                         ::testing::Values(TypeCase{"Q4_1", GgmlType::kQ4_1}, TypeCase{"Q5_0", GgmlType::kQ5_0},
                                           TypeCase{"Q5_1", GgmlType::kQ5_1}, TypeCase{"Q5_K_M", GgmlType::kQ5_K},
                                           TypeCase{"F16", GgmlType::kF16}, TypeCase{"BF16", GgmlType::kBF16},
                                           TypeCase{"IQ4_NL", GgmlType::kIQ4_NL}, TypeCase{"IQ4_XS", GgmlType::kIQ4_XS},
                                           TypeCase{"Q2_K", GgmlType::kQ2_K}, TypeCase{"Q3_K_M", GgmlType::kQ3_K}),
                         [](const auto& info) { return std::string(info.param.file_type); });

}  // namespace
}  // namespace cera
