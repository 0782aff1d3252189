// The kivi4 KV cache (keys per channel over groups of 64 tokens, values per token) in a sequence's
// state: the same logits however the tokens come in steps (the prompt at once, in chunks, one a step),
// a saved and restored state going on exactly as the original, speculative decoding giving plain greedy
// output, a context shift re-coding the moved keys, and the types refused where they do not run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "models/batch_state.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

std::string model_path(const std::string& name) {
    return name == "stories260K" ? test::source_path("models/stories260K.gguf")
                                 : test::data_path("fixtures/" + name + "/model.gguf");
}

std::unique_ptr<Model> load_kivi(const std::string& name, GgmlType k = GgmlType::kQ4_CH,
                                 GgmlType v = GgmlType::kQ4_KV) {
    ModelOptions o;
    o.n_threads = 2;
    o.kv_type_k = k, o.kv_type_v = v;
    return load_model(model_path(name), o);
}

std::vector<int32_t> some_tokens(int n, int32_t n_vocab) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(int32_t((uint32_t(i) * 2654435761u >> 7) % uint32_t(n_vocab - 2) + 1));
    return t;
}

// Logits of every position, the tokens given `step` at a time.
std::vector<float> run(const Model& m, const std::vector<int32_t>& tokens, size_t step) {
    const size_t n_vocab = size_t(m.info().n_vocab);
    std::vector<float> out(tokens.size() * n_vocab);
    auto st = m.create_state(256);
    for (size_t i = 0; i < tokens.size(); i += step) {
        const size_t n = std::min(step, tokens.size() - i);
        st->eval({.tokens = {tokens.data() + i, n}, .all_logits = true, .logits = out.data() + i * n_vocab});
    }
    return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

class KiviModels : public ::testing::TestWithParam<const char*> {};

// A query reads its own group's keys as Q8_0 rows and the full groups before as codes, whichever step stored
// them: the prompt at once, in chunks that end inside groups, or one token a step give the same logits
// up to the summation order of the matrix products (as an F32 cache does).
TEST_P(KiviModels, StepsDoNotChangeTheLogits) {
    auto m = load_kivi(GetParam());
    auto f32 = load_kivi(GetParam(), GgmlType::kF32, GgmlType::kF32);
    const std::vector<int32_t> tokens = some_tokens(150, int32_t(m->info().n_vocab));
    const std::vector<float> whole = run(*m, tokens, tokens.size());
    const double f32_spread = max_diff(run(*f32, tokens, tokens.size()), run(*f32, tokens, 1));
    for (size_t step : {size_t(1), size_t(37), size_t(64)}) {
        const double d = max_diff(whole, run(*m, tokens, step));
        std::printf("  %s: steps of %zu, max |dlogit| %.2e (F32 cache, steps of 1: %.2e)\n", GetParam(), step, d,
                    f32_spread);
        EXPECT_LE(d, std::max(1e-4, 4 * f32_spread)) << "steps of " << step;
    }
}

// A state saved inside a group and restored goes on as the original does, bit for bit (the open group's
// Q8_0 rows are in the saved bytes), and a state saved at a group's end too.
TEST_P(KiviModels, RestoredStatesGoOnExactly) {
    auto m = load_kivi(GetParam());
    const size_t n_vocab = size_t(m->info().n_vocab);
    const std::vector<int32_t> tokens = some_tokens(160, int32_t(n_vocab));
    for (size_t at : {size_t(100), size_t(128), size_t(30)}) {
        auto a = m->create_state(256);
        a->eval({.tokens = {tokens.data(), at}});
        std::vector<uint8_t> saved;
        a->save_state(saved);
        std::vector<float> la((tokens.size() - at) * n_vocab), lb(la.size());
        a->eval({.tokens = {tokens.data() + at, tokens.size() - at}, .all_logits = true, .logits = la.data()});
        auto b = m->create_state(256);
        b->eval({.tokens = {tokens.data(), 7}});  // something else first: the restore replaces it
        b->restore_state(saved);
        b->eval({.tokens = {tokens.data() + at, tokens.size() - at}, .all_logits = true, .logits = lb.data()});
        EXPECT_EQ(la, lb) << "saved at " << at;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KiviModels, ::testing::Values("stories260K", "tiny-lfm2", "tiny-qwen3"));

std::vector<int32_t> greedy(const std::shared_ptr<Engine>& e, const std::string& prompt, const SpeculativeOptions& spec,
                            GenerationResult* res = nullptr) {
    Session s(e);
    s.append_text(prompt);
    GenerateOptions g;
    g.max_tokens = 80;
    g.ignore_eos = true;
    g.sampling.temperature = 0.0f;
    g.speculative = spec;
    struct Collect : Sink {
        std::vector<int32_t> ids;
        void on_text(std::string_view) override {}
        void on_token(int32_t t) override { ids.push_back(t); }
    } sink;
    const GenerationResult r = s.generate(g, sink);
    if (res) *res = r;
    return sink.ids;
}

// Drafts that cross a group's end and are rejected roll back into the group before: speculative greedy
// output equals plain greedy output, by prompt lookup and with a draft model.
TEST(KiviCache, SpeculativeGreedyEqualsPlainGreedy) {
    const EngineOptions o{.device = "cpu",
                          .threads = 2,
                          .n_ctx = 512,
                          .kv_type_k = KvCacheType::kKivi4,
                          .kv_type_v = KvCacheType::kKivi4};
    auto e = Engine::load(model_path("tiny-lfm2"), o);
    auto draft = Engine::load(model_path("tiny-qwen3"), {.device = "cpu", .threads = 2, .n_ctx = 512});
    const std::string story =
        "Once upon a time, there was a little girl named Lily. She liked to play with her "
        "ball in the park. One day, she saw a big dog.";
    const std::string prompt = story + "\n" + story + "\n" + story.substr(0, 40);
    const std::vector<int32_t> plain = greedy(e, prompt, {});
    ASSERT_EQ(plain.size(), 80u);
    GenerationResult r;
    EXPECT_EQ(greedy(e, prompt, {.lookup_ngram = 3, .draft_max = 8}, &r), plain) << "prompt lookup";
    EXPECT_GT(r.accepted_tokens, 0);
    EXPECT_EQ(greedy(e, prompt, {.draft = draft, .draft_max = 6}, &r), plain) << "draft model";
    EXPECT_GT(r.drafted_tokens, r.accepted_tokens);
}

// A context shift reads the moved keys back (from the slot where one holds them, else decoded), ropes them to
// their new positions and codes their groups again: the next logits stay close to those of the same
// tokens evaluated afresh at those positions, as close as a kivi4 cache is to an F32 one.
TEST(KiviCache, ContextShiftRecodesTheMovedKeys) {
    auto m = load_kivi("stories260K");
    auto f32 = load_kivi("stories260K", GgmlType::kF32, GgmlType::kF32);
    const size_t n_vocab = size_t(m->info().n_vocab);
    const std::vector<int32_t> tokens = some_tokens(200, int32_t(n_vocab));
    constexpr int32_t kKeep = 5, kDiscard = 70;
    auto st = m->create_state(256);
    st->eval({.tokens = {tokens.data(), 150}});
    st->shift(kKeep, kDiscard);
    ASSERT_EQ(st->position(), 150 - kDiscard);
    std::vector<float> shifted(50 * n_vocab);
    st->eval({.tokens = {tokens.data() + 150, 50}, .all_logits = true, .logits = shifted.data()});
    // The same tokens afresh: the kept head, then what the shift moved, then the new ones.
    std::vector<int32_t> fresh(tokens.begin(), tokens.begin() + kKeep);
    fresh.insert(fresh.end(), tokens.begin() + kKeep + kDiscard, tokens.begin() + 200);
    auto tail = [&](const Model& model) {
        std::vector<float> all = run(model, fresh, fresh.size());
        return std::vector<float>(all.end() - 50 * ptrdiff_t(n_vocab), all.end());
    };
    const std::vector<float> want = tail(*m), exact = tail(*f32);
    double shift_err = 0, kivi_err = 0;
    for (size_t i = 0; i < want.size(); ++i)
        shift_err += std::fabs(shifted[i] - want[i]), kivi_err += std::fabs(want[i] - exact[i]);
    shift_err /= double(want.size()), kivi_err /= double(want.size());
    std::printf("  mean |dlogit| shifted vs fresh %.4f, fresh kivi4 vs F32 %.4f\n", shift_err, kivi_err);
    EXPECT_LT(shift_err, 2 * kivi_err);
    EXPECT_GT(shift_err, 0.0);
}

// The cache's memory against an F16 one at a 4,096-token context, the open groups counted: 4.5 bits an
// element of K and 4.25 of V, and two slots of 65 Q8_0 key rows a sequence and layer (docs/kv-cache.md).
TEST(KiviCache, MemoryAgainstF16) {
    auto pool = [](GgmlType k, GgmlType v) {
        ModelOptions o;
        o.n_threads = 1;
        o.kv_type_k = k, o.kv_type_v = v;
        const auto m = load_model(model_path("stories260K"), o);  // no short-conv states in the pool
        BatchStateOptions bo;
        bo.max_seqs = 1, bo.kv_tokens = 4096, bo.block_size = 64;
        BatchState b(*m, bo);
        return double(b.pool_bytes());
    };
    const double f16 = pool(GgmlType::kF16, GgmlType::kF16), kivi = pool(GgmlType::kQ4_CH, GgmlType::kQ4_KV);
    const double width = 32, layers = 5;  // stories260K: 4 KV heads of 8, 5 layers
    EXPECT_EQ(f16, 4096 * width * 2 * 2 * layers);
    EXPECT_EQ(kivi, (4096 * width * (4.5 + 4.25) / 8 + 2 * 65 * width * 8.5 / 8) * layers);
    std::printf("  kivi4 at 4,096 tokens: %.3fx smaller than F16\n", f16 / kivi);
    EXPECT_GE(f16 / kivi, 3.5);
}

TEST(KiviCache, RefusedWhereItDoesNotRun) {
    auto code_of = [](const std::function<void()>& f, const char* word) {
        try {
            f();
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
            return e.code();
        }
        ADD_FAILURE() << "no error";
        return ErrorCode::kCancelled;
    };
    EXPECT_EQ(code_of([] { load_kivi("tiny-lfm2", GgmlType::kQ4_0, GgmlType::kQ4_CH); }, "keys only"),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(code_of(
                  [] {
                      ModelOptions o;
                      o.device = DeviceKind::kCuda;
                      o.kv_type_k = GgmlType::kQ4_CH, o.kv_type_v = GgmlType::kQ4_KV;
                      load_model(model_path("tiny-lfm2"), o);
                  },
                  "kivi4"),
              ErrorCode::kUnsupported);
    EXPECT_EQ(parse_kv_cache_type("kivi4"), KvCacheType::kKivi4);
    EXPECT_STREQ(kv_cache_type_name(KvCacheType::kKivi4), "kivi4");
}

}  // namespace
}  // namespace cera
