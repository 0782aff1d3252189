// `cera convert` on checkpoints saved by transformers 5 (rope_parameters, byte-level BPE tokenizers):
// the file it writes must equal llama.cpp's conversion of the same folder (fixtures/<model>/model.gguf;
// for LFM2-VL also the vision projector, mmproj.gguf) tensor for tensor and key for key, and run like
// it: the same prompt ids and the greedy continuation of the float64 transformers reference. What the
// GGUF form cannot hold is refused with a message, never written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "backends/backend.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using cera::test::cera_bin;
using cera::test::shell_quote;

bool same_value(const cera::gguf::Value& a, const cera::gguf::Value& b) {
    if (a.type != b.type) return false;
    if (a.type != cera::gguf::ValueType::kArray) return a.v == b.v;
    const auto& x = a.as_array();
    const auto& y = b.as_array();
    if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
        if (!same_value(x.items[i], y.items[i])) return false;
    return true;
}

// A copy of fixtures/<model>/hf whose config.json is edited by `edit`, under `dir`; returns its path.
std::string edited_copy(const fs::path& dir, const std::string& model, const std::string& name,
                        const std::function<void(json&)>& edit) {
    const fs::path d = dir / name;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(cera::test::data_path("fixtures/" + model + "/hf")))
        fs::copy_file(e.path(), d / e.path().filename(), fs::copy_options::overwrite_existing);
    json cfg = json::parse(cera::test::read_text((d / "config.json").string()));
    edit(cfg);
    std::ofstream(d / "config.json") << cfg.dump(2);
    return d.string();
}

cera::test::ShellResult convert(const std::string& hf, const std::string& out) {
    return cera::test::run_shell(shell_quote(cera_bin()) + " convert --hf " + shell_quote(hf) + " -o " +
                                 shell_quote(out));
}

struct Collect : cera::Sink {
    std::vector<int32_t> ids;
    void on_text(std::string_view) override {}
    void on_token(int32_t id) override { ids.push_back(id); }
};

// ---------------------------------------------------------------- every fixture

// One per architecture: each fixture's hf/ folder (transformers 5.17) and llama.cpp's conversion of
// it, model.gguf. tiny-lfm2's checkpoint is not in hf-weights.tar.xz (its 6.4 MB compressed would
// take the archive past the size the repository's test data keeps to; tiny-lfm2moe covers the same
// short-conv, attention and dense FFN rows), so its case runs only where the file was added.
class ConvertFixture : public ::testing::TestWithParam<const char*> {
 protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("cera_convert_fx_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    std::string model() const { return GetParam(); }
    std::string fixture(const std::string& rel) const {
        return cera::test::data_path("fixtures/" + model() + "/" + rel);
    }
    void SetUp() override {
        if (!fs::exists(fixture("hf/model.safetensors")))
            GTEST_SKIP() << model() << "/hf/model.safetensors is not in the test data";
    }
    // The converted file, made once per fixture.
    const std::string& converted() {
        static std::map<std::string, std::string> done;
        auto it = done.find(model());
        if (it != done.end()) return it->second;
        const std::string out = (dir_ / (model() + ".gguf")).string();
        const auto r = convert(fixture("hf"), out);
        EXPECT_EQ(r.code, 0) << r.err;
        return done.emplace(model(), out).first->second;
    }

    static fs::path dir_;
};
fs::path ConvertFixture::dir_;

// Every tensor byte-equal; every key of llama.cpp's file present with the same type and value.
// Keys that differ on purpose: general.name (llama.cpp takes it from its own heuristics, cera from
// the folder name) and general.size_label (a display string that cera does not write).
void expect_same_file(const std::string& ours_path, const std::string& ref_path) {
    SCOPED_TRACE(ref_path);
    auto ours = cera::gguf::File::open(ours_path);
    auto ref = cera::gguf::File::open(ref_path);
    const std::set<std::string> differ = {"general.name", "general.size_label"};
    for (const auto& [key, value] : ref->metadata()) {
        if (differ.count(key)) continue;
        const cera::gguf::Value* v = ours->find(key);
        EXPECT_NE(v, nullptr) << key << " is missing";
        if (v) EXPECT_TRUE(same_value(*v, value)) << key << " differs";
    }
    for (const auto& [key, value] : ours->metadata())
        EXPECT_TRUE(ref->has(key) || differ.count(key)) << key << " is not in llama.cpp's file";

    ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
    for (const auto& t : ref->tensors()) {
        const cera::gguf::TensorInfo* o = ours->find_tensor(t.name);
        ASSERT_NE(o, nullptr) << t.name;
        EXPECT_EQ(o->type, t.type) << t.name;
        EXPECT_EQ(o->ne, t.ne) << t.name;
        ASSERT_EQ(o->n_bytes, t.n_bytes) << t.name;
        EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes), 0) << t.name;
    }
}

