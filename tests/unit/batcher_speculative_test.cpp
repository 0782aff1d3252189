// Speculative decoding in the batched engine (cera::Batcher, BatchState::keep): greedy requests that
// speculate give the tokens of plain greedy decoding (a Session's, and the Batcher's without speculation)
// on every fixture model, side by side with requests that do not; a verification kept short at any point
// (across KV block boundaries and LFM2's conv layers) leaves the sequence as a fresh evaluation of the kept
// tokens leaves it; the prefix cache holds only kept tokens; sampled speculation draws the second token
// from the model's exact marginal (chi-square); bad options are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/grammar.h"
#include "cera/session.h"
#include "models/batch_state.h"
#include "runtime/engine_impl.h"
#include "test_util.h"
#include "unit/speculative_stats.h"

namespace cera {
namespace {

using test::data_path;

std::shared_ptr<Engine> load(const std::string& model) {
    return Engine::load(data_path("fixtures/" + model + "/model.gguf"), {.device = "cpu", .threads = 2, .n_ctx = 512});
}

std::string prompt_text(const std::string& model, int i) {
    return nlohmann::json::parse(
               test::read_text(data_path("fixtures/" + model + "/ref/prompt_" + std::to_string(i) + ".json")))["text"]
        .get<std::string>();
}

struct Collect : Sink {
    std::vector<int32_t> ids;
    void on_text(std::string_view) override {}
    void on_token(int32_t id) override { ids.push_back(id); }
};

struct Job {
    std::vector<int32_t> prompt;
    GenerateOptions g;
};

std::vector<int32_t> alone(const std::shared_ptr<Engine>& e, const Job& j) {
    Session s(e);
    s.append_tokens(j.prompt);
    GenerateOptions g = j.g;
    g.speculative = {};
    Collect c;
    s.generate(g, c);
    return c.ids;
}

struct Ran {
    std::vector<std::vector<int32_t>> ids;
    std::vector<GenerationResult> results;
    BatcherStats stats;
};

// The jobs submitted together; their tokens and results once all are done.
Ran run_batch(const std::shared_ptr<Engine>& e, const std::vector<Job>& js, const BatcherOptions& bo) {
    auto batcher = Batcher::create(e, bo);
    std::vector<std::shared_ptr<Collect>> sinks;
    std::vector<std::shared_ptr<Request>> reqs;
    for (const Job& j : js) {
        sinks.push_back(std::make_shared<Collect>());
        reqs.push_back(batcher->submit(j.prompt, j.g, sinks.back()));
    }
    Ran r;
    for (size_t i = 0; i < js.size(); ++i) {
        r.results.push_back(reqs[i]->wait());
        r.ids.push_back(sinks[i]->ids);
    }
    for (int i = 0; i < 100 && batcher->stats().kv_blocks_free != batcher->stats().kv_blocks_total; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    r.stats = batcher->stats();
    return r;
}

GenerateOptions greedy(int n, SpeculativeOptions spec = {}) {
    GenerateOptions g;
    g.max_tokens = n;
    g.ignore_eos = true;
    g.sampling.temperature = 0.0f;
    g.speculative = std::move(spec);
    return g;
}

const std::vector<std::string> kModels = {"tiny-lfm2",         "tiny-qwen3",        "tiny-lfm2moe",
                                          "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"};

class BatcherSpeculativeGreedy : public ::testing::TestWithParam<std::string> {};

// Four requests at once: a story told one and a half times (long drafts, partly rejected), two others
// speculating with other settings, one plain and one sampled; blocks of 4 tokens, so that rollbacks cross
// block ends.
TEST_P(BatcherSpeculativeGreedy, EqualsPlainGreedy) {
    const std::string model = GetParam();
    auto e = load(model);
    const std::string story = prompt_text(model, 2);
    std::vector<Job> js(5);  // and a sixth below
    js[0] = {e->tokenize(story + "\n" + story.substr(0, story.size() / 2), true),
             greedy(48, {.lookup_ngram = 3, .draft_max = 8})};
    js[1] = {e->tokenize(prompt_text(model, 0), true), greedy(24)};
    js[2] = {e->tokenize(story.substr(0, story.size() / 3) + "\n" + prompt_text(model, 0), true),
             greedy(40, {.lookup_ngram = 2, .draft_max = 5})};
    js[3] = {e->tokenize(story + " " + story, true), greedy(17, {.lookup_ngram = 1, .draft_max = 16, .draft_min = 2})};
    js[4] = {e->tokenize(prompt_text(model, 0) + " and", true), greedy(20)};
    js[4].g.sampling.temperature = 0.8f, js[4].g.sampling.seed = 7;
    // Random tokens whose start comes again at the end: the draft (what followed the start) is rejected.
    std::vector<int32_t> noise;
    for (int32_t i = 0; i < 30; ++i) noise.push_back(1000 + (i * 7919) % 3000);
    noise.insert(noise.end(), noise.begin(), noise.begin() + 3);
    js.push_back({noise, greedy(16, {.lookup_ngram = 3, .draft_max = 6})});
    const BatcherOptions bo{.parallel = 4, .block_size = 4, .step_tokens = 64, .max_draft = 16};
    const Ran spec = run_batch(e, js, bo);
    std::vector<Job> plain_js = js;
    for (Job& j : plain_js) j.g.speculative = {};
    const Ran plain = run_batch(e, plain_js, bo);
    for (size_t i = 0; i < js.size(); ++i) {
        EXPECT_EQ(spec.ids[i], alone(e, js[i])) << model << ": request " << i;
        EXPECT_EQ(spec.ids[i], plain.ids[i]) << model << ": request " << i;
        EXPECT_EQ(spec.results[i].text, plain.results[i].text) << model << ": request " << i;
        EXPECT_EQ(spec.results[i].finish, FinishReason::kLength);
        EXPECT_EQ(int(spec.ids[i].size()), js[i].g.max_tokens);
    }
    const GenerationResult& r0 = spec.results[0];
    EXPECT_GT(r0.accepted_tokens, 0) << model;
    EXPECT_EQ(r0.decode_tokens, 47);
    EXPECT_LT(r0.decode_steps, 47);
    EXPECT_EQ(spec.results[1].drafted_tokens, 0);
    EXPECT_EQ(spec.results[4].drafted_tokens, 0);
    int64_t drafted = 0, accepted = 0;
    for (const GenerationResult& r : spec.results) drafted += r.drafted_tokens, accepted += r.accepted_tokens;
    EXPECT_EQ(spec.stats.drafted_tokens, drafted);
    EXPECT_EQ(spec.stats.accepted_tokens, accepted);
    // Some rejected: rollbacks ran (random-weight Granite repeats its last token, which every draft predicts).
    if (model != "tiny-granite-random") EXPECT_GT(drafted, accepted) << model;
    EXPECT_LT(spec.stats.steps, plain.stats.steps);
    EXPECT_EQ(spec.stats.kv_blocks_free, spec.stats.kv_blocks_total);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatcherSpeculativeGreedy, ::testing::ValuesIn(kModels));

// Requests that end inside a verification (a stop string, EOS, a small max_tokens), a greedy sampler with
// penalties (its verification brings the logits back, not the arg-max) and requests that decode plainly
// under speculative options (a grammar, logprobs) give what a Session gives without speculation.
TEST(BatcherSpeculativeFinish, StopsEosMaxTokensPenaltiesGrammarAndLogprobsAsPlain) {
    auto e = load("tiny-lfm2");
    const std::string story = prompt_text("tiny-lfm2", 2);
    const std::vector<int32_t> repeat = e->tokenize(story + "\n" + story.substr(0, story.size() / 2), true);
    const SpeculativeOptions spec{.lookup_ngram = 3, .draft_max = 8};
    std::vector<Job> js;
    for (int n : {3, 5, 9}) js.push_back({repeat, greedy(n, spec)});  // max_tokens inside a draft
    js.push_back({repeat, greedy(60, spec)});
    js.back().g.stop = {" the"};  // a stop string in the middle of a verification's tokens
    js.push_back({e->tokenize(prompt_text("tiny-lfm2", 0), true), greedy(200, spec)});
    js.back().g.ignore_eos = false;  // ends at EOS (or the length)
    js.push_back({repeat, greedy(40, spec)});
    js.back().g.sampling.repeat_penalty = 1.3f;
    js.push_back({repeat, greedy(12, spec)});
    js.back().g.grammar = Grammar::parse(R"(root ::= [a-z ]+ ".")");
    js.push_back({repeat, greedy(12, spec)});
    js.back().g.logprobs = 2;
    const Ran ran = run_batch(e, js, {.parallel = 4, .block_size = 4, .step_tokens = 64, .max_draft = 8});
    for (size_t i = 0; i < js.size(); ++i) {
        Session s(e);
        s.append_tokens(js[i].prompt);
        GenerateOptions g = js[i].g;
        g.speculative = {};
        Collect c;
        const GenerationResult want = s.generate(g, c);
        EXPECT_EQ(ran.ids[i], c.ids) << "request " << i;
        EXPECT_EQ(ran.results[i].text, want.text) << "request " << i;
        EXPECT_EQ(ran.results[i].finish, want.finish) << "request " << i;
        EXPECT_EQ(ran.results[i].generated_tokens, want.generated_tokens) << "request " << i;
        EXPECT_EQ(ran.results[i].stop_string, want.stop_string) << "request " << i;
        EXPECT_EQ(ran.results[i].logprobs.size(), want.logprobs.size()) << "request " << i;
    }
    EXPECT_EQ(ran.results[3].finish, FinishReason::kStop);
    EXPECT_GT(ran.results[1].drafted_tokens, 0);
    EXPECT_GT(ran.results[5].drafted_tokens, 0);  // penalties: verified on the logits
    EXPECT_EQ(ran.results[6].drafted_tokens, 0);  // grammar: plain
    EXPECT_EQ(ran.results[7].drafted_tokens, 0);  // logprobs: plain
}

// A pool too small for every sequence and its draft: drafts are dropped before sequences are preempted,
// and the output is still plain greedy output.
TEST(BatcherSpeculativePool, TightPoolGivesThePlainTokens) {
    for (const std::string model : {"tiny-lfm2", "tiny-qwen3"}) {
        auto e = load(model);
        const std::string story = prompt_text(model, 2);
        std::vector<Job> js;
        for (int i = 0; i < 4; ++i) {
            const std::string part = story.substr(size_t(i) * 40, 160);
            js.push_back(
                {e->tokenize(part + "\n" + part.substr(0, 80), true), greedy(40, {.lookup_ngram = 2, .draft_max = 8})});
            js.back().prompt.resize(std::min<size_t>(js.back().prompt.size(), 80));
        }
        const Ran ran = run_batch(
            e, js, {.parallel = 4, .kv_tokens = 160, .n_ctx = 128, .block_size = 8, .step_tokens = 64, .max_draft = 8});
        for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(ran.ids[i], alone(e, js[i])) << model << ": request " << i;
        EXPECT_GT(ran.stats.preemptions, 0) << model;
        EXPECT_GT(ran.stats.drafted_tokens, 0) << model;
        EXPECT_EQ(ran.stats.kv_blocks_free, ran.stats.kv_blocks_total);
    }
}

// A verification of 1 + 9 tokens kept at each length, across blocks of 4: the verification's rows and the
// next step's rows equal those of a fresh state that evaluated only the kept tokens (one of the prompt's
// continuation or another), on the conv models too.
TEST(BatchStateKeep, RollbackMatchesAFreshEvaluation) {
    for (const std::string model : {"tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3"}) {
        auto e = load(model);
        const Model& m = *e->impl().model;
        const std::vector<int32_t> prompt = e->tokenize(prompt_text(model, 2), true);
        ASSERT_GE(prompt.size(), 40u);
        const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 27);
        const std::vector<int32_t> verify(prompt.begin() + 27, prompt.begin() + 37);  // pending + 9 drafted
        const std::vector<int32_t> other = {11, 500, 77};
        const size_t n_vocab = size_t(e->info().n_vocab);
        const BatchStateOptions o{.max_seqs = 2,
                                  .kv_tokens = 256,
                                  .block_size = 4,
                                  .max_step_tokens = 128,
                                  .snapshot_blocks = 1,
                                  .max_seq_tokens = 128,
                                  .max_draft = 9};
        // The rows of a verify entry of seq, after an entry of one token of the neighbour nb (if any).
        auto rows_of = [&](BatchState& st, int seq, std::span<const int32_t> t, int nb) {
            StepOutput out;
            static const int32_t tok = 42;
            std::vector<BatchState::Entry> en;
            if (nb >= 0) en.push_back({.seq = nb, .tokens = std::span(&tok, 1), .pick = Pick::kLogits});
            en.push_back({.seq = seq, .tokens = t, .pick = Pick::kLogits, .verify = true});
            st.step(en, out);
            const int64_t at = int64_t(out.row_at.back());
            return std::vector<float>(out.logits.begin() + at, out.logits.begin() + at + int64_t(t.size() * n_vocab));
        };
        for (int32_t keep = 1; keep <= 10; keep += 2) {
            BatchState a(m, o);
            const int s0 = a.add_sequence(), s1 = a.add_sequence();  // s0 a neighbour in every step
            StepOutput out;
            const std::span<const int32_t> first = std::span(prompt).first(std::min<size_t>(prompt.size(), 60));
            std::vector<BatchState::Entry> en = {{.seq = s0, .tokens = first}, {.seq = s1, .tokens = head}};
            a.step(en, out);
            const std::vector<float> got_verify = rows_of(a, s1, verify, s0);
            a.keep(s1, keep);
            EXPECT_EQ(a.position(s1), 27 + keep);
            const std::vector<float> got = rows_of(a, s1, other, s0);

            BatchState b(m, o);
            const int f = b.add_sequence();
            std::vector<int32_t> kept = head;
            kept.insert(kept.end(), verify.begin(), verify.begin() + keep);
            const BatchState::Entry fe{.seq = f, .tokens = kept, .pick = Pick::kNone};
            b.step(std::span(&fe, 1), out);
            const std::vector<float> want = rows_of(b, f, other, -1);
            EXPECT_LT(test::max_abs_diff(got, want), 1e-4) << model << ": kept " << keep;
            // The verification's rows: the logits after each of its tokens.
            BatchState c(m, o);
            const int g = c.add_sequence();
            const BatchState::Entry ge{.seq = g, .tokens = head, .pick = Pick::kNone};
            c.step(std::span(&ge, 1), out);
            for (int32_t t = 0; t < 10; t += 3) {
                const BatchState::Entry step1{
                    .seq = g, .tokens = std::span(verify).subspan(size_t(t), 1), .pick = Pick::kLogits};
                c.step(std::span(&step1, 1), out);
                const std::vector<float> row(got_verify.begin() + int64_t(t) * int64_t(n_vocab),
                                             got_verify.begin() + int64_t(t + 1) * int64_t(n_vocab));
                EXPECT_LT(test::max_abs_diff(row, out.logits), 1e-4) << model << ": row " << t;
                if (t + 3 < 10) {
                    const BatchState::Entry fill{.seq = g, .tokens = std::span(verify).subspan(size_t(t) + 1, 2)};
                    c.step(std::span(&fill, 1), out);
                }
            }
        }
    }
}

// Requests that speculate leave only kept tokens in the prefix cache: later requests whose prompts are an
// earlier request's prompt and output take its blocks and give what a Session gives.
TEST(BatcherSpeculativePrefix, CachedBlocksHoldOnlyKeptTokens) {
    for (const std::string model : {"tiny-lfm2", "tiny-qwen3"}) {
        auto e = load(model);
        const std::string story = prompt_text(model, 2);
        auto batcher = Batcher::create(e, {.parallel = 2, .block_size = 4, .step_tokens = 64, .max_draft = 8});
        Job first{e->tokenize(story + "\n" + story.substr(0, story.size() / 3), true),
                  greedy(40, {.lookup_ngram = 2, .draft_max = 7})};
        auto sink = std::make_shared<Collect>();
        const GenerationResult r = batcher->submit(first.prompt, first.g, sink)->wait();
        ASSERT_EQ(sink->ids, alone(e, first)) << model;
        ASSERT_GT(r.drafted_tokens, r.accepted_tokens) << model;
        for (size_t cut : {size_t(20), size_t(30), size_t(39)}) {
            Job next{first.prompt, greedy(12, {.lookup_ngram = 2, .draft_max = 7})};
            next.prompt.insert(next.prompt.end(), sink->ids.begin(), sink->ids.begin() + int64_t(cut));
            auto s2 = std::make_shared<Collect>();
            const GenerationResult r2 = batcher->submit(next.prompt, next.g, s2)->wait();
            EXPECT_EQ(s2->ids, alone(e, next)) << model << ": cut " << cut;
            // The blocks of the first request's generated tokens came from the cache (on tiny-lfm2 up to a
            // block end with conv states, every 16 tokens).
            EXPECT_GT(r2.cached_tokens, int32_t(first.prompt.size())) << model << ": cut " << cut;
        }
    }
}

// A draft model (tiny-qwen3 for tiny-lfm2, and tiny-lfm2, with conv states to roll back, for tiny-qwen3)
// drafting for several requests at once gives plain greedy output, with prompt lookup first or alone.
TEST(BatcherSpeculativeDraft, DraftModelGreedyEqualsPlainGreedy) {
    for (const auto& [target, drafter] :
         std::vector<std::pair<std::string, std::string>>{{"tiny-lfm2", "tiny-qwen3"}, {"tiny-qwen3", "tiny-lfm2"}}) {
        auto e = load(target), d = load(drafter);
        const std::string story = prompt_text(target, 2);
        std::vector<Job> js(4);
        js[0] = {e->tokenize(story + "\n" + story.substr(0, story.size() / 2), true),
                 greedy(40, {.lookup_ngram = 3, .draft = d, .draft_max = 6})};
        js[1] = {e->tokenize(prompt_text(target, 0), true), greedy(30, {.draft = d, .draft_max = 5})};
        js[2] = {e->tokenize(story.substr(0, story.size() / 3), true), greedy(25)};  // the batcher's settings
        js[3] = {e->tokenize(prompt_text(target, 0) + " The", true), greedy(33, {.draft = d, .draft_max = 2})};
        const Ran ran = run_batch(e, js,
                                  {.parallel = 3,
                                   .block_size = 4,
                                   .step_tokens = 64,
                                   .speculative = {.draft = d, .draft_max = 4},
                                   .max_draft = 8});
        int64_t drafted = 0, accepted = 0;
        for (size_t i = 0; i < js.size(); ++i) {
            EXPECT_EQ(ran.ids[i], alone(e, js[i])) << target << ": request " << i;
            EXPECT_GT(ran.results[i].drafted_tokens, 0) << target << ": request " << i;
            drafted += ran.results[i].drafted_tokens, accepted += ran.results[i].accepted_tokens;
        }
        EXPECT_GT(accepted, 0) << target;
        EXPECT_GT(drafted, accepted) << target;
        EXPECT_EQ(ran.stats.kv_blocks_free, ran.stats.kv_blocks_total);
    }
}

using test::chi_square;
using test::chi_square_critical;
using test::top_k_softmax;

TEST(BatcherSpeculativeSampling, TheSecondTokenFollowsTheModelsMarginal) {
    auto e = load("tiny-lfm2");
    const std::string prompt = "Tom had a big red ball. He liked to play with it. Tom had a big red";
    constexpr int kTop = 6;
    Session s(e);
    s.append_text(prompt);
    const auto row0 = s.logits();
    const auto p1 = top_k_softmax(std::vector<float>(row0.begin(), row0.end()), kTop);
    std::map<int32_t, double> p2;
    for (const auto& [t1, pr1] : p1) {
        Session b(e);
        b.append_text(prompt);
        b.append_tokens(std::vector<int32_t>{t1});
        const auto row = b.logits();
        for (const auto& [t2, pr2] : top_k_softmax(std::vector<float>(row.begin(), row.end()), kTop))
            p2[t2] += pr1 * pr2;
    }
    auto draft = load("tiny-qwen3");
    for (const bool with_draft : {false, true}) {
        constexpr int kRuns = 500;
        std::vector<Job> js(kRuns);
        const std::vector<int32_t> ids = e->tokenize(prompt, true);
        for (int i = 0; i < kRuns; ++i) {
            js[i].prompt = ids;
            js[i].g.max_tokens = 3;
            js[i].g.ignore_eos = true;
            js[i].g.sampling = {
                .temperature = 1.0f, .top_k = kTop, .top_p = 1.0f, .min_p = 0.0f, .seed = uint64_t(i + 1)};
            // A prompt lookup draft is a point mass; the draft model's is a full distribution.
            js[i].g.speculative = with_draft ? SpeculativeOptions{.draft = draft, .draft_max = 4}
                                             : SpeculativeOptions{.lookup_ngram = 3, .draft_max = 4};
        }
        BatcherOptions bo{.parallel = 8, .block_size = 8, .step_tokens = 128, .max_draft = 4};
        if (with_draft) bo.speculative = {.draft = draft};
        const Ran ran = run_batch(e, js, bo);
        std::map<int32_t, int> counts;
        for (const auto& t : ran.ids) {
            ASSERT_EQ(t.size(), 3u);
            ++counts[t[1]];
        }
        EXPECT_GT(ran.stats.drafted_tokens, kRuns / 10) << with_draft;
        EXPECT_GT(ran.stats.accepted_tokens, 0) << with_draft;
        EXPECT_LT(ran.stats.accepted_tokens, ran.stats.drafted_tokens) << with_draft;
        const auto [stat, df] = chi_square(counts, p2, kRuns);
        ASSERT_GE(df, 3);
        EXPECT_LT(stat, chi_square_critical(df)) << (with_draft ? "draft model" : "prompt lookup") << ": chi2 " << stat
                                                 << " with " << df << " degrees of freedom";
    }
}

TEST(BatcherSpeculativeOptions, BadOptionsAreNamed) {
    auto e = load("tiny-lfm2");
    auto vl = load("tiny-lfm2vl-random");  // 4 more tokens in its vocabulary
    auto expect_invalid = [&](auto&& f, const std::string& word) {
        try {
            f();
            ADD_FAILURE() << "no error for " << word;
        } catch (const Error& err) {
            EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(err.what()).find(word), std::string::npos) << err.what();
        }
    };
    expect_invalid([&] { Batcher::create(e, {.speculative = {.draft = vl}}); }, "vocabulary");
    expect_invalid([&] { Batcher::create(e, {.max_draft = 64}); }, "max draft");
    expect_invalid([&] { Batcher::create(e, {.speculative = {.lookup_ngram = 2, .draft_max = 0}}); }, "draft max");
    auto batcher = Batcher::create(e, {.parallel = 2});
    const std::vector<int32_t> p = {1, 2, 3};
    expect_invalid([&] { batcher->submit(p, greedy(4, {.lookup_ngram = 2, .draft_max = 64})); }, "draft max");
    expect_invalid([&] { batcher->submit(p, greedy(4, {.lookup_ngram = -1})); }, "n-gram");
    expect_invalid([&] { batcher->submit(p, greedy(4, {.lookup_ngram = 2, .draft_max = 3, .draft_min = 4})); },
                   "draft min");
    expect_invalid([&] { batcher->submit(p, greedy(4, {.draft = load("tiny-qwen3")})); }, "draft model");
}

}  // namespace
}  // namespace cera
