// Synthetic models: for every architecture, a model synthesized in a fixture's
// shape has exactly the fixture's tensors (names, shapes) and metadata keys, as
// written by the real converters; bytes are deterministic in the seed and
// independent of the thread count; weights have the intended statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cera/error.h"
#include "core/quant/quant.h"
#include "gguf/gguf.h"
#include "synth/synth.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace cera::gguf;

namespace {

std::string tmp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_synth_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string slurp(const std::string& path) { return cera::test::read_text(path); }

// The config that reproduces a fixture's shape, read from the fixture itself.
SynthConfig config_like(const File& f) {
    const std::string a = f.architecture();
    auto k = [&](const char* s) { return a + "." + s; };
    SynthConfig c = synth_preset(a, "tiny");
    c.n_embd = f.get_i64(k("embedding_length"));
    c.n_layer = f.get_i64(k("block_count"));
    c.n_head = f.get_i64(k("attention.head_count"));
    c.n_ff = f.get_i64(k("feed_forward_length"));
    c.n_ctx = f.get_i64(k("context_length"));
    c.rope_freq_base = f.get_f32(k("rope.freq_base"));
    c.norm_eps = f.get_f32(k("attention.layer_norm_rms_epsilon"));
    c.head_dim = f.get_i64(k("attention.key_length"), 0);
    c.tied = f.find_tensor("output.weight") == nullptr;
    const Value* kv = f.find(k("attention.head_count_kv"));
    if (kv->type == ValueType::kArray) {
        c.attn_layers.clear();
        auto per_layer = f.get_int_array(k("attention.head_count_kv"));
        for (size_t il = 0; il < per_layer.size(); ++il) {
            if (per_layer[il] == 0) continue;
            c.attn_layers.push_back(int64_t(il));
            c.n_head_kv = per_layer[il];
        }
        c.l_cache = f.get_i64(k("shortconv.l_cache"));
    } else {
        c.n_head_kv = kv->as_int();
    }
    if (a == "lfm2moe") {
        c.n_expert = f.get_i64(k("expert_count"));
        c.n_expert_used = f.get_i64(k("expert_used_count"));
        c.n_ff_exp = f.get_i64(k("expert_feed_forward_length"));
        c.n_dense_lead = f.get_i64(k("leading_dense_block_count"));
    }
    if (a == "granite") {
        c.attention_scale = f.get_f32(k("attention.scale"));
        c.embedding_scale = f.get_f32(k("embedding_scale"));
        c.residual_scale = f.get_f32(k("residual_scale"));
        c.logit_scale = f.get_f32(k("logit_scale"));
    }
    return c;
}

double stddev(const std::vector<float>& x, double* mean_out = nullptr) {
    double s = 0, s2 = 0;
    for (float v : x) s += v, s2 += double(v) * v;
    const double mean = s / double(x.size());
    if (mean_out) *mean_out = mean;
    return std::sqrt(s2 / double(x.size()) - mean * mean);
}

std::vector<float> dequantize(const TensorInfo& t) {
    std::vector<float> out(size_t(t.n_elements()));
    cera::dequantize_row_ref(t.type, t.data, out.data(), t.n_elements());
    return out;
}

}  // namespace

TEST(GgufSynth, EachArchitectureMatchesItsFixtureLayout) {
    const char* fixtures[] = {"tiny-lfm2", "tiny-lfm2moe", "tiny-llama-random", "tiny-qwen2-random", "tiny-qwen3",
                              "tiny-granite-random"};
    for (const char* name : fixtures) {
        SCOPED_TRACE(name);
        const std::string dir = cera::test::data_path(std::string("fixtures/") + name);
        auto fixture = File::open(dir + "/model.gguf");
        auto manifest = nlohmann::json::parse(slurp(dir + "/model.gguf.manifest.json"));
        const std::string out = tmp_path(std::string(name) + ".gguf");
        synthesize(config_like(*fixture), fixture.get(), out, 2);
        auto f = File::open(out);

        // Tensors: the same names and shapes, F32 like the fixture.
        std::map<std::string, std::vector<int64_t>> want, got;
        for (const auto& t : manifest.at("tensors")) want[t.at("name")] = t.at("shape").get<std::vector<int64_t>>();
        for (const auto& t : f->tensors()) {
            got[t.name] = t.ne;
            EXPECT_EQ(t.type, cera::GgmlType::kF32) << t.name;
        }
        EXPECT_EQ(got, want);

        // Metadata: every key of the fixture, with the same value (floats to f32 precision).
        for (const auto& [key, value] : manifest.at("kv").items()) {
            if (key == "general.name" || key == "general.size_label") continue;
            const Value* v = f->find(key);
            ASSERT_NE(v, nullptr) << "missing key " << key;
            const Value* ref = fixture->find(key);
            EXPECT_EQ(v->type, ref->type) << key;
            if (v->type == ValueType::kArray) {
                EXPECT_EQ(v->as_array().items.size(), ref->as_array().items.size()) << key;
                EXPECT_EQ(v->as_array().elem_type, ref->as_array().elem_type) << key;
                if (v->as_array().items.size() < 64)
                    for (size_t i = 0; i < v->as_array().items.size(); ++i)
                        EXPECT_TRUE(v->as_array().items[i].v == ref->as_array().items[i].v) << key << "[" << i << "]";
            } else if (v->is_float()) {
                EXPECT_FLOAT_EQ(float(v->as_double()), float(ref->as_double())) << key;
            } else {
                EXPECT_TRUE(v->v == ref->v) << key;
            }
        }
        std::remove(out.c_str());
    }
}