TEST_P(ConvertFixture, MatchesLlamaCppConversion) { expect_same_file(converted(), fixture("model.gguf")); }

// The prompt tokenizes as the HF tokenizer does, and greedy decoding on the CPU gives the float64
// transformers reference.
TEST_P(ConvertFixture, RunsLikeTheReference) {
    const json prompt = json::parse(cera::test::read_text(fixture("ref/prompt_0.json")));
    const json greedy = json::parse(cera::test::read_text(fixture("ref/greedy_0.json")));
    auto engine = cera::Engine::load(converted(), {.device = "cpu", .threads = 2});
    const auto ids = engine->tokenize(prompt["text"].get<std::string>(), true, false);
    ASSERT_EQ(ids, prompt["ids"].get<std::vector<int32_t>>());

    cera::Session s(engine);
    s.append_tokens(ids);
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    const auto want = greedy["generated_ids"].get<std::vector<int32_t>>();
    g.max_tokens = int32_t(want.size());
    g.ignore_eos = true;
    Collect sink;
    s.generate(g, sink);
    EXPECT_EQ(sink.ids, want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConvertFixture,
                         ::testing::Values("tiny-llama-random", "tiny-qwen2-random", "tiny-qwen3",
                                           "tiny-granite-random", "tiny-lfm2", "tiny-lfm2moe"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                             std::string n = p.param;
                             for (char& ch : n)
                                 if (ch == '-') ch = '_';
                             return n;
                         });

// ---------------------------------------------------------------- llama's RoPE settings and refusals

class ConvertLlama : public ::testing::Test {
 protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("cera_convert_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }
    static std::string edited(const std::string& name, const std::function<void(json&)>& edit) {
        return edited_copy(dir_, "tiny-llama-random", name, edit);
    }

    static fs::path dir_;
};
fs::path ConvertLlama::dir_;

// Llama 3.1 scaling becomes rope_freqs.weight: transformers' formulation (scaled inverse frequencies)
// divided into the plain ones.
TEST_F(ConvertLlama, Llama3RopeScalingBecomesFrequencyFactors) {
    const double factor = 8, low = 1, high = 4, original = 64, theta = 500000;
    const std::string hf = edited("llama3", [&](json& c) {
        c["rope_parameters"] = {{"rope_type", "llama3"},    {"rope_theta", theta},
                                {"factor", factor},         {"low_freq_factor", low},
                                {"high_freq_factor", high}, {"original_max_position_embeddings", original}};
    });
    const std::string out = (dir_ / "llama3.gguf").string();
    const auto r = convert(hf, out);
    ASSERT_EQ(r.code, 0) << r.err;
    auto f = cera::gguf::File::open(out);
    EXPECT_FLOAT_EQ(f->get_f32("llama.rope.freq_base"), float(theta));
    const cera::gguf::TensorInfo* t = f->find_tensor("rope_freqs.weight");
    ASSERT_NE(t, nullptr);
    const int64_t d = 32;  // head_dim
    ASSERT_EQ(t->ne, std::vector<int64_t>{d / 2});
    const float* got = reinterpret_cast<const float*>(t->data);
    int n_scaled = 0, n_kept = 0, n_between = 0;
    for (int64_t i = 0; i < d / 2; ++i) {
        const double inv = 1.0 / std::pow(theta, double(2 * i) / double(d));
        const double wavelen = 2 * M_PI / inv;
        double scaled = wavelen > original / low ? inv / factor : inv;
        const double smooth = (original / wavelen - low) / (high - low);
        const bool medium = !(wavelen < original / high) && !(wavelen > original / low);
        if (medium) scaled = (1 - smooth) * scaled / factor + smooth * scaled;
        EXPECT_NEAR(got[i], inv / scaled, 1e-5 * (inv / scaled)) << "pair " << i;
        n_scaled += wavelen > original / low;
        n_kept += wavelen < original / high;
        n_between += medium;
    }
    // The chosen shape puts pairs in all three bands.
    EXPECT_GT(n_scaled, 0);
    EXPECT_GT(n_kept, 0);
    EXPECT_GT(n_between, 0);
}

TEST_F(ConvertLlama, OldStyleRopeThetaIsRead) {
    const std::string hf = edited("old", [](json& c) {
        c.erase("rope_parameters");
        c["rope_theta"] = 250000.0;
        c["rope_scaling"] = nullptr;
    });
    const std::string out = (dir_ / "old.gguf").string();
    const auto r = convert(hf, out);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FLOAT_EQ(cera::gguf::File::open(out)->get_f32("llama.rope.freq_base"), 250000.0f);
}

// What the GGUF llama form cannot express is refused with one line naming it, and no file is left.
TEST_F(ConvertLlama, RefusesWhatItCannotConvertFaithfully) {
    struct Case {
        const char* name;
        std::function<void(json&)> edit;
        const char* message;
    };
    const std::vector<Case> cases = {
        {"yarn",
         [](json& c) {
             c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 4}};
         },
         "rope type 'yarn'"},
        {"gelu", [](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act 'gelu'"},
        {"window", [](json& c) { c["sliding_window"] = 512; }, "sliding_window 512"},
        {"bias", [](json& c) { c["mlp_bias"] = true; }, "mlp_bias"},
    };
    for (const Case& k : cases) {
        const std::string out = (dir_ / (std::string(k.name) + ".gguf")).string();
        const auto r = convert(edited(k.name, k.edit), out);
        EXPECT_NE(r.code, 0) << k.name;
        EXPECT_NE(r.err.find(k.message), std::string::npos) << k.name << ": " << r.err;
        EXPECT_FALSE(fs::exists(out)) << k.name;
    }

    // A tokenizer whose split regex no GGUF pre-tokenizer reproduces.
    const std::string hf = edited("regex", [](json&) {});
    json tok = json::parse(cera::test::read_text(hf + "/tokenizer.json"));
    tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\s+";
    std::ofstream(hf + "/tokenizer.json") << tok.dump();
    const std::string out = (dir_ / "regex.gguf").string();
    const auto r = convert(hf, out);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("split regex"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
}

// The other architectures refuse what their GGUF form cannot express: one line naming it, no file.
TEST(ConvertRefusals, EachArchitectureRefusesWhatItsGgufFormCannotHold) {
    const fs::path dir = fs::temp_directory_path() / ("cera_convert_refuse_" + std::to_string(::getpid()));
    struct Case {
        const char* model;
        const char* name;
        std::function<void(json&)> edit;
        const char* message;
    };
    const std::vector<Case> cases = {
        {"tiny-qwen2-random", "qwen2-window",
         [](json& c) {
             c["use_sliding_window"] = true;
             c["sliding_window"] = 64;
         },
         "sliding_window 64"},
        {"tiny-qwen2-random", "qwen2-layers",
         [](json& c) {
             c["layer_types"] = {"full_attention", "sliding_attention"};
         },
         "layer_types 'sliding_attention'"},
        {"tiny-qwen2-random", "qwen2-llama3",
         [](json& c) {
             c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 1e4},
                                     {"factor", 8},           {"low_freq_factor", 1},
                                     {"high_freq_factor", 4}, {"original_max_position_embeddings", 64}};
         },
         "rope type 'llama3' has no GGUF qwen2 form"},
        {"tiny-qwen3", "qwen3-bias", [](json& c) { c["attention_bias"] = true; }, "attention_bias"},
        {"tiny-granite-random", "granite-head-dim", [](json& c) { c["head_dim"] = 32; }, "head_dim 32"},
        {"tiny-lfm2moe", "moe-norm", [](json& c) { c["norm_topk_prob"] = false; }, "norm_topk_prob"},
        {"tiny-lfm2moe", "moe-scale", [](json& c) { c["routed_scaling_factor"] = 2.5; }, "routed_scaling_factor 2.5"},
        {"tiny-lfm2moe", "moe-conv-bias", [](json& c) { c["conv_bias"] = true; }, "conv_bias"},
        {"tiny-lfm2moe", "moe-rope",
         [](json& c) {
             c["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e6}, {"factor", 2}};
         },
         "rope type 'linear' has no GGUF lfm2moe form"},
        {"tiny-lfm2moe", "moe-no-bias", [](json& c) { c["use_expert_bias"] = false; }, "expert_bias' has no place"},
        {"tiny-lfm2moe", "moe-layers", [](json& c) { c["layer_types"][1] = "sliding_attention"; },
         "layer_types 'sliding_attention'"},
        {"tiny-lfm2moe", "unknown", [](json& c) { c["model_type"] = "gemma"; }, "model_type 'gemma'"},
    };
    for (const Case& k : cases) {
        const std::string out = (dir / (std::string(k.name) + ".gguf")).string();
        const auto r = convert(edited_copy(dir, k.model, k.name, k.edit), out);
        EXPECT_NE(r.code, 0) << k.name;
        EXPECT_NE(r.err.find(k.message), std::string::npos) << k.name << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << k.name << ": " << r.err;
        EXPECT_FALSE(fs::exists(out)) << k.name;
    }
    fs::remove_all(dir);
}

// --type quantizes as llama-quantize does: converting tiny-qwen3 with --type Q4_0 gives, for every tensor
// that llama-quantize also stored as Q4_0 or F32 (norms stay F32), the same bytes. The one tensor
// whose type differs on purpose is token_embd.weight: llama-quantize keeps the (tied) output matrix
// at a higher type, which a single --type does not express.
TEST(ConvertQuantized, Q4_0TensorsEqualLlamaQuantize) {
    const fs::path dir = fs::temp_directory_path() / ("cera_convert_q_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string out = (dir / "q4_0.gguf").string();
    const auto r = cera::test::run_shell(shell_quote(cera_bin()) + " convert --hf " +
                                         shell_quote(cera::test::data_path("fixtures/tiny-qwen3/hf")) + " -o " +
                                         shell_quote(out) + " --type Q4_0");
    ASSERT_EQ(r.code, 0) << r.err;
    auto ours = cera::gguf::File::open(out);
    auto ref = cera::gguf::File::open(cera::test::data_path("fixtures/tiny-qwen3/model-Q4_0.gguf"));
    EXPECT_EQ(ours->get_u32("general.file_type"), ref->get_u32("general.file_type"));
    ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
    int n_q4 = 0;
    for (const auto& t : ref->tensors()) {
        const cera::gguf::TensorInfo* o = ours->find_tensor(t.name);
        ASSERT_NE(o, nullptr) << t.name;
        EXPECT_EQ(o->ne, t.ne) << t.name;
        if (t.name == "token_embd.weight") {
            EXPECT_EQ(o->type, cera::GgmlType::kQ4_0);
            continue;
        }
        ASSERT_EQ(o->type, t.type) << t.name;
        ASSERT_EQ(o->n_bytes, t.n_bytes) << t.name;
        EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes), 0) << t.name;
        n_q4 += t.type == cera::GgmlType::kQ4_0;
    }
    EXPECT_EQ(n_q4, 28);
    fs::remove_all(dir);
}

// ---------------------------------------------------------------- LFM2-VL: a text model and its vision projector

class ConvertVl : public ::testing::Test {
 protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("cera_convert_vl_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }
    static std::string fx(const std::string& rel) { return cera::test::data_path("fixtures/tiny-lfm2vl/" + rel); }
    // `cera convert` of `hf` into <name>.gguf and <name>.mmproj.gguf under dir_.
    static cera::test::ShellResult convert_vl(const std::string& hf, const std::string& name,
                                              const std::string& extra = "") {
        return cera::test::run_shell(shell_quote(cera_bin()) + " convert --hf " + shell_quote(hf) + " -o " +
                                     shell_quote(out(name)) + " --mmproj " + shell_quote(mmproj(name)) + " " + extra);
    }
    static std::string out(const std::string& name) { return (dir_ / (name + ".gguf")).string(); }
    static std::string mmproj(const std::string& name) { return (dir_ / (name + ".mmproj.gguf")).string(); }
    static std::string edited(const std::string& name, const std::function<void(json&)>& edit) {
        return edited_copy(dir_, "tiny-lfm2vl", name, edit);
    }

    static fs::path dir_;
};
fs::path ConvertVl::dir_;

// Both files equal llama.cpp's conversion of the checkpoint (convert_hf_to_gguf.py, and again with
// --mmproj), key for key and tensor for tensor.
TEST_F(ConvertVl, BothFilesMatchLlamaCppConversion) {
    const auto r = convert_vl(fx("hf"), "f32");
    ASSERT_EQ(r.code, 0) << r.err;
    expect_same_file(out("f32"), fx("model.gguf"));
    expect_same_file(mmproj("f32"), fx("mmproj.gguf"));
}

// The converted pair runs the image prompt as transformers does: the processor's ids and the greedy
// continuation of the float64 reference.
TEST_F(ConvertVl, RunsTheImagePromptLikeTheReference) {
    const auto r = convert_vl(fx("hf"), "run");
    ASSERT_EQ(r.code, 0) << r.err;
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.mmproj = mmproj("run");
    auto engine = cera::Engine::load(out("run"), o);
    ASSERT_TRUE(engine->has_vision());
    const json prompt = json::parse(cera::test::read_text(fx("ref/prompt_vl.json")));
    const json greedy = json::parse(cera::test::read_text(fx("ref/greedy_vl.json")));
    const std::string text = prompt["prompt_text_before_expansion"];
    const size_t at = text.find("<image>");
    ASSERT_NE(at, std::string::npos);
    cera::Session s(engine);
    s.append_text(text.substr(0, at), /*add_bos=*/false, /*parse_special=*/true);
    s.append_image_file(fx("ref/test_image.png"));
    s.append_text(text.substr(at + 7), false, true);
    ASSERT_EQ(s.tokens(), prompt["ids"].get<std::vector<int32_t>>());
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.ignore_eos = true;
    const auto want = greedy["generated_ids"].get<std::vector<int32_t>>();
    g.max_tokens = int32_t(want.size());
    Collect sink;
    s.generate(g, sink);
    EXPECT_EQ(sink.ids, want);
}

// --type F16 halves the matrices of both files as llama.cpp does: the patch embedding goes F16 too,
// the position table and every 1-D tensor stay F32; the projector still gives the reference image
// embeddings within F16 rounding.
TEST_F(ConvertVl, F16KeepsTheTablesLlamaCppKeepsAndStillEncodes) {
    const auto r = convert_vl(fx("hf"), "f16", "--type F16");
    ASSERT_EQ(r.code, 0) << r.err;
    auto m = cera::gguf::File::open(mmproj("f16"));
    EXPECT_EQ(m->get_u32("general.file_type"), 1u);
    EXPECT_EQ(m->find_tensor("v.patch_embd.weight")->type, cera::GgmlType::kF16);
    EXPECT_EQ(m->find_tensor("v.position_embd.weight")->type, cera::GgmlType::kF32);
    EXPECT_EQ(m->find_tensor("v.blk.0.attn_q.weight")->type, cera::GgmlType::kF16);
    EXPECT_EQ(m->find_tensor("mm.1.weight")->type, cera::GgmlType::kF16);
    EXPECT_EQ(m->find_tensor("mm.input_norm.weight")->type, cera::GgmlType::kF32);
    EXPECT_EQ(m->find_tensor("v.blk.0.attn_q.bias")->type, cera::GgmlType::kF32);

    auto be = cera::create_backend({});
    auto enc = cera::vision::VisionEncoder::load(mmproj("f16"), *be, 64);
    const auto p =
        cera::vision::preprocess(cera::vision::load_image_file(fx("ref/test_image.png")), enc->config().proc);
    const std::vector<float> emb = enc->encode(p);
    const std::vector<float> ref = cera::test::read_f32(fx("ref/image_embeddings.f32"));
    EXPECT_LE(cera::test::max_abs_diff(emb, ref), 2e-2);
}

// A vision tower whose features come from an earlier layer (vision_feature_layer -2) keeps only the
// layers it runs; the ones after are not written.
TEST_F(ConvertVl, FeatureLayerDropsTheLayersAfterIt) {
    const auto r = convert_vl(edited("layer", [](json& c) { c["vision_feature_layer"] = -2; }), "layer");
    ASSERT_EQ(r.code, 0) << r.err;
    auto m = cera::gguf::File::open(mmproj("layer"));
    EXPECT_EQ(m->get_u32("clip.vision.block_count"), 1u);
    EXPECT_NE(m->find_tensor("v.blk.0.attn_q.weight"), nullptr);
    EXPECT_EQ(m->find_tensor("v.blk.1.attn_q.weight"), nullptr);
}

// Without --mmproj the vision side would be lost, so nothing is written; --mmproj for a text-only
// checkpoint, and what the clip form cannot express, are refused with one line and no file.
TEST_F(ConvertVl, RefusesWhatWouldLoseOrMisstateTheVisionSide) {
    {
        const std::string o = out("no-mmproj");
        const auto r = cera::test::run_shell(shell_quote(cera_bin()) + " convert --hf " + shell_quote(fx("hf")) +
                                             " -o " + shell_quote(o));
        EXPECT_NE(r.code, 0);
        EXPECT_NE(r.err.find("--mmproj"), std::string::npos) << r.err;
        EXPECT_FALSE(fs::exists(o));
    }
    {
        const auto r = convert_vl(cera::test::data_path("fixtures/tiny-qwen3/hf"), "text-only");
        EXPECT_NE(r.code, 0);
        EXPECT_NE(r.err.find("no vision tower"), std::string::npos) << r.err;
        EXPECT_FALSE(fs::exists(out("text-only")));
        EXPECT_FALSE(fs::exists(mmproj("text-only")));
    }
    struct Case {
        const char* name;
        std::function<void(json&)> edit;
        const char* message;
    };
    const std::vector<Case> cases = {
        {"act", [](json& c) { c["projector_hidden_act"] = "relu"; }, "projector_hidden_act 'relu'"},
        {"tower-act", [](json& c) { c["vision_config"]["hidden_act"] = "quick_gelu"; }, "hidden_act 'quick_gelu'"},
        {"tower", [](json& c) { c["vision_config"]["model_type"] = "clip_vision_model"; }, "clip_vision_model"},
        {"text", [](json& c) { c["text_config"]["model_type"] = "llama"; }, "text_config.model_type 'llama'"},
        {"bias", [](json& c) { c["projector_bias"] = false; }, "projector_bias"},
        {"patches", [](json& c) { c["vision_config"]["num_patches"] = 200; }, "square num_patches"},
        // The checkpoint's projector norm has no place when the config says there is none.
        {"norm", [](json& c) { c["projector_use_layernorm"] = false; }, "multi_modal_projector.layer_norm"},
    };
    for (const Case& k : cases) {
        const auto r = convert_vl(edited(k.name, k.edit), k.name);
        EXPECT_NE(r.code, 0) << k.name;
        EXPECT_NE(r.err.find(k.message), std::string::npos) << k.name << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << k.name << ": " << r.err;
        EXPECT_FALSE(fs::exists(out(k.name))) << k.name;
        EXPECT_FALSE(fs::exists(mmproj(k.name))) << k.name;
    }
}

// ---------------------------------------------------------------- sharded checkpoints

// A safetensors file of the given tensors (raw bytes copied, dtypes kept).
void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, const cera::StTensor*>>& ts) {
    json header = json::object();
    std::string data;
    for (const auto& [name, t] : ts) {
        const size_t begin = data.size();
        data.append(reinterpret_cast<const char*>(t->data), t->n_bytes);
        header[name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {begin, data.size()}}};
    }
    const std::string hj = header.dump();
    std::ofstream f(path, std::ios::binary);
    const uint64_t len = hj.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << hj << data;
}

