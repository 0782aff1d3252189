// Speculative decoding (SpeculativeOptions): greedy output equal to plain greedy output for every fixture
// model, by prompt lookup and with a draft model; the conv states of LFM2 rolled back to any position a
// verification passed (ModelState::truncate after EvalRequest::keep_states) giving the logits of a fresh
// evaluation; a session that stops inside a speculative step continuing as a plain one would; and sampled
// speculation drawing the second token from the model's exact marginal distribution (chi-square).
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "models/model.h"
#include "runtime/engine_impl.h"
#include "test_util.h"
#include "unit/speculative_stats.h"

namespace {

using cera::test::data_path;

std::shared_ptr<cera::Engine> load(const std::string& model) {
    return cera::Engine::load(data_path("fixtures/" + model + "/model.gguf"),
                              {.device = "cpu", .threads = 2, .n_ctx = 512});
}

std::string prompt_text(const std::string& model, int i) {
    return nlohmann::json::parse(cera::test::read_text(
        data_path("fixtures/" + model + "/ref/prompt_" + std::to_string(i) + ".json")))["text"]
        .get<std::string>();
}

struct Generated {
    std::vector<int32_t> tokens;
    cera::GenerationResult result;
};

class Collect : public cera::Sink {
 public:
    std::vector<int32_t> tokens;
    void on_text(std::string_view) override {}
    void on_token(int32_t t) override { tokens.push_back(t); }
};

Generated generate(const std::shared_ptr<cera::Engine>& engine, const std::string& prompt, int n,
                   const cera::SpeculativeOptions& spec, float temperature = 0.0f, uint64_t seed = 0,
                   int decode_ahead = -1) {
    cera::Session s(engine);
    s.append_text(prompt);
    cera::GenerateOptions g;
    g.max_tokens = n;
    g.ignore_eos = true;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.speculative = spec;
    g.decode_ahead = decode_ahead;
    Collect sink;
    Generated r;
    r.result = s.generate(g, sink);
    r.tokens = sink.tokens;
    return r;
}

const std::vector<std::string> kModels = {"tiny-lfm2",         "tiny-qwen3",        "tiny-lfm2moe",
                                          "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"};

class SpeculativeGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGreedy, EqualsPlainGreedyByLookupAndWithADraftModel) {
    const std::string model = GetParam();
    auto engine = load(model);
    // A story told twice: the second telling gives prompt lookup something to find.
    const std::string story = prompt_text(model, 2);
    const std::string prompt = story + "\n" + story.substr(0, story.size() / 2);
    const Generated plain = generate(engine, prompt, 64, {});
    ASSERT_EQ(plain.tokens.size(), 64u);

    const Generated lookup = generate(engine, prompt, 64, {.lookup_ngram = 3, .draft_max = 8});
    EXPECT_EQ(lookup.tokens, plain.tokens) << model << ": prompt lookup";
    EXPECT_GT(lookup.result.drafted_tokens, 0);
    EXPECT_GT(lookup.result.accepted_tokens, 0);
    EXPECT_EQ(lookup.result.decode_tokens, 63);  // every token after the prefill's
    EXPECT_LT(lookup.result.decode_steps, 63);

    // tiny-qwen3 drafts for the others, tiny-lfm2 (short-conv layers) for tiny-qwen3.
    auto draft = load(model == "tiny-qwen3" ? "tiny-lfm2" : "tiny-qwen3");
    const Generated drafted = generate(engine, prompt, 64, {.draft = draft, .draft_max = 6});
    EXPECT_EQ(drafted.tokens, plain.tokens) << model << ": draft model";
    EXPECT_GT(drafted.result.drafted_tokens, drafted.result.accepted_tokens);  // some rejected: rollbacks ran
    EXPECT_EQ(drafted.result.decode_tokens, 63);
    // Steps queued ahead (as on a device that runs behind the host): tiny-qwen3's drafts chain their steps.
    const Generated ahead = generate(engine, prompt, 64, {.draft = draft, .draft_max = 6}, 0.0f, 0, 1);
    EXPECT_EQ(ahead.tokens, plain.tokens) << model << ": draft model, steps queued ahead";
    EXPECT_EQ(ahead.result.drafted_tokens, drafted.result.drafted_tokens);
    EXPECT_EQ(ahead.result.accepted_tokens, drafted.result.accepted_tokens);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeGreedy, ::testing::ValuesIn(kModels));

