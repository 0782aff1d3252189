// LoRA on the experts of an MoE model (tiny-lfm2moe): a rank-4 adapter on every projection, the experts'
// gate/up/down included (tests/data/lora-moe/experts-r4.gguf, from `cera synth --lora-rank 4`), against
// llama.cpp's log-probabilities with the same files (tests/data/lora-moe/llamacpp.json, from llama-server
// b10470: see the README there), on the CPU and on CUDA (in CUDA builds, where a device is present); the
// adapter unmerged equal to the base with it merged; the same adapter as a PEFT folder of per-expert
// modules giving the same logits and converting back to the same GGUF tensors; a batch mixing base and
// adapter sequences; an adapter of another expert count refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/device.h"
#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "lora_batch.h"
#include "models/lora.h"
#include "models/model.h"
#include "quantize/lora_gguf.h"
#include "quantize/lora_merge.h"
#include "test_devices.h"
#include "test_util.h"

namespace cera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBase = test::data_path("fixtures/tiny-lfm2moe/model.gguf");
const std::string kAdapter = test::source_path("tests/data/lora-moe/experts-r4.gguf");
constexpr float kScale = 3.0f;  // the scale of the llama.cpp run

// Adapters kept as F16 on the device by default; F32 where a test compares with F32 arithmetic.
std::unique_ptr<Model> load(const std::string& path, GgmlType lora_type = GgmlType::kF16,
                            DeviceKind device = DeviceKind::kCpu) {
    ModelOptions o;
    o.device = device;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.lora_type = lora_type;
    return load_model(path, o);
}

std::vector<float> all_logits(Model& model, const std::vector<int32_t>& ids, const LoraSet& lora = {}) {
    std::vector<float> out(ids.size() * size_t(model.info().n_vocab));
    auto st = model.create_state();
    st->set_lora(lora);
    st->eval({.tokens = ids, .all_logits = true, .logits = out.data()});
    return out;
}

std::vector<int32_t> prompt() { return {1, 397, 398, 263, 378, 16, 390, 284, 263, 417, 543, 392}; }