TEST(GgufSynth, DeterministicInSeedAndThreadCount) {
    auto vocab = File::open(cera::test::data_path("fixtures/tiny-lfm2/model.gguf"));
    SynthConfig c = synth_preset("lfm2moe", "tiny");
    c.type = cera::GgmlType::kQ4_0;
    const std::string a = tmp_path("a.gguf"), b = tmp_path("b.gguf"), d = tmp_path("d.gguf");
    synthesize(c, vocab.get(), a, 1);
    synthesize(c, vocab.get(), b, 2);
    EXPECT_EQ(slurp(a), slurp(b));
    c.seed = 43;
    synthesize(c, vocab.get(), d, 2);
    const std::string sa = slurp(a), sd = slurp(d);
    ASSERT_EQ(sa.size(), sd.size());
    auto fa = File::open(a), fd = File::open(d);
    EXPECT_EQ(sa.substr(0, fa->data_offset()), sd.substr(0, fd->data_offset()));  // same header
    for (size_t i = 0; i < fa->tensors().size(); ++i)
        EXPECT_NE(std::memcmp(fa->tensors()[i].data, fd->tensors()[i].data, fa->tensors()[i].n_bytes), 0)
            << fa->tensors()[i].name;
    for (const auto& p : {a, b, d}) std::remove(p.c_str());
}

TEST(GgufSynth, QuantizedWeightsHaveTheIntendedStatistics) {
    auto vocab = File::open(cera::test::data_path("fixtures/tiny-lfm2/model.gguf"));
    SynthConfig c = synth_preset("lfm2", "tiny");
    c.type = cera::GgmlType::kQ4_K;
    c.embd_type = cera::GgmlType::kQ8_0;
    const std::string out = tmp_path("q.gguf");
    synthesize(c, vocab.get(), out);
    auto f = File::open(out);
    EXPECT_EQ(f->get_u32("general.file_type"), 15u);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), vocab->get_string_array("tokenizer.ggml.tokens"));
    EXPECT_EQ(f->get_u32("lfm2.vocab_size"), 4096u);
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied like the released LFM2 models
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type, cera::GgmlType::kQ8_0);
    EXPECT_EQ(f->find_tensor("blk.0.shortconv.in_proj.weight")->type, cera::GgmlType::kQ4_K);
    EXPECT_EQ(f->find_tensor("blk.0.shortconv.conv.weight")->type, cera::GgmlType::kF32);
    EXPECT_EQ(f->find_tensor("blk.1.attn_q_norm.weight")->type, cera::GgmlType::kF32);

    double mean = 0;
    EXPECT_NEAR(stddev(dequantize(*f->find_tensor("blk.0.ffn_down.weight")), &mean), 0.02, 0.002);
    EXPECT_NEAR(mean, 0.0, 0.001);
    EXPECT_NEAR(stddev(dequantize(*f->find_tensor("token_embd.weight")), &mean), 0.02, 0.001);
    auto norm = dequantize(*f->find_tensor("blk.2.ffn_norm.weight"));
    EXPECT_NEAR(stddev(norm, &mean), 0.02, 0.005);
    EXPECT_NEAR(mean, 1.0, 0.005);
    std::remove(out.c_str());
}

TEST(GgufSynth, BlockSizeFallbackLikeLlamaQuantize) {
    auto vocab = File::open(cera::test::data_path("fixtures/tiny-lfm2/model.gguf"));
    SynthConfig c = synth_preset("llama", "tiny");
    c.n_embd = 96;  // not a multiple of 256 (K-quants) nor... a multiple of 32
    c.n_head = 3;
    c.n_head_kv = 1;
    c.n_ff = 256;
    c.type = cera::GgmlType::kQ4_K;
    const std::string out = tmp_path("fb.gguf");
    synthesize(c, vocab.get(), out);
    auto f = File::open(out);
    EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, cera::GgmlType::kQ5_0);  // ne0 = 96
    EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, cera::GgmlType::kQ4_K);  // ne0 = 256
    EXPECT_EQ(f->get_u32("llama.rope.dimension_count"), 32u);
    std::remove(out.c_str());
}

