// Model loading and state handling: bad files give clear errors naming the key or
// tensor (built by copying a fixture through the GGUF writer with one thing
// changed), context overflow and bad ids are rejected without touching the
// state, save/restore and F16 KV caches reproduce the F32 results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

std::string fixture(const std::string& model) { return test::data_path("fixtures/" + model + "/model.gguf"); }

struct Patch {
    std::function<bool(const std::string& key, gguf::Value& v)> kv;          // false: drop the key
    std::function<bool(const gguf::TensorInfo& t, gguf::Writer& w)> tensor;  // true: handled (added or dropped)
    std::vector<std::pair<std::string, gguf::Value>> extra_kv;
};

// Copies `src` with the patch applied to a temporary file and returns its path.
std::string patched_copy(const std::string& src, const Patch& p, const std::string& tag) {
    auto f = gguf::File::open(src);
    gguf::Writer w;
    for (const auto& [key, value] : f->metadata()) {
        gguf::Value v = value;
        if (p.kv && !p.kv(key, v)) continue;
        w.set(key, v);
    }
    for (const auto& [key, value] : p.extra_kv) w.set(key, value);
    for (const gguf::TensorInfo& t : f->tensors()) {
        if (p.tensor && p.tensor(t, w)) continue;
        w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(t.data, t.n_bytes));
    }
    const std::string path = std::string(CERA_BINARY_DIR) + "/model_load_test_" + tag + ".gguf";
    w.write(path);
    return path;
}

// Loads `path` and returns the error, failing the test when loading succeeds.
Error load_error(const std::string& path) {
    try {
        ModelOptions o;
        o.n_threads = 1;
        load_model(path, o);
    } catch (const Error& e) {
        std::printf("  error: %s\n", e.what());
        return e;
    }
    ADD_FAILURE() << "loading " << path << " did not throw";
    return Error(ErrorCode::kInvalidArgument, "");
}

bool contains(const Error& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }

TEST(ModelLoad, UnknownArchitecture) {
    Patch p;
    p.kv = [](const std::string& k, gguf::Value& v) {
        if (k == "general.architecture") v = gguf::value_string("mamba9");
        return true;
    };
    Error e = load_error(patched_copy(fixture("tiny-llama-random"), p, "arch"));
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(e, "mamba9"));
}

TEST(ModelLoad, MissingTensor) {
    Patch p;
    p.tensor = [](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == "blk.1.attn_q.weight"; };
    Error e = load_error(patched_copy(fixture("tiny-llama-random"), p, "missing"));
    EXPECT_EQ(e.code(), ErrorCode::kMissing);
    EXPECT_TRUE(contains(e, "blk.1.attn_q.weight"));
}

TEST(ModelLoad, WrongTensorShape) {
    Patch p;
    p.tensor = [](const gguf::TensorInfo& t, gguf::Writer& w) {
        if (t.name != "blk.0.ffn_up.weight") return false;
        // {128, 256} -> {128, 255}: one output row short.
        w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1] - 1},
                     std::span<const uint8_t>(t.data, t.n_bytes / size_t(t.ne[1]) * size_t(t.ne[1] - 1)));
        return true;
    };
    Error e = load_error(patched_copy(fixture("tiny-llama-random"), p, "shape"));
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile);
    EXPECT_TRUE(contains(e, "blk.0.ffn_up.weight"));
    EXPECT_TRUE(contains(e, "{128, 255}"));
    EXPECT_TRUE(contains(e, "{128, 256}"));
}

TEST(ModelLoad, MissingKey) {
    Patch p;
    p.kv = [](const std::string& k, gguf::Value&) { return k != "llama.embedding_length"; };
    Error e = load_error(patched_copy(fixture("tiny-llama-random"), p, "key"));
    EXPECT_EQ(e.code(), ErrorCode::kMissing);
    EXPECT_TRUE(contains(e, "llama.embedding_length"));
}

TEST(ModelLoad, EmbeddingNotDivisibleByHeads) {
    Patch p;
    p.kv = [](const std::string& k, gguf::Value& v) {
        if (k == "llama.attention.key_length" || k == "llama.attention.value_length") return false;
        if (k == "llama.attention.head_count") v = gguf::value_u32(3);
        if (k == "llama.attention.head_count_kv") v = gguf::value_u32(1);
        return true;
    };
    Error e = load_error(patched_copy(fixture("tiny-llama-random"), p, "heads"));
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile);
    EXPECT_TRUE(contains(e, "llama.embedding_length"));
    EXPECT_TRUE(contains(e, "head_count"));
}