// A model drafting for itself keeps every draft: a row's values do not depend on the other rows of its
// step. So each pass after the first begins with the last pass's final draft, which the draft has not
// evaluated: tiny-qwen3 evaluates it in one step with the target's token, tiny-lfm2 (recurrent) alone
// before it. Either way every draft stands and the tokens are the plain ones.
TEST(SpeculativeDraft, AModelDraftingForItselfKeepsEveryDraft) {
    for (const char* model : {"tiny-qwen3", "tiny-lfm2"}) {
        auto engine = load(model);
        auto draft = load(model);
        const std::string prompt = prompt_text(model, 0);
        const Generated plain = generate(engine, prompt, 48, {});
        for (const int ahead : {0, 1}) {
            SCOPED_TRACE(std::string(model) + (ahead ? ", steps queued ahead" : ""));
            const Generated self = generate(engine, prompt, 48, {.draft = draft, .draft_max = 5}, 0.0f, 0, ahead);
            EXPECT_EQ(self.tokens, plain.tokens);
            EXPECT_GE(self.result.drafted_tokens, 35);
            EXPECT_EQ(self.result.accepted_tokens, self.result.drafted_tokens);
        }
    }
}

// Keeping the conv states through a verification-sized evaluation, truncating back to each position, and
// evaluating on from there gives the logits a state that never went past that position gives: evaluating
// plainly, keeping states again (the run goes on from the kept state), or after a save and restore.
TEST(SpeculativeRollback, TruncateAfterKeptStatesMatchesAFreshEvaluation) {
    auto engine = load("tiny-lfm2");
    const cera::Model& model = *engine->impl().model;
    const std::vector<int32_t> prompt = engine->tokenize(prompt_text("tiny-lfm2", 2), true);
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 40);
    const std::vector<int32_t> rest(prompt.begin() + 40, prompt.begin() + 52);  // 12 tokens "verified"
    const std::vector<int32_t> other = {11, 500, 77, 1200};                     // a different continuation
    const size_t n_vocab = size_t(engine->info().n_vocab);
    for (int32_t keep = 0; keep <= int32_t(rest.size()); keep += 3) {
        std::vector<int32_t> seq = head;
        seq.insert(seq.end(), rest.begin(), rest.begin() + keep);
        std::vector<float> want(n_vocab * other.size());
        auto fresh = model.create_state(256);
        fresh->eval({.tokens = seq});
        fresh->eval({.tokens = other, .all_logits = true, .logits = want.data()});
        for (const char* then : {"plain", "kept", "saved"}) {
            auto st = model.create_state(256);
            ASSERT_TRUE(st->has_recurrent_state());
            st->eval({.tokens = head});
            EXPECT_EQ(st->rewind_floor(), 40);
            st->eval({.tokens = rest, .keep_states = true});
            EXPECT_EQ(st->rewind_floor(), 40);
            st->truncate(40 + keep);
            std::vector<float> got(n_vocab * other.size());
            const std::string how = then;
            if (how == "saved") {
                std::vector<uint8_t> bytes;
                st->save_state(bytes);
                st = model.create_state(256);
                st->restore_state(bytes);
            }
            st->eval({.tokens = other, .all_logits = true, .logits = got.data(), .keep_states = how == "kept"});
            float worst = 0;
            for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
            EXPECT_LT(worst, 1e-4f) << "kept " << keep << ", then " << how;
        }
    }
    // Runs of kept states add up across evaluations, and anything else ends them.
    auto st = model.create_state(256);
    st->eval({.tokens = head});
    st->eval({.tokens = std::span(rest).first(4), .keep_states = true});
    st->eval({.tokens = std::span(rest).subspan(4, 4), .keep_states = true});
    EXPECT_EQ(st->rewind_floor(), 40);
    st->truncate(42);
    st->eval({.tokens = std::span(rest).subspan(2, 1)});
    EXPECT_EQ(st->rewind_floor(), 43);
    try {
        st->truncate(41);
        ADD_FAILURE() << "truncate below the floor";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kInvalidArgument);
    }
}