class LoraExperts : public ::testing::Test {
 protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("cera_lora_experts_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    fs::path dir_;
};

class LoraExpertsOn : public ::testing::TestWithParam<DeviceKind> {
 protected:
    void SetUp() override {
        std::string why;
        if (GetParam() == DeviceKind::kCuda && cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    }
};

// At every generated step of llama.cpp's three greedy runs, the log-probabilities of its eight most likely
// tokens, and its greedy pick. Within 1e-2, the adapter tests' tolerance: the base model alone differs from
// llama-server's by up to 2.6e-3 (its F16 KV cache), the adapter moves the logits by up to 1.7. The runs'
// tokens go in as one prompt: the experts' products of a batch of rows (CUDA: grouped by expert).
TEST_P(LoraExpertsOn, MatchLlamaCpp) {
    auto model = load(kBase, GgmlType::kF16, GetParam());
    const LoraSet lora = {{load_lora(kAdapter, *model), kScale}};
    const json ref = json::parse(test::read_text(test::source_path("tests/data/lora-moe/llamacpp.json")));
    ASSERT_EQ(ref["scale"].get<float>(), kScale);
    const int64_t n_vocab = model->info().n_vocab;
    double worst = 0, moved = 0;
    for (const json& run : ref["runs"]) {
        std::vector<int32_t> ids = run["ids"].get<std::vector<int32_t>>();
        const size_t n_prompt = ids.size();
        for (const json& s : run["steps"]) ids.push_back(s["id"].get<int32_t>());
        const std::vector<float> got = all_logits(*model, ids, lora);
        const std::vector<float> base = all_logits(*model, ids);
        for (size_t i = 0; i < run["steps"].size(); ++i) {
            const float* row = got.data() + (n_prompt - 1 + i) * size_t(n_vocab);
            const float* brow = base.data() + (n_prompt - 1 + i) * size_t(n_vocab);
            double mx = row[0], sum = 0;
            for (int64_t v = 0; v < n_vocab; ++v) mx = std::max(mx, double(row[v]));
            for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - mx);
            const double lse = mx + std::log(sum);
            int32_t pick = 0;
            for (int64_t v = 1; v < n_vocab; ++v)
                if (row[v] > row[pick]) pick = int32_t(v);
            const json& step = run["steps"][i];
            EXPECT_EQ(pick, step["id"].get<int32_t>()) << run["prompt"] << " step " << i;
            for (const json& t : step["top"]) {
                const int32_t id = t[0].get<int32_t>();
                const double d = std::abs(double(row[id]) - lse - t[1].get<double>());
                worst = std::max(worst, d);
                EXPECT_LT(d, 1e-2) << run["prompt"] << " step " << i << " token " << id;
            }
            for (int64_t v = 0; v < n_vocab; ++v) moved = std::max(moved, double(std::abs(row[v] - brow[v])));
        }
    }
    std::printf("[ lora ] MoE experts vs llama.cpp: max |dlogprob| = %.3g; the adapter moves logits by up to %.3g\n",
                worst, moved);
    EXPECT_GT(moved, 0.5);  // the adapter matters, so the agreement says something
}

// Decode steps (one row: CUDA's per-slot expert products) against the CPU's, both with the adapter at
// two scales and with none, within the adapter tests' 1e-2.
TEST_P(LoraExpertsOn, DecodeStepsMatchTheCpu) {
    auto model = load(kBase, GgmlType::kF16, GetParam());
    auto cpu = load(kBase);
    const std::vector<int32_t> decode = {5, 77, 300, 12, 263, 1};
    const size_t n_vocab = size_t(model->info().n_vocab);
    // rows[scale][device]: the prompt's last row, then each decode step's.
    std::vector<std::vector<float>> rows[3][2];
    const float scales[3] = {kScale, 0.5f, 0.0f};
    double worst = 0;
    for (int s = 0; s < 3; ++s) {
        Model* ms[2] = {model.get(), cpu.get()};
        for (int m = 0; m < 2; ++m) {
            auto st = ms[m]->create_state();
            if (scales[s] != 0.0f) st->set_lora({{load_lora(kAdapter, *ms[m]), scales[s]}});
            auto& out = rows[s][m];
            out.emplace_back(n_vocab);
            st->eval({.tokens = prompt(), .logits = out.back().data()});
            for (int32_t id : decode) {
                out.emplace_back(n_vocab);
                st->eval({.tokens = {&id, 1}, .logits = out.back().data()});
            }
        }
        for (size_t i = 0; i < rows[s][0].size(); ++i) {
            const double d = test::max_abs_diff(rows[s][0][i], rows[s][1][i]);
            worst = std::max(worst, d);
            EXPECT_LT(d, 1e-2) << "scale " << scales[s] << " step " << i;
        }
    }
    const double moved = test::max_abs_diff(rows[0][0].back(), rows[2][0].back());
    std::printf("[ lora ] MoE experts, decode steps against the CPU: max |dlogit| = %.3g (the adapter moves %.3g)\n",
                worst, moved);
    EXPECT_GT(moved, 0.5);
}

// The runtime adapter against the base with the adapter folded into its (F32) weights.
TEST_F(LoraExperts, UnmergedEqualsMerged) {
    quantize::LoraMergeOptions o;
    o.base = kBase;
    o.output = (dir_ / "merged.gguf").string();
    o.adapters = {{kAdapter, kScale}};
    o.n_threads = 2;
    EXPECT_EQ(quantize::merge_lora(o).n_merged, 34u);  // 6 layers: 3 or 4 mixer products, 3 FFN weights
    auto model = load(kBase, GgmlType::kF32);
    auto merged = load(o.output);
    const double d = test::max_abs_diff(all_logits(*model, prompt(), {{load_lora(kAdapter, *model), kScale}}),
                                        all_logits(*merged, prompt()));
    std::printf("[ lora ] MoE experts: unmerged vs merged max |dlogit| = %.3g\n", d);
    EXPECT_LT(d, 1e-4);
}

// A safetensors file of F32 tensors.
void write_safetensors(const fs::path& path,
                       const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& ts) {
    json header = json::object();
    size_t off = 0;
    for (const auto& [name, t] : ts) {
        header[name] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {off, off + t.second.size() * 4}}};
        off += t.second.size() * 4;
    }
    const std::string h = header.dump();
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (const auto& [name, t] : ts)
        out.write(reinterpret_cast<const char*>(t.second.data()), std::streamsize(t.second.size() * 4));
}