// The Q4_K_M mixture picks the same type for every tensor as llama-quantize did for the fixtures:
// the dense one (Q6_K on the head, some ffn_down and an attn_v) and the 8-expert one (Q8_0 attn_k
// and attn_v, Q5_K attn_output, and the fallbacks of a 192-wide model).
TEST(GgufSynth, MediumMixtureMatchesLlamaQuantize) {
    for (const char* model : {"tiny-lfm2", "tiny-lfm2moe"}) {
        SCOPED_TRACE(model);
        auto ref = File::open(cera::test::data_path(std::string("fixtures/") + model + "/model-Q4_K_M.gguf"));
        SynthConfig c = config_like(*ref);
        c.type = cera::GgmlType::kQ4_K;
        c.mixture = cera::quantize::FileType::kQ4_K_M;
        const std::string out = tmp_path("km.gguf");
        synthesize(c, ref.get(), out, 2);
        auto f = File::open(out);
        ASSERT_EQ(f->tensors().size(), ref->tensors().size());
        int more_bits = 0;
        for (const auto& t : ref->tensors()) {
            const auto* mine = f->find_tensor(t.name);
            ASSERT_NE(mine, nullptr) << t.name;
            EXPECT_EQ(mine->type, t.type) << t.name;
            more_bits += t.type == cera::GgmlType::kQ6_K || t.type == cera::GgmlType::kQ8_0;
        }
        EXPECT_GE(more_bits, 3);  // the fixture exercises the rules
        std::remove(out.c_str());
    }
    auto ref = File::open(cera::test::data_path("fixtures/tiny-lfm2/model-Q4_K_M.gguf"));
    SynthConfig c = config_like(*ref);
    c.type = cera::GgmlType::kQ4_K;
    c.mixture = cera::quantize::FileType::kQ4_K_M;

    SynthConfig bad = c;
    bad.type = cera::GgmlType::kQ8_0;
    EXPECT_THROW(synthesize(bad, ref.get(), tmp_path("never.gguf")), cera::Error);
}

TEST(GgufSynth, BadConfigurationsAreRejected) {
    auto expect_error = [](SynthConfig c, cera::ErrorCode code, const char* needle) {
        try {
            synthesize(c, nullptr, tmp_path("never.gguf"));
            ADD_FAILURE() << "accepted: " << needle;
        } catch (const cera::Error& e) {
            EXPECT_EQ(e.code(), code) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    SynthConfig c = synth_preset("llama", "tiny");
    c.n_vocab = 100;
    SynthConfig bad = c;
    bad.n_head_kv = 3;
    expect_error(bad, cera::ErrorCode::kInvalidArgument, "n_head_kv");
    bad = c;
    bad.n_embd = 0;
    expect_error(bad, cera::ErrorCode::kInvalidArgument, "n_embd");
    bad = c;
    bad.type = cera::GgmlType::kIQ2_XXS;
    expect_error(bad, cera::ErrorCode::kUnsupported, "IQ2_XXS");
    bad = c;
    bad.n_vocab = 0;
    expect_error(bad, cera::ErrorCode::kInvalidArgument, "n_vocab");
    bad = synth_preset("lfm2", "tiny");
    bad.n_vocab = 100;
    bad.attn_layers = {7};
    expect_error(bad, cera::ErrorCode::kInvalidArgument, "attention layer");
    bad = synth_preset("lfm2moe", "tiny");
    bad.n_vocab = 100;
    bad.n_expert_used = 9;
    expect_error(bad, cera::ErrorCode::kInvalidArgument, "n_expert_used");
    EXPECT_THROW(synth_preset("gpt2", "tiny"), cera::Error);
    EXPECT_THROW(synth_preset("llama", "huge"), cera::Error);
    EXPECT_FALSE(fs::exists(tmp_path("never.gguf")));
}

TEST(GgufSynth, PresetsHaveTheBenchmarkShapes) {
    SynthConfig c = synth_preset("lfm2", "lfm2-1.2b");
    EXPECT_EQ(c.n_embd, 2048);
    EXPECT_EQ(c.n_layer, 16);
    EXPECT_EQ(c.n_head, 32);
    EXPECT_EQ(c.n_head_kv, 8);
    EXPECT_EQ(c.n_ff, 8192);
    EXPECT_EQ(c.attn_layers, (std::vector<int64_t>{2, 5, 8, 10, 12, 14}));
    c = synth_preset("lfm2", "lfm2-350m");
    EXPECT_EQ(c.n_embd, 1024);
    EXPECT_EQ(c.n_head, 16);
    EXPECT_EQ(c.n_ff, 4608);
    c = synth_preset("llama", "llama-1b");
    EXPECT_EQ(c.n_embd, 2048);
    EXPECT_EQ(c.n_head_kv, 8);
    EXPECT_EQ(c.n_ff, 8192);
}
