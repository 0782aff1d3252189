// cera::Batcher under random load (run under ASan by scripts/test-sanitize): requests of random
// lengths arrive from four threads at random times, a quarter are cancelled at random moments, and the
// KV pool is small enough that sequences are preempted. Every request finishes; those not cancelled
// give the tokens they give alone in a Session; every KV block returns to the pool.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "test_util.h"

namespace cera {
namespace {

struct Ids : Sink {
    std::mutex mu;
    std::vector<int32_t> ids;
    void on_text(std::string_view) override {}
    void on_token(int32_t id) override {
        std::lock_guard<std::mutex> lk(mu);
        ids.push_back(id);
    }
};

TEST(BatcherStress, RandomArrivalsCancelsAndLengths) {
    auto e = Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1, .n_ctx = 64});
    const int n = 40;
    std::mt19937 rng(9);
    struct Job {
        std::vector<int32_t> prompt;
        GenerateOptions g;
        bool cancel = false;
        int cancel_after_us = 0;
    };
    std::vector<Job> jobs(n);
    for (Job& j : jobs) {
        const int len = 1 + int(rng() % 30);
        for (int k = 0; k < len; ++k) j.prompt.push_back(int32_t(rng() % uint32_t(e->info().n_vocab)));
        j.g.max_tokens = 1 + int(rng() % 24);
        j.g.sampling.temperature = rng() % 2 ? 0.0f : 0.7f;
        j.g.sampling.seed = rng();
        j.g.ignore_eos = true;
        j.cancel = rng() % 4 == 0;
        j.cancel_after_us = int(rng() % 3000);
    }
    std::vector<std::vector<int32_t>> want(n);
    for (int i = 0; i < n; ++i) {
        if (jobs[size_t(i)].cancel) continue;
        Session s(e);
        s.append_tokens(jobs[size_t(i)].prompt);
        Ids c;
        s.generate(jobs[size_t(i)].g, c);
        want[size_t(i)] = c.ids;
    }
    auto batcher = Batcher::create(e, {.parallel = 6, .kv_tokens = 128, .block_size = 8, .step_tokens = 24});
    std::vector<std::shared_ptr<Ids>> sinks(n);
    std::vector<GenerationResult> got(n);
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            std::mt19937 r{uint32_t(t)};
            for (int i; (i = next.fetch_add(1)) < n;) {
                std::this_thread::sleep_for(std::chrono::microseconds(r() % 2000));
                const Job& j = jobs[size_t(i)];
                sinks[size_t(i)] = std::make_shared<Ids>();
                auto req = batcher->submit(j.prompt, j.g, sinks[size_t(i)]);
                if (j.cancel) {
                    std::this_thread::sleep_for(std::chrono::microseconds(j.cancel_after_us));
                    req->cancel();
                }
                got[size_t(i)] = req->wait();
            }
        });
    for (auto& t : threads) t.join();
    for (int i = 0; i < n; ++i) {
        const Job& j = jobs[size_t(i)];
        if (j.cancel) {
            EXPECT_TRUE(got[size_t(i)].finish == FinishReason::kCancelled || got[size_t(i)].finish == FinishReason::kLength)
                << "request " << i;
            continue;
        }
        EXPECT_EQ(got[size_t(i)].finish, FinishReason::kLength) << "request " << i;
        EXPECT_EQ(sinks[size_t(i)]->ids, want[size_t(i)]) << "request " << i;
    }
    BatcherStats st = batcher->stats();
    for (int i = 0; i < 200 && (st.kv_blocks_free != st.kv_blocks_total || st.running > 0); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        st = batcher->stats();
    }
    EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.waiting, 0);
}

}  // namespace
}  // namespace cera