// The GGUF adapter rewritten as Hugging Face PEFT would save it for the transformers model: every expert a
// module of its own (model.layers.L.feed_forward.experts.E.w1 / w3 / w2), the rest under their module names.
// Without the modules of expert `skip` (-1: none).
void write_peft(const fs::path& dir, const gguf::File& f, float alpha, int64_t skip = -1) {
    fs::create_directories(dir);
    const std::map<std::string, std::string> dense = {{"attn_q", "self_attn.q_proj"},
                                                      {"attn_k", "self_attn.k_proj"},
                                                      {"attn_v", "self_attn.v_proj"},
                                                      {"attn_output", "self_attn.out_proj"},
                                                      {"shortconv.in_proj", "conv.in_proj"},
                                                      {"shortconv.out_proj", "conv.out_proj"},
                                                      {"ffn_gate", "feed_forward.w1"},
                                                      {"ffn_up", "feed_forward.w3"},
                                                      {"ffn_down", "feed_forward.w2"},
                                                      {"ffn_gate_exps", "w1"},
                                                      {"ffn_up_exps", "w3"},
                                                      {"ffn_down_exps", "w2"}};
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> ts;
    int64_t r = 0;
    for (const gguf::TensorInfo& t : f.tensors()) {
        const std::string& n = t.name;  // blk.L.<module>.weight.lora_a / .lora_b
        const size_t dot = n.find('.', 4);
        const std::string layer = n.substr(4, dot - 4);
        const std::string module = n.substr(dot + 1, n.find(".weight.") - dot - 1);
        const bool is_a = n.substr(n.size() - 6) == "lora_a";
        const std::vector<float> v(reinterpret_cast<const float*>(t.data),
                                   reinterpret_cast<const float*>(t.data) + t.n_elements());
        // Per expert: lora_A [r, k] (GGUF ne {k, r}), lora_B [n_out, r] (ne {r, n_out}); row-major as stored.
        const int64_t n_expert = t.ne.size() == 3 ? t.ne[2] : 1, per = t.ne[0] * t.ne[1];
        r = is_a ? t.ne[1] : t.ne[0];
        for (int64_t e = 0; e < n_expert; ++e) {
            if (n_expert > 1 && e == skip) continue;
            std::string hf = "base_model.model.model.layers." + layer + "." +
                             (n_expert > 1 ? "feed_forward.experts." + std::to_string(e) + "." : "") +
                             dense.at(module) + (is_a ? ".lora_A.weight" : ".lora_B.weight");
            ts[hf] = {{t.ne[1], t.ne[0]}, std::vector<float>(v.begin() + e * per, v.begin() + (e + 1) * per)};
        }
    }
    write_safetensors(dir / "adapter_model.safetensors", ts);
    std::ofstream(dir / "adapter_config.json")
        << json{{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", alpha}, {"target_modules", {"w1", "w2", "w3"}}}.dump();
}

TEST_F(LoraExperts, PeftFolderEqualsGguf) {
    auto f = gguf::File::open(kAdapter);
    write_peft(dir_ / "peft", *f, f->get_f32("adapter.lora.alpha", 0.0f));
    auto model = load(kBase);
    const auto gguf_logits = all_logits(*model, prompt(), {{load_lora(kAdapter, *model), kScale}});
    const auto peft_logits = all_logits(*model, prompt(), {{load_lora((dir_ / "peft").string(), *model), kScale}});
    EXPECT_EQ(test::max_abs_diff(gguf_logits, peft_logits), 0.0);
    // And back to a GGUF LoRA file: the same tensors, stacked experts included.
    quantize::PeftConvertOptions c;
    c.peft_dir = (dir_ / "peft").string();
    c.base = kBase;
    c.output = (dir_ / "back.gguf").string();
    EXPECT_EQ(quantize::convert_peft_lora(c), f->tensors().size() / 2);
    auto back = gguf::File::open(c.output);
    for (const gguf::TensorInfo& t : f->tensors()) {
        const gguf::TensorInfo* b = back->find_tensor(t.name);
        ASSERT_NE(b, nullptr) << t.name;
        EXPECT_EQ(b->ne, t.ne) << t.name;
        ASSERT_EQ(b->n_bytes, t.n_bytes) << t.name;
        EXPECT_EQ(std::memcmp(b->data, t.data, t.n_bytes), 0) << t.name;
    }
    // An expert the adapter leaves out adds nothing: the folder without expert 3's modules gives what the
    // GGUF file with expert 3's pairs zeroed gives.
    write_peft(dir_ / "peft3", *f, f->get_f32("adapter.lora.alpha", 0.0f), 3);
    gguf::Writer w;
    for (const auto& [key, v] : f->metadata()) w.set(key, v);
    std::vector<std::vector<uint8_t>> keep;
    for (const gguf::TensorInfo& t : f->tensors()) {
        keep.emplace_back(t.data, t.data + t.n_bytes);
        if (t.ne.size() == 3) std::memset(keep.back().data() + 3 * t.n_bytes / 8, 0, t.n_bytes / 8);
        w.add_tensor(t.name, t.type, t.ne, keep.back());
    }
    w.write((dir_ / "zero3.gguf").string());
    const auto skipped = all_logits(*model, prompt(), {{load_lora((dir_ / "peft3").string(), *model), kScale}});
    EXPECT_EQ(test::max_abs_diff(
                  skipped, all_logits(*model, prompt(), {{load_lora((dir_ / "zero3.gguf").string(), *model), kScale}})),
              0.0);
    EXPECT_GT(test::max_abs_diff(skipped, gguf_logits), 0.0);
}

// Base and adapter sequences in one batch give what each gives alone: bit for bit on the CPU; on CUDA a
// batch's expert products run grouped by expert and a lone decode row's per slot, the same 8-bit products
// summed in another order, whose rounding of the down product's input can flip a step: within 1e-3.
TEST_P(LoraExpertsOn, MixedBatchMatchesEachAlone) {
    auto model = load(kBase, GgmlType::kF16, GetParam());
    const double tol = GetParam() == DeviceKind::kCuda ? 1e-3 : 0.0;
    const auto a = load_lora(kAdapter, *model);
    const std::vector<LoraSet> sets = {{}, {{a, kScale}}, {{a, 1.0f}}, {}, {{a, kScale}}};
    const std::vector<int32_t> decode = {5, 77, 300, 12};
    const test::MixedBatchLogits r = test::mixed_batch_logits(*model, sets, prompt(), decode);
    double worst = 0;
    for (size_t i = 0; i < sets.size(); ++i)
        for (size_t step = 0; step <= decode.size(); ++step) {
            const double d = test::max_abs_diff(r.batched[i][step], r.alone[i][step]);
            worst = std::max(worst, d);
            EXPECT_LE(d, tol) << "sequence " << i << " step " << step;
        }
    std::printf("[ lora ] MoE experts, mixed batch against each alone: max |dlogit| = %.3g\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Devices, LoraExpertsOn, ::testing::ValuesIn(test::devices()),
                         [](const auto& d) { return std::string(device_kind_name(d.param)); });

// An adapter whose experts do not match the model's: one line naming the tensor and both shapes.
TEST_F(LoraExperts, AnotherExpertCountIsRefused) {
    auto f = gguf::File::open(kAdapter);
    gguf::Writer w;
    for (const auto& [key, v] : f->metadata()) w.set(key, v);
    for (const gguf::TensorInfo& t : f->tensors()) {
        std::vector<int64_t> ne = t.ne;
        size_t bytes = t.n_bytes;
        if (ne.size() == 3) {  // keep the first 4 of the 8 experts
            ne[2] = 4;
            bytes /= 2;
        }
        w.add_tensor(t.name, t.type, ne, std::span<const uint8_t>(t.data, bytes));
    }
    const std::string path = (dir_ / "four.gguf").string();
    w.write(path);
    auto model = load(kBase);
    try {
        load_lora(path, *model);
        FAIL() << "loaded an adapter of 4 experts into a model of 8";
    } catch (const Error& e) {
        const std::string msg = e.what();
        std::printf("[ lora ] %s\n", msg.c_str());
        EXPECT_NE(msg.find("_exps.weight.lora_a has ne {"), std::string::npos) << msg;
        EXPECT_NE(msg.find(", 4}"), std::string::npos) << msg;
        EXPECT_NE(msg.find(", 8}"), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
}

}  // namespace
}  // namespace cera