// A greedy verification brings back each row's arg-max (EvalRequest::argmax), alone or with the rows:
// the same ids as the arg-max of the logits (the lowest id among the largest, as a greedy Sampler picks),
// and the same state after it, kept conv states included.
TEST(SpeculativeVerify, ArgmaxRowsAreTheLogitsArgmax) {
    for (const char* name : {"tiny-lfm2", "tiny-qwen3"}) {
        auto engine = load(name);
        const cera::Model& model = *engine->impl().model;
        const std::vector<int32_t> prompt = engine->tokenize(prompt_text(name, 2), true);
        const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 30);
        const std::vector<int32_t> rest(prompt.begin() + 30, prompt.begin() + 39);  // 9 tokens
        const size_t n_vocab = size_t(engine->info().n_vocab);
        auto a = model.create_state(256), b = model.create_state(256);
        a->eval({.tokens = head});
        b->eval({.tokens = head});
        std::vector<float> rows(n_vocab * rest.size());
        std::vector<int32_t> with_rows(rest.size(), -1), alone(rest.size(), -1);
        a->eval({.tokens = rest, .all_logits = true, .logits = rows.data(), .argmax = with_rows.data(),
                 .keep_states = true});
        b->eval({.tokens = rest, .all_logits = true, .argmax = alone.data(), .keep_states = true});
        for (size_t r = 0; r < rest.size(); ++r) {
            const float* row = rows.data() + r * n_vocab;
            const int32_t want = int32_t(std::max_element(row, row + n_vocab) - row);
            EXPECT_EQ(with_rows[r], want) << name << " row " << r;
            EXPECT_EQ(alone[r], want) << name << " row " << r;
        }
        a->truncate(34);
        b->truncate(34);
        std::vector<float> la(n_vocab), lb(n_vocab);
        a->eval({.tokens = {&rest[4], 1}, .logits = la.data()});
        b->eval({.tokens = {&rest[4], 1}, .logits = lb.data()});
        EXPECT_EQ(la, lb) << name;
    }
}

// A generation that ends inside a speculative step (max_tokens) leaves the session as a plain one: the
// same logits, and a second generate() continuing identically.
TEST(SpeculativeRollback, StoppingInsideAStepLeavesThePlainState) {
    auto engine = load("tiny-lfm2");
    auto draft = load("tiny-llama-random");  // random weights: nearly every draft is rejected
    const std::string prompt = prompt_text("tiny-lfm2", 0);
    for (int n : {5, 9, 17}) {
        cera::Session a(engine), b(engine);
        a.append_text(prompt);
        b.append_text(prompt);
        cera::GenerateOptions g;
        g.max_tokens = n;
        g.ignore_eos = true;
        g.sampling.temperature = 0;
        cera::NullSink sink;
        const auto ra = a.generate(g, sink);
        g.speculative = {.lookup_ngram = 2, .draft = draft, .draft_max = 7};
        const auto rb = b.generate(g, sink);
        EXPECT_EQ(ra.text, rb.text);
        EXPECT_EQ(a.tokens(), b.tokens());
        const auto la = a.logits();
        const std::vector<float> lav(la.begin(), la.end());
        const auto lb = b.logits();
        float worst = 0;
        for (size_t i = 0; i < lav.size(); ++i) worst = std::max(worst, std::abs(lav[i] - lb[i]));
        EXPECT_LT(worst, 1e-4f) << n;
        g.max_tokens = 20;
        const auto ra2 = a.generate(g, sink);
        const auto rb2 = b.generate(g, sink);
        EXPECT_EQ(ra2.text, rb2.text) << n;
    }
}

// Context shifts keep working under speculation: a small context filled several times over gives the
// plain greedy tokens (the draft model's sequence follows the target's through the shifts).
TEST(SpeculativeRollback, ContextShiftsGiveThePlainTokens) {
    auto engine = load("tiny-lfm2");
    auto draft = load("tiny-qwen3");
    const std::string prompt = prompt_text("tiny-lfm2", 0);
    std::vector<int32_t> want;
    for (const bool spec : {false, true}) {
        cera::Session s(engine, 48);
        s.append_text(prompt);
        cera::GenerateOptions g;
        g.max_tokens = 120;
        g.ignore_eos = true;
        g.sampling.temperature = 0;
        g.n_keep = 4;
        if (spec) g.speculative = {.lookup_ngram = 3, .draft = draft, .draft_max = 5};
        Collect sink;
        const auto r = s.generate(g, sink);
        EXPECT_GT(r.context_shifts, 1);
        if (!spec)
            want = sink.tokens;
        else {
            EXPECT_EQ(sink.tokens, want);
            EXPECT_GT(r.drafted_tokens, 0);
        }
    }
}

using cera::test::chi_square;
using cera::test::chi_square_critical;
using cera::test::top_k_softmax;