// tiny-qwen3's checkpoint split into two shards with an index, as transformers saves large models:
// it converts to the same file as the single one; a shard missing, a tensor the map places in the
// wrong shard, one left out of the map or in two shards is refused, with no file written.
TEST(ConvertSharded, ShardsConvertAsTheSingleFile) {
    const fs::path dir = fs::temp_directory_path() / ("cera_convert_shards_" + std::to_string(::getpid()));
    const fs::path hf = dir / "hf";
    fs::create_directories(hf);
    const std::string src = cera::test::data_path("fixtures/tiny-qwen3/hf");
    for (const auto& e : fs::directory_iterator(src))
        if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), hf / e.path().filename());
    const cera::SafeTensors st(src + "/model.safetensors");
    const std::string shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    std::vector<std::pair<std::string, const cera::StTensor*>> parts[2];
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    size_t i = 0;
    for (const auto& [name, t] : st.tensors()) {
        parts[i % 2].emplace_back(name, &t);
        index["weight_map"][name] = shard[i % 2];
        ++i;
    }
    ASSERT_GT(parts[1].size(), 0u);
    write_safetensors(hf / shard[0], parts[0]);
    write_safetensors(hf / shard[1], parts[1]);
    std::ofstream(hf / "model.safetensors.index.json") << index.dump(2);

    const std::string out = (dir / "sharded.gguf").string();
    const auto r = convert(hf.string(), out);
    ASSERT_EQ(r.code, 0) << r.err;
    expect_same_file(out, cera::test::data_path("fixtures/tiny-qwen3/model.gguf"));

    // Each broken variant in its own copy of the folder.
    auto refused = [&](const char* name, const std::function<void(const fs::path&)>& breakit, const char* message) {
        const fs::path d = dir / name;
        fs::copy(hf, d);
        breakit(d);
        const std::string o = (dir / (std::string(name) + ".gguf")).string();
        const auto b = convert(d.string(), o);
        EXPECT_NE(b.code, 0) << name;
        EXPECT_NE(b.err.find(message), std::string::npos) << name << ": " << b.err;
        EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << name << ": " << b.err;
        EXPECT_FALSE(fs::exists(o)) << name;
    };
    refused(
        "missing", [&](const fs::path& d) { fs::remove(d / shard[1]); }, "is missing");
    const std::string moved = parts[0].front().first;
    refused(
        "wrong-shard",
        [&](const fs::path& d) {
            json j = index;
            j["weight_map"][moved] = shard[1];
            std::ofstream(d / "model.safetensors.index.json") << j.dump();
        },
        "the map says");
    refused(
        "unlisted",
        [&](const fs::path& d) {
            json j = index;
            j["weight_map"].erase(moved);
            std::ofstream(d / "model.safetensors.index.json") << j.dump();
        },
        "is not in the weight_map");
    refused(
        "twice",
        [&](const fs::path& d) {
            auto both = parts[1];
            both.push_back(parts[0].front());
            write_safetensors(d / shard[1], both);
        },
        "is also in");
    fs::remove_all(dir);
}

}  // namespace
