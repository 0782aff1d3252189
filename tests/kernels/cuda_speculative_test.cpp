// Speculative decoding of one sequence on the CUDA backend: a verification pass keeps the conv states
// of its tokens, and a truncate() back into it leaves the state a fresh evaluation of the kept tokens
// gives, whether the next evaluation is plain, keeps states again (it starts from the kept snapshot
// without a copy) or follows a save and restore (those two give the plain one's logits); a Session
// with prompt lookup generates the greedy tokens of plain decoding, except after a near-tie (top two
// logits within 0.05). Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/device.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "models/model.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

namespace cera {
namespace {

std::string model_path() { return test::data_path("fixtures/tiny-lfm2/model-Q4_0.gguf"); }

std::shared_ptr<Engine> cuda_engine() { return Engine::load(model_path(), {.device = "cuda", .n_ctx = 512}); }

// A story in the fixture model's style; told more than once, it gives prompt lookup drafts to verify.
const char* const kStory =
    "Once upon a time, there was a little dog named Max. Max liked to run in the park with his friend, a "
    "small cat called Mia. One day, Max found a red ball under a big tree. He wanted to show it to Mia, so "
    "he ran all the way home. Mia was happy to see the ball, and they played together until the sun went "
    "down.";

float top2_gap(const float* logits, size_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        if (logits[i] > a)
            b = a, a = logits[i];
        else if (logits[i] > b)
            b = logits[i];
    }
    return a - b;
}

TEST(CudaSpeculative, TruncateAfterKeptStatesMatchesAFreshEvaluation) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    auto engine = cuda_engine();
    const Model& model = *engine->impl().model;
    const std::vector<int32_t> prompt = engine->tokenize(kStory, true);
    ASSERT_GE(prompt.size(), 52u);
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
    const std::vector<int32_t> rest(prompt.begin() + 40, prompt.begin() + 52);
    const std::vector<int32_t> other = {11, 500, 77, 1200};
    const size_t n_vocab = size_t(engine->info().n_vocab);
    for (int32_t keep = 0; keep <= int32_t(rest.size()); keep += 3) {
        std::vector<int32_t> seq = head;
        seq.insert(seq.end(), rest.begin(), rest.begin() + keep);
        std::vector<float> want(n_vocab * other.size());
        auto fresh = model.create_state(256);
        fresh->eval({.tokens = seq});
        fresh->eval({.tokens = other, .all_logits = true, .logits = want.data()});
        std::vector<float> plain;
        for (const std::string how : {"plain", "kept", "saved"}) {
            auto st = model.create_state(256);
            st->eval({.tokens = head});
            st->eval({.tokens = rest, .keep_states = true});
            st->truncate(40 + keep);
            if (how == "saved") {
                std::vector<uint8_t> bytes;
                st->save_state(bytes);
                st = model.create_state(256);
                st->restore_state(bytes);
            }
            std::vector<float> got(want.size());
            st->eval({.tokens = other, .all_logits = true, .logits = got.data(), .keep_states = how == "kept"});
            // The fresh state batched its tokens otherwise (other kernels: products of more than 8 tokens
            // go through F16 tensor-core products), so the logits agree to that rounding, ~0.1 here; a
            // state from the wrong position is off by whole units.
            float worst = 0, from_plain = 0;
            for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
            EXPECT_LT(worst, 0.5f) << "kept " << keep << ", then " << how;
            if (how == "plain") plain = got;
            for (size_t i = 0; i < got.size(); ++i) from_plain = std::max(from_plain, std::abs(got[i] - plain[i]));
            EXPECT_LT(from_plain, 1e-3f) << "kept " << keep << ", then " << how << ", against plain";
        }
    }
}

TEST(CudaSpeculative, PromptLookupGivesThePlainGreedyTokens) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    auto engine = cuda_engine();
    // A text that repeats itself, so that lookup drafts and most drafts are partly rejected.
    const std::string text = std::string(kStory) + "\n" + kStory + "\n" + kStory;
    GenerateOptions g;
    g.max_tokens = 96, g.ignore_eos = true, g.sampling.temperature = 0.0f;
    struct Ids final : Sink {
        std::vector<int32_t> ids;
        void on_text(std::string_view) override {}
        void on_token(int32_t t) override { ids.push_back(t); }
    };
    Session plain(engine);
    plain.append_text(text);
    Ids want;
    plain.generate(g, want);
    for (int draft_max : {3, 8}) {
        Session s(engine);
        s.append_text(text);
        GenerateOptions gs = g;
        gs.speculative.lookup_ngram = 3, gs.speculative.draft_max = draft_max;
        Ids got;
        const GenerationResult r = s.generate(gs, got);
        EXPECT_GT(r.drafted_tokens, r.accepted_tokens) << "draft max " << draft_max << ": no rejected draft";
        EXPECT_GT(r.accepted_tokens, 0) << "draft max " << draft_max;
        ASSERT_EQ(got.ids.size(), want.ids.size());
        const auto diff = std::mismatch(got.ids.begin(), got.ids.end(), want.ids.begin());
        if (diff.first == got.ids.end()) continue;
        // A divergence must follow a near-tie of the plain run.
        const size_t at = size_t(diff.first - got.ids.begin());
        std::vector<int32_t> prefix = engine->tokenize(text, true);
        prefix.insert(prefix.end(), want.ids.begin(), want.ids.begin() + int64_t(at));
        auto st = engine->impl().model->create_state(512);
        std::vector<float> logits(size_t(engine->info().n_vocab));
        st->eval({.tokens = prefix, .logits = logits.data()});
        EXPECT_LT(top2_gap(logits.data(), logits.size()), 0.05f)
            << "draft max " << draft_max << " diverges at token " << at;
    }
}

}  // namespace
}  // namespace cera