TEST(ModelLoad, HeadCountKvArrayOfWrongLength) {
    Patch p;
    p.kv = [](const std::string& k, gguf::Value& v) {
        if (k == "lfm2.attention.head_count_kv") {
            const int32_t xs[] = {0, 2, 0};
            v = gguf::value_i32_array(xs);
        }
        return true;
    };
    Error e = load_error(patched_copy(fixture("tiny-lfm2vl-random"), p, "kvlen"));
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile);
    EXPECT_TRUE(contains(e, "lfm2.attention.head_count_kv"));
    EXPECT_TRUE(contains(e, "3 entries"));
}

TEST(ModelLoad, Lfm2vlTextModelRuns) {
    ModelOptions o;
    o.n_threads = 1;
    auto m = load_model(fixture("tiny-lfm2vl-random"), o);
    EXPECT_EQ(m->info().arch, "lfm2");
    EXPECT_EQ(m->info().n_vocab, 4100);
    EXPECT_EQ(m->info().n_attn_layers, 2);
    EXPECT_EQ(m->info().n_conv_layers, 2);
    auto st = m->create_state(16);
    std::vector<float> logits(4100);
    const int32_t ids[] = {1, 397, 398};
    st->eval({.tokens = ids, .logits = logits.data()});
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

std::unique_ptr<Model> tiny_lfm2(GgmlType kv = GgmlType::kF32) {
    ModelOptions o;
    o.n_threads = 1;
    o.kv_type_k = o.kv_type_v = kv;
    o.n_batch = 16;
    return load_model(fixture("tiny-lfm2"), o);
}

TEST(ModelState, RejectsContextOverflowAndBadIdsWithoutChangingState) {
    auto m = tiny_lfm2();
    auto st = m->create_state(8);
    std::vector<int32_t> ids = {1, 397, 398, 263, 378, 16, 390, 284, 263, 356};
    try {
        st->eval({.tokens = ids});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
        std::printf("  error: %s\n", e.what());
    }
    EXPECT_EQ(st->position(), 0);
    const int32_t bad[] = {1, 4096};
    EXPECT_THROW(st->eval({.tokens = bad}), Error);
    const int32_t neg[] = {-1};
    EXPECT_THROW(st->eval({.tokens = neg}), Error);
    EXPECT_EQ(st->position(), 0);
}

TEST(ModelState, SaveRestoreReproducesLogits) {
    auto m = tiny_lfm2();
    const int64_t n_vocab = m->info().n_vocab;
    std::vector<int32_t> prompt = {1, 397, 398, 263, 378, 16, 390, 284, 263, 356};
    std::vector<int32_t> more = {455, 366, 376};
    auto st = m->create_state(64);
    st->eval({.tokens = prompt});
    std::vector<uint8_t> saved;
    st->save_state(saved);
    EXPECT_EQ(saved.size(), st->state_size());
    std::vector<float> a(more.size() * n_vocab), b(a.size()), c(a.size());
    st->eval({.tokens = more, .all_logits = true, .logits = a.data()});
    st->restore_state(saved);
    EXPECT_EQ(st->position(), int32_t(prompt.size()));
    st->eval({.tokens = more, .all_logits = true, .logits = b.data()});
    EXPECT_EQ(a, b);
    auto other = m->create_state(64);
    other->restore_state(saved);
    other->eval({.tokens = more, .all_logits = true, .logits = c.data()});
    EXPECT_EQ(a, c);
    // A state that cannot hold the saved position refuses it.
    auto small = m->create_state(4);
    EXPECT_THROW(small->restore_state(saved), Error);
    saved[0] ^= 1;
    EXPECT_THROW(other->restore_state(saved), Error);
}

TEST(ModelState, ResetStartsOver) {
    auto m = tiny_lfm2();
    const int64_t n_vocab = m->info().n_vocab;
    std::vector<int32_t> prompt = {1, 397, 398, 263, 378};
    auto st = m->create_state(32);
    std::vector<float> a(n_vocab), b(n_vocab);
    st->eval({.tokens = prompt, .logits = a.data()});
    st->reset();
    EXPECT_EQ(st->position(), 0);
    st->eval({.tokens = prompt, .logits = b.data()});
    EXPECT_EQ(a, b);
}

TEST(ModelState, F16KvCacheCloseToF32) {
    auto m32 = tiny_lfm2(GgmlType::kF32);
    auto m16 = tiny_lfm2(GgmlType::kF16);
    nlohmann::json pj = nlohmann::json::parse(test::read_text(test::data_path("fixtures/tiny-lfm2/ref/prompt_2.json")));
    std::vector<int32_t> ids = pj["ids"].get<std::vector<int32_t>>();
    const int64_t n_vocab = m32->info().n_vocab;
    std::vector<float> a(ids.size() * n_vocab), b(a.size());
    m32->create_state(256)->eval({.tokens = ids, .all_logits = true, .logits = a.data()});
    m16->create_state(256)->eval({.tokens = ids, .all_logits = true, .logits = b.data()});
    double max_d = 0;
    for (size_t i = 0; i < a.size(); ++i) max_d = std::max(max_d, double(std::fabs(a[i] - b[i])));
    std::printf("  F16 vs F32 KV cache, 184 positions: max |dlogit| = %.3g\n", max_d);
    EXPECT_LT(max_d, 2e-2);
}

// The other cache types against F32 keys and values over the 184 positions of a fixture prompt: the mean
// |dlogit| and the top-1 agreement, bounded per type by its rounding (BF16 8 bits of mantissa, Q8_0 and
// Q4_0 blocks of 32 with one scale), and keys and values of different types.
TEST(ModelState, BlockKvCachesCloseToF32) {
    nlohmann::json pj = nlohmann::json::parse(test::read_text(test::data_path("fixtures/tiny-lfm2/ref/prompt_2.json")));
    const std::vector<int32_t> ids = pj["ids"].get<std::vector<int32_t>>();
    auto logits = [&](GgmlType k, GgmlType v, bool rotate = false) {
        ModelOptions o;
        o.n_threads = 1;
        o.kv_type_k = k, o.kv_type_v = v;
        o.kv_rotate_k = o.kv_rotate_v = rotate;
        auto m = load_model(fixture("tiny-lfm2"), o);
        std::vector<float> out(ids.size() * size_t(m->info().n_vocab));
        m->create_state(256)->eval({.tokens = ids, .all_logits = true, .logits = out.data()});
        return out;
    };
    const std::vector<float> ref = logits(GgmlType::kF32, GgmlType::kF32);
    const int64_t n_vocab = int64_t(ref.size() / ids.size());
    struct Case {
        GgmlType k, v;
        double mean, agree;  // bounds: mean |dlogit| below, top-1 agreement above
        bool rotate = false;  // tq4 (tq3): Q4_0 (Q3_KV) blocks of rotated heads
    };
    for (const Case& c :
         {Case{GgmlType::kBF16, GgmlType::kBF16, 0.02, 0.97}, Case{GgmlType::kQ8_0, GgmlType::kQ8_0, 0.02, 0.97},
          Case{GgmlType::kQ4_0, GgmlType::kQ4_0, 0.15, 0.85}, Case{GgmlType::kQ8_0, GgmlType::kF16, 0.02, 0.97},
          Case{GgmlType::kQ4_0, GgmlType::kQ4_0, 0.15, 0.85, true},
          Case{GgmlType::kQ3_KV, GgmlType::kQ3_KV, 0.2, 0.9, true},
          Case{GgmlType::kQ4_CH, GgmlType::kQ4_KV, 0.15, 0.85}}) {
        const std::vector<float> got = logits(c.k, c.v, c.rotate);
        double sum = 0;
        int agree = 0;
        for (size_t t = 0; t < ids.size(); ++t) {
            const float* a = ref.data() + t * size_t(n_vocab);
            const float* b = got.data() + t * size_t(n_vocab);
            for (int64_t i = 0; i < n_vocab; ++i) sum += std::fabs(a[i] - b[i]);
            agree += std::max_element(a, a + n_vocab) - a == std::max_element(b, b + n_vocab) - b;
        }
        const double mean = sum / double(ref.size()), frac = double(agree) / double(ids.size());
        std::printf("  %s%s/%s vs F32 KV cache: mean |dlogit| %.4f, top-1 agreement %.3f\n", c.rotate ? "rotated " : "",
                    type_name(c.k), type_name(c.v), mean, frac);
        EXPECT_LT(mean, c.mean) << type_name(c.k);
        EXPECT_GT(frac, c.agree) << type_name(c.k);
    }
}

}  // namespace
}  // namespace cera