TEST(SpeculativeSampling, TheSecondTokenFollowsTheModelsMarginal) {
    auto engine = load("tiny-lfm2");
    auto draft = load("tiny-qwen3");
    // The story repeats itself: prompt lookup finds a draft after most first tokens.
    const std::string prompt = "Tom had a big red ball. He liked to play with it. Tom had a big red";
    constexpr int kTop = 6;
    // The exact marginal of the second sampled token: sum over the first of p(t1) p(t2 | t1).
    cera::Session s(engine);
    s.append_text(prompt);
    const auto row0 = s.logits();
    const auto p1 = top_k_softmax(std::vector<float>(row0.begin(), row0.end()), kTop);
    std::map<int32_t, double> p2;
    for (const auto& [t1, pr1] : p1) {
        cera::Session b(engine);
        b.append_text(prompt);
        b.append_tokens(std::vector<int32_t>{t1});
        const auto row = b.logits();
        for (const auto& [t2, pr2] : top_k_softmax(std::vector<float>(row.begin(), row.end()), kTop))
            p2[t2] += pr1 * pr2;
    }
    for (const bool with_draft : {true, false}) {
        constexpr int kRuns = 500;
        std::map<int32_t, int> counts;
        int drafted = 0, accepted = 0;
        for (int seed = 1; seed <= kRuns; ++seed) {
            cera::Session g(engine);
            g.append_text(prompt);
            cera::GenerateOptions o;
            o.max_tokens = 3;
            o.ignore_eos = true;
            o.sampling = {.temperature = 1.0f, .top_k = kTop, .top_p = 1.0f, .min_p = 0.0f, .seed = uint64_t(seed)};
            // A prompt lookup draft is a point mass; the draft model's is a full distribution.
            o.speculative = with_draft ? cera::SpeculativeOptions{.draft = draft, .draft_max = 4}
                                       : cera::SpeculativeOptions{.lookup_ngram = 3, .draft_max = 4};
            Collect sink;
            const auto r = g.generate(o, sink);
            ASSERT_EQ(sink.tokens.size(), 3u);
            ++counts[sink.tokens[1]];
            drafted += r.drafted_tokens, accepted += r.accepted_tokens;
        }
        EXPECT_GT(drafted, kRuns / 10) << with_draft;
        EXPECT_GT(accepted, 0) << with_draft;
        EXPECT_LT(accepted, drafted) << with_draft;
        const auto [stat, df] = chi_square(counts, p2, kRuns);
        ASSERT_GE(df, 3);
        EXPECT_LT(stat, chi_square_critical(df)) << (with_draft ? "draft model" : "prompt lookup") << ": chi2 " << stat
                                                 << " with " << df << " degrees of freedom";
    }
}

TEST(SpeculativeOptions, BadOptionsAndForeignDraftsAreNamed) {
    auto engine = load("tiny-lfm2");
    auto vl = load("tiny-lfm2vl-random");  // 4 more tokens in its vocabulary
    auto expect_invalid = [&](const cera::SpeculativeOptions& so, const std::string& word) {
        try {
            generate(engine, "Once upon a time", 4, so);
            ADD_FAILURE() << "no error for " << word;
        } catch (const cera::Error& e) {
            EXPECT_EQ(e.code(), cera::ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
        }
    };
    expect_invalid({.draft = vl}, "vocabulary");
    expect_invalid({.lookup_ngram = 2, .draft_max = 0}, "draft max");
    expect_invalid({.lookup_ngram = 2, .draft_max = 64}, "draft max");
    expect_invalid({.lookup_ngram = 2, .draft_max = 4, .draft_min = 5}, "draft min");
    expect_invalid({.lookup_ngram = -1}, "n-gram");
}

TEST(SpeculativeLookup, DraftsWhatFollowedTheLatestLongestMatch) {
    const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3};
    EXPECT_EQ(cera::lookup_draft(t, 3, 3), (std::vector<int32_t>{4, 5, 7}));  // "2 3" latest at 5
    EXPECT_EQ(cera::lookup_draft(t, 3, 1), (std::vector<int32_t>{4}));
    const std::vector<int32_t> u = {5, 6, 7, 8};
    EXPECT_TRUE(cera::lookup_draft(u, 3, 4).empty());
    const std::vector<int32_t> v = {1, 2, 1, 3, 1};
    EXPECT_EQ(cera::lookup_draft(v, 2, 4), (std::vector<int32_t>{3, 1}));  // "1" latest at 2
}

}  // namespace
