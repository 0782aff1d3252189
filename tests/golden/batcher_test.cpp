// cera::Batcher on the fixture models, CPU: requests generated together give the tokens and text
// that each gives alone in a Session (greedy and seeded sampling), also when the KV pool is so small
// that sequences are preempted and resumed; a cancelled request leaves the others untouched; a full
// queue refuses with "over capacity"; requests come from several threads; a request whose grammar is
// too ambiguous fails alone; every KV block returns to the pool.
#include <gtest/gtest.h>

#include <mutex>
#include <random>
#include <thread>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/grammar.h"
#include "cera/session.h"
#include "test_util.h"

namespace cera {
namespace {

std::shared_ptr<Engine> load(const std::string& name) {
    return Engine::load(test::data_path("fixtures/" + name + "/model.gguf"),
                        {.device = "cpu", .threads = 2, .n_ctx = 96});
}

struct Collect : Sink {
    std::mutex mu;
    std::vector<int32_t> ids;
    std::string text;
    int done = 0;
    void on_text(std::string_view t) override {
        std::lock_guard<std::mutex> lk(mu);
        text += t;
    }
    void on_token(int32_t id) override {
        std::lock_guard<std::mutex> lk(mu);
        ids.push_back(id);
    }
    void on_done(const GenerationResult&) override { ++done; }
};

struct Job {
    std::vector<int32_t> prompt;
    GenerateOptions g;
};

// Prompts of 1 to 50 tokens; greedy and seeded sampling, with and without a stop string.
std::vector<Job> jobs(const Engine& e, int n) {
    std::mt19937 rng(5);
    std::vector<Job> v;
    for (int i = 0; i < n; ++i) {
        Job j;
        const int len = 1 + int(rng() % 50);
        for (int k = 0; k < len; ++k) j.prompt.push_back(int32_t(rng() % uint32_t(e.info().n_vocab)));
        j.g.max_tokens = 4 + int(rng() % 20);
        j.g.ignore_eos = i % 3 != 0;
        if (i % 2 == 0) {
            j.g.sampling.temperature = 0.0f;
        } else {
            j.g.sampling.temperature = 0.9f;
            j.g.sampling.seed = uint64_t(100 + i);
        }
        if (i % 4 == 1) j.g.stop = {"e"};
        v.push_back(std::move(j));
    }
    return v;
}

GenerationResult alone(const std::shared_ptr<Engine>& e, const Job& j, std::vector<int32_t>& ids) {
    Session s(e);
    s.append_tokens(j.prompt);
    Collect c;
    GenerationResult r = s.generate(j.g, c);
    ids = c.ids;
    return r;
}

void expect_same(const std::shared_ptr<Engine>& e, const std::vector<Job>& js, const BatcherOptions& bo,
                 int64_t* preemptions = nullptr) {
    std::vector<std::vector<int32_t>> want_ids(js.size());
    std::vector<GenerationResult> want;
    for (size_t i = 0; i < js.size(); ++i) want.push_back(alone(e, js[i], want_ids[i]));
    auto batcher = Batcher::create(e, bo);
    std::vector<std::shared_ptr<Collect>> sinks;
    std::vector<std::shared_ptr<Request>> reqs;
    for (const Job& j : js) {
        sinks.push_back(std::make_shared<Collect>());
        reqs.push_back(batcher->submit(j.prompt, j.g, sinks.back()));
    }
    for (size_t i = 0; i < js.size(); ++i) {
        const GenerationResult r = reqs[i]->wait();
        EXPECT_EQ(sinks[i]->ids, want_ids[i]) << "request " << i;
        EXPECT_EQ(r.text, want[i].text) << "request " << i;
        EXPECT_EQ(sinks[i]->text, want[i].text) << "request " << i;
        EXPECT_EQ(r.finish, want[i].finish) << "request " << i;
        EXPECT_EQ(r.generated_tokens, want[i].generated_tokens) << "request " << i;
        EXPECT_EQ(sinks[i]->done, 1);
    }
    const BatcherStats st = batcher->stats();
    if (preemptions) *preemptions = st.preemptions;
    for (int i = 0; i < 100 && batcher->stats().kv_blocks_free != st.kv_blocks_total; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(batcher->stats().kv_blocks_free, batcher->stats().kv_blocks_total);
}

class BatcherFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(BatcherFixture, RequestsTogetherGiveWhatEachGivesAlone) {
    auto e = load(GetParam());
    expect_same(e, jobs(*e, 10), {.parallel = 4, .block_size = 8, .step_tokens = 40});
}

TEST_P(BatcherFixture, PreemptedSequencesResumeWithTheSameOutput) {
    auto e = load(GetParam());
    int64_t preemptions = 0;
    // A pool of 112 tokens for four sequences of up to 96: the newest give their blocks back.
    expect_same(e, jobs(*e, 8), {.parallel = 4, .kv_tokens = 112, .block_size = 8, .step_tokens = 64}, &preemptions);
    EXPECT_GT(preemptions, 0);
}

// Requests sharing a 40-token system prompt: those after the first take its cached blocks
// (cached_tokens: 32 on short-conv models, whose states are kept every 4 blocks of 8), a repeated
// request its own; all give what each gives alone.
TEST_P(BatcherFixture, SharedPromptsArePrefilledOnce) {
    auto e = load(GetParam());
    std::vector<Job> js = jobs(*e, 6);
    std::mt19937 rng(12);
    std::vector<int32_t> system;
    for (int i = 0; i < 40; ++i) system.push_back(int32_t(rng() % uint32_t(e->info().n_vocab)));
    for (Job& j : js) j.prompt.insert(j.prompt.begin(), system.begin(), system.end());
    for (Job& j : js) j.prompt.resize(std::min<size_t>(j.prompt.size(), 70));
    std::vector<std::vector<int32_t>> want(js.size());
    for (size_t i = 0; i < js.size(); ++i) alone(e, js[i], want[i]);
    auto batcher = Batcher::create(e, {.parallel = 3, .block_size = 8, .step_tokens = 64});
    js.insert(js.begin() + 1, js[0]);  // a repeat, before other requests' snapshots take the slots
    want.insert(want.begin() + 1, want[0]);
    for (size_t i = 0; i < js.size(); ++i) {  // one after another: each finds the blocks the first left
        auto sink = std::make_shared<Collect>();
        const GenerationResult r = batcher->submit(js[i].prompt, js[i].g, sink)->wait();
        EXPECT_EQ(sink->ids, want[i]) << "request " << i;
        if (i > 0) EXPECT_GE(r.cached_tokens, 32) << "request " << i;
        EXPECT_EQ(r.cached_tokens + r.prompt_tokens, int32_t(js[i].prompt.size()));
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatcherFixture,
                         ::testing::Values("tiny-lfm2", "tiny-llama-random", "tiny-qwen3", "tiny-lfm2moe"));

TEST(Batcher, CancelLeavesTheOthersUntouched) {
    auto e = load("tiny-lfm2");
    std::vector<Job> js = jobs(*e, 4);
    for (Job& j : js) j.g.max_tokens = 30, j.g.ignore_eos = true, j.g.stop.clear();
    std::vector<std::vector<int32_t>> want(js.size());
    for (size_t i = 0; i < js.size(); ++i) alone(e, js[i], want[i]);
    auto batcher = Batcher::create(e, {.parallel = 4, .block_size = 8});
    struct CancelAt : Collect {
        std::shared_ptr<Request> self;
        void on_token(int32_t id) override {
            Collect::on_token(id);
            if (ids.size() == 3 && self) self->cancel();
        }
    };
    std::vector<std::shared_ptr<Collect>> sinks;
    std::vector<std::shared_ptr<Request>> reqs;
    auto cancel_sink = std::make_shared<CancelAt>();
    for (size_t i = 0; i < js.size(); ++i) {
        sinks.push_back(i == 1 ? cancel_sink : std::make_shared<Collect>());
        reqs.push_back(batcher->submit(js[i].prompt, js[i].g, sinks.back()));
        if (i == 1) cancel_sink->self = reqs.back();
    }
    for (size_t i = 0; i < js.size(); ++i) {
        const GenerationResult r = reqs[i]->wait();
        if (i == 1) {
            EXPECT_EQ(r.finish, FinishReason::kCancelled);
            EXPECT_LE(r.generated_tokens, 4);
        } else {
            EXPECT_EQ(r.finish, FinishReason::kLength);
            EXPECT_EQ(sinks[i]->ids, want[i]) << "request " << i;
        }
    }
}

// A grammar so ambiguous that the matcher's bound stops it (every letter opens a frame that any of
// eight digits may close: 8^n stacks after n letters, so the first mask already meets the bound on the
// vocabulary's words) fails its own request with that error; the request beside it in the same steps
// gives what it gives alone.
TEST(Batcher, AnAmbiguousGrammarFailsItsOwnRequestOnly) {
    auto e = load("tiny-lfm2");
    std::vector<Job> js = jobs(*e, 2);
    for (Job& j : js) j.g.max_tokens = 16, j.g.ignore_eos = true, j.g.stop.clear();
    std::vector<int32_t> want;
    alone(e, js[0], want);
    std::string alts;
    for (char d = '1'; d <= '8'; ++d) alts += std::string(" | [a-z] x \"") + d + "\"";
    js[1].g.grammar = Grammar::parse("root ::= x\nx ::= \"\"" + alts);
    auto batcher = Batcher::create(e, {.parallel = 2, .block_size = 8});
    auto plain = std::make_shared<Collect>(), ambiguous = std::make_shared<Collect>();
    auto r0 = batcher->submit(js[0].prompt, js[0].g, plain);
    auto r1 = batcher->submit(js[1].prompt, js[1].g, ambiguous);
    try {
        r1->wait();
        ADD_FAILURE() << "the ambiguous grammar's request finished";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("ambiguous grammar"), std::string::npos) << err.what();
    }
    const GenerationResult r = r0->wait();
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(plain->ids, want);
}

TEST(Batcher, RefusesOverCapacityAndBadRequests) {
    auto e = load("tiny-llama-random");
    auto batcher = Batcher::create(e, {.parallel = 1, .max_queue = 2});
    GenerateOptions g;
    g.max_tokens = 40;
    g.ignore_eos = true;
    const std::vector<int32_t> p = {1, 2, 3};
    std::vector<std::shared_ptr<Request>> reqs;
    bool refused = false;
    for (int i = 0; i < 8 && !refused; ++i) {
        try {
            reqs.push_back(batcher->submit(p, g));
        } catch (const Error& err) {
            EXPECT_EQ(err.code(), ErrorCode::kOverCapacity);
            EXPECT_NE(std::string(err.what()).find("over capacity"), std::string::npos) << err.what();
            refused = true;
        }
    }
    EXPECT_TRUE(refused);
    EXPECT_THROW(batcher->submit(std::vector<int32_t>{}, g), Error);
    EXPECT_THROW(batcher->submit(std::vector<int32_t>{int32_t(e->info().n_vocab)}, g), Error);
    EXPECT_THROW(batcher->submit(std::vector<int32_t>(96, 1), g), Error);  // no room in a 96-token sequence
    for (auto& r : reqs) EXPECT_EQ(r->wait().generated_tokens, 40);
    EXPECT_THROW(Batcher::create(e, {.parallel = 0}), Error);
    EXPECT_THROW(Batcher::create(e, {.kv_tokens = 50}), Error);  // less than one sequence
}

TEST(Batcher, RequestsFromSeveralThreads) {
    auto e = load("tiny-lfm2");
    const std::vector<Job> js = jobs(*e, 8);
    std::vector<std::vector<int32_t>> want(js.size());
    for (size_t i = 0; i < js.size(); ++i) alone(e, js[i], want[i]);
    auto batcher = Batcher::create(e, {.parallel = 3, .block_size = 16, .step_tokens = 32});
    std::vector<std::vector<int32_t>> got(js.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < js.size(); ++i)
        threads.emplace_back([&, i] {
            auto sink = std::make_shared<Collect>();
            batcher->submit(js[i].prompt, js[i].g, sink)->wait();
            got[i] = sink->ids;
        });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
}

}  // namespace
}  // namespace cera
