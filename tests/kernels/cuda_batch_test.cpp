// Batches of sequences on the CUDA backend: a BatchState step on CUDA gives the logits the same step
// gives on the CPU (prompt chunks of several sequences beside decode tokens, sequences joining and
// leaving, a shared prefix taken from the cache), and cera::Batcher on a CUDA engine gives each
// greedy request the tokens it gets alone in a Session, except after a near-tie (the lone run's top
// two logits within 0.05), the rule of the batched engine, also with speculative requests (prompt
// lookup) verified in its steps. Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/device.h"
#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "models/batch_state.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

const char* const kFixtures[] = {"tiny-lfm2",         "tiny-lfm2moe",      "tiny-qwen3",
                                 "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"};

std::vector<int32_t> tokens(std::mt19937& rng, int n, int64_t n_vocab) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(int32_t(rng() % uint32_t(n_vocab)));
    return v;
}

TEST(CudaBatch, StepsMatchCpu) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : kFixtures) {
        SCOPED_TRACE(name);
        const std::string path = test::data_path(std::string("fixtures/") + name + "/model.gguf");
        ModelOptions o;
        o.n_threads = 2, o.n_ctx = 256;
        auto cpu = load_model(path, o);
        o.device = DeviceKind::kCuda;
        auto gpu = load_model(path, o);
        const int64_t n_vocab = cpu->info().n_vocab;
        BatchStateOptions bo;
        bo.max_seqs = 6, bo.kv_tokens = 6 * 256, bo.block_size = 16, bo.max_step_tokens = 256;
        BatchState bc(*cpu, bo), bg(*gpu, bo);
        std::mt19937 rng(7);
        const std::vector<int32_t> shared = tokens(rng, 70, n_vocab);
        // Per sequence: its tokens so far; the plan adds sequences at steps 0, 2 and 4.
        struct S {
            int seq = -1;
            std::vector<int32_t> prompt;
            size_t evaluated = 0;
        };
        std::vector<S> seqs;
        auto add = [&](std::vector<int32_t> prompt) {
            S s;
            s.seq = bc.add_sequence();
            ASSERT_EQ(bg.add_sequence(), s.seq);
            s.prompt = std::move(prompt);
            const int64_t hc = bc.attach_prefix(s.seq, s.prompt), hg = bg.attach_prefix(s.seq, s.prompt);
            ASSERT_EQ(hc, hg);
            s.evaluated = size_t(hc);
            seqs.push_back(std::move(s));
        };
        add(shared);                 // 70 tokens
        add(tokens(rng, 5, n_vocab));
        add(tokens(rng, 1, n_vocab));
        double worst = 0;
        for (int step = 0; step < 10; ++step) {
            if (step == 2) {  // the shared prompt's full blocks are cached by now
                std::vector<int32_t> p = shared;
                const std::vector<int32_t> tail = tokens(rng, 9, n_vocab);
                p.insert(p.end(), tail.begin(), tail.end());
                add(p);
                EXPECT_GT(seqs.back().evaluated, 0u) << "no prefix hit";
            }
            if (step == 4) add(tokens(rng, 33, n_vocab));
            if (step == 6) {  // one leaves
                bc.remove_sequence(seqs[1].seq), bg.remove_sequence(seqs[1].seq);
                seqs.erase(seqs.begin() + 1);
            }
            std::vector<BatchState::Entry> entries;
            for (S& s : seqs) {
                const size_t left = s.prompt.size() - s.evaluated, n = std::min<size_t>(left, 40);  // chunks of 40
                entries.push_back({s.seq, std::span<const int32_t>(s.prompt).subspan(s.evaluated, n),
                                   n == left ? Pick::kLogits : Pick::kNone});
            }
            StepOutput oc, og;
            bc.step(entries, oc);
            bg.step(entries, og);
            ASSERT_EQ(oc.logits.size(), og.logits.size());
            for (size_t i = 0; i < oc.logits.size(); ++i)
                worst = std::max(worst, double(std::fabs(oc.logits[i] - og.logits[i])));
            // Each sequence that finished its prompt takes its CPU arg-max next.
            for (size_t i = 0; i < entries.size(); ++i) {
                S& s = seqs[i];
                s.evaluated += entries[i].tokens.size();
                if (entries[i].pick == Pick::kNone) continue;
                const float* r = oc.logits.data() + oc.row_at[i];
                s.prompt.push_back(int32_t(std::max_element(r, r + n_vocab) - r));
            }
        }
        EXPECT_LT(worst, 2e-3) << "largest logit difference";
        for (S& s : seqs) bc.remove_sequence(s.seq), bg.remove_sequence(s.seq);
        EXPECT_EQ(bg.free_blocks(), bg.total_blocks());
    }
}

// The gap between the two largest logits.
float top2_gap(const std::vector<float>& logits) {
    float a = -INFINITY, b = -INFINITY;
    for (float v : logits) {
        if (v > a) b = a, a = v;
        else if (v > b) b = v;
    }
    return a - b;
}

struct Ids : Sink {
    std::vector<int32_t> ids;
    void on_text(std::string_view) override {}
    void on_token(int32_t id) override { ids.push_back(id); }
};

// Greedy requests through a Batcher on a CUDA engine against each request alone in a Session: the same
// tokens, but for divergences at near-ties of the lone run (the batch's products differ in the last bits).
// speculate: half of the requests draft by prompt lookup over prompts that repeat themselves, so their
// drafts are verified in the batched steps and partly rejected (the sequences rolled back, conv states
// included), while the other half decode plainly beside them.
void batcher_matches_sessions(const char* name, bool speculate) {
    const std::string path = test::data_path(std::string("fixtures/") + name + "/model.gguf");
    auto engine = Engine::load(path, {.device = "cuda", .n_ctx = 128});
    ModelOptions mo;
    mo.device = DeviceKind::kCuda, mo.n_ctx = 128;
    auto model = load_model(path, mo);  // the lone run's logits at a divergence
    const int64_t n_vocab = engine->info().n_vocab;
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 12; ++i) {
        prompts.push_back(tokens(rng, 1 + int(rng() % 60), n_vocab));
        if (speculate) {  // the prompt three times over: lookup finds its n-grams
            const std::vector<int32_t> once(prompts.back().begin(), prompts.back().begin() + std::min<size_t>(12, prompts.back().size()));
            prompts.back() = once;
            for (int r = 0; r < 2; ++r) prompts.back().insert(prompts.back().end(), once.begin(), once.end());
        }
    }
    GenerateOptions g;
    g.max_tokens = 24, g.ignore_eos = true, g.sampling.temperature = 0.0f;
    auto batcher = Batcher::create(
        engine, {.parallel = 5, .kv_tokens = 5 * 128, .n_ctx = 128, .step_tokens = 64, .max_draft = speculate ? 6 : 0});
    std::vector<std::shared_ptr<Ids>> sinks;
    std::vector<std::shared_ptr<Request>> reqs;
    for (size_t i = 0; i < prompts.size(); ++i) {
        GenerateOptions gi = g;
        if (speculate && i % 2 == 0) gi.speculative.lookup_ngram = 3, gi.speculative.draft_max = 6;
        sinks.push_back(std::make_shared<Ids>());
        reqs.push_back(batcher->submit(prompts[i], gi, sinks.back()));
    }
    int near_ties = 0, drafted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        drafted += reqs[i]->wait().drafted_tokens;
        Session s(engine, 128);
        s.append_tokens(prompts[i]);
        Ids lone;
        s.generate(g, lone);
        const auto& got = sinks[i]->ids;
        ASSERT_EQ(got.size(), lone.ids.size());
        const auto diff = std::mismatch(got.begin(), got.end(), lone.ids.begin());
        if (diff.first == got.end()) continue;
        // A divergence must follow a near-tie of the lone run.
        const size_t at = size_t(diff.first - got.begin());
        std::vector<int32_t> prefix = prompts[i];
        prefix.insert(prefix.end(), lone.ids.begin(), lone.ids.begin() + int64_t(at));
        auto model_state = model->create_state();
        std::vector<float> logits(static_cast<size_t>(n_vocab));
        model_state->eval({.tokens = prefix, .logits = logits.data()});
        EXPECT_LT(top2_gap(logits), 0.05f) << "request " << i << " diverges at token " << at;
        ++near_ties;
    }
    EXPECT_LE(near_ties, 3);
    if (speculate) {
        EXPECT_GT(drafted, 0) << "no request drafted";
    }
    for (int i = 0; i < 100 && batcher->stats().kv_blocks_free != batcher->stats().kv_blocks_total; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(batcher->stats().kv_blocks_free, batcher->stats().kv_blocks_total);
}

// EngineOptions::warmup runs steps on a scratch sequence at load, then cuBLAS products on scratch
// operands at a ladder of chunk sizes (kEverySize: at every chunk size): a session of a warmed engine
// generates, and samples, the tokens a session of an engine loaded without it does, prompts of several
// lengths through prefill chunks.
TEST(CudaBatch, WarmupLeavesGenerationUnchanged) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    using W = EngineOptions::Warmup;
    for (const char* name : {"tiny-lfm2", "tiny-qwen3"}) {
        SCOPED_TRACE(name);
        const std::string path = test::data_path(std::string("fixtures/") + name + "/model.gguf");
        auto cold = Engine::load(path, {.device = "cuda", .n_ctx = 128, .n_batch = 64, .warmup = W::kNone});
        for (W level : {W::kFirstUse, W::kEverySize}) {
            auto warm = Engine::load(path, {.device = "cuda", .n_ctx = 128, .n_batch = 64, .warmup = level});
            std::mt19937 rng(11);
            for (int n_prompt : {20, 77}) {
                const std::vector<int32_t> prompt = tokens(rng, n_prompt, warm->info().n_vocab);
                for (float temperature : {0.0f, 0.9f}) {
                    GenerateOptions g;
                    g.max_tokens = 16, g.ignore_eos = true, g.sampling.temperature = temperature, g.sampling.seed = 5;
                    Ids a, b;
                    Session sw(warm, 128), sc(cold, 128);
                    sw.append_tokens(prompt);
                    sc.append_tokens(prompt);
                    sw.generate(g, a);
                    sc.generate(g, b);
                    ASSERT_EQ(a.ids.size(), 16u);
                    EXPECT_EQ(a.ids, b.ids)
                        << "level " << int(level) << ", prompt " << n_prompt << ", temperature " << temperature;
                }
            }
        }
    }
}

TEST(CudaBatch, BatcherGreedyMatchesSessions) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : {"tiny-lfm2", "tiny-llama-random", "tiny-qwen3"}) {
        SCOPED_TRACE(name);
        batcher_matches_sessions(name, false);
    }
}

TEST(CudaBatch, SpeculativeBatcherGreedyMatchesSessions) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : {"tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3"}) {
        SCOPED_TRACE(name);
        batcher_matches_sessions(name, true);
    }
}

}  // namespace
}  // namespace cera
