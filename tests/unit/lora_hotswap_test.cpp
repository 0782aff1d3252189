// LoRA adapters loaded and unloaded while a Batcher generates (run under ASan by scripts/test-sanitize):
// one thread adds and removes named adapters in a loop, with a small device cache so that adapters
// are evicted and uploaded again, while requests naming the base model or an adapter arrive from two
// threads. Every request that was accepted finishes with exactly the tokens a Session gives alone under
// the same adapter; a request naming an adapter that is not loaded at that moment is refused at
// submit with kMissing. Also the engine's default adapters (EngineOptions::lora) and a session switching
// adapters between generations.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/error.h"
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

std::string lora_dir() { return test::data_path("fixtures/tiny-lfm2/lora"); }
std::string model_path() { return test::data_path("fixtures/tiny-lfm2/model.gguf"); }

std::vector<int32_t> alone(const std::shared_ptr<Engine>& e, const std::vector<int32_t>& prompt, GenerateOptions g) {
    Session s(e);
    s.append_tokens(prompt);
    Ids c;
    s.generate(g, c);
    return c.ids;
}

TEST(LoraHotSwap, LoadUnloadWhileGenerating) {
    EngineOptions eo;
    eo.device = "cpu";
    eo.threads = 1;
    eo.n_ctx = 64;
    eo.lora_cache_bytes = 1;  // every adapter not in the step is evicted when another one comes
    auto e = Engine::load(model_path(), eo);
    // Names and what they load; "gguf" and "peft" are the same adapter in two formats, "half" at 0.5.
    const std::vector<std::tuple<std::string, std::string, float>> kinds = {
        {"gguf", lora_dir() + "/lora.gguf", 1.0f}, {"peft", lora_dir() + "/peft", 1.0f}, {"half", lora_dir() + "/peft", 0.5f}};
    std::mt19937 rng(35);
    const int n = 24;
    struct Job {
        std::vector<int32_t> prompt;
        GenerateOptions g;
    };
    std::vector<Job> jobs(n);
    const char* names[] = {"base", "gguf", "peft", "half"};
    for (int i = 0; i < n; ++i) {
        Job& j = jobs[size_t(i)];
        const int len = 1 + int(rng() % 20);
        for (int k = 0; k < len; ++k) j.prompt.push_back(int32_t(rng() % uint32_t(e->info().n_vocab)));
        j.g.max_tokens = 1 + int(rng() % 16);
        j.g.ignore_eos = true;
        j.g.adapter = names[i % 4];
    }
    // What each gives alone, with every adapter loaded.
    for (const auto& [name, path, scale] : kinds) e->load_adapter(name, path, scale);
    std::vector<std::vector<int32_t>> want(n);
    for (int i = 0; i < n; ++i) want[size_t(i)] = alone(e, jobs[size_t(i)].prompt, jobs[size_t(i)].g);
    // The adapter changes what comes out (else the test would prove little).
    {
        GenerateOptions g = jobs[1].g;
        g.adapter = "base";
        g.max_tokens = 16;
        GenerateOptions ga = g;
        ga.adapter = "gguf";
        EXPECT_NE(alone(e, jobs[1].prompt, g), alone(e, jobs[1].prompt, ga));
    }
    for (const auto& k : kinds) ASSERT_TRUE(e->unload_adapter(std::get<0>(k)));
    EXPECT_FALSE(e->unload_adapter("gguf"));

    auto b = Batcher::create(e, {.parallel = 4, .kv_tokens = 256, .block_size = 16});
    std::atomic<bool> stop{false};
    std::atomic<int> swaps{0};
    std::thread swapper([&] {
        std::mt19937 r(7);
        while (!stop.load()) {
            const auto& [name, path, scale] = kinds[r() % kinds.size()];
            if (!e->unload_adapter(name)) {
                try {
                    e->load_adapter(name, path, scale);
                } catch (const Error&) {  // loaded by nobody else: cannot happen with one swapper
                    ADD_FAILURE() << "load_adapter " << name;
                }
            }
            swaps.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(300 + r() % 700));
        }
    });
    std::mutex mu;
    std::vector<std::shared_ptr<Request>> reqs(n);
    std::vector<std::shared_ptr<Ids>> sinks(n);
    std::atomic<int> refused{0};
    auto submitter = [&](int first) {
        for (int i = first; i < n; i += 2) {
            // Retry until the adapter happens to be loaded (or it is the base).
            for (int attempt = 0; attempt < 1000; ++attempt) {
                auto sink = std::make_shared<Ids>();
                try {
                    auto r = b->submit(jobs[size_t(i)].prompt, jobs[size_t(i)].g, sink);
                    std::lock_guard<std::mutex> lk(mu);
                    reqs[size_t(i)] = r;
                    sinks[size_t(i)] = sink;
                    break;
                } catch (const Error& err) {
                    ASSERT_EQ(err.code(), ErrorCode::kMissing) << err.what();
                    refused.fetch_add(1);
                    std::this_thread::sleep_for(std::chrono::microseconds(200));
                }
            }
        }
    };
    std::thread t0(submitter, 0), t1(submitter, 1);
    t0.join();
    t1.join();
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(reqs[size_t(i)]) << "request " << i << " never accepted";
        const GenerationResult r = reqs[size_t(i)]->wait();
        EXPECT_EQ(sinks[size_t(i)]->ids, want[size_t(i)]) << "request " << i << " adapter " << jobs[size_t(i)].g.adapter;
    }
    stop.store(true);
    swapper.join();
    std::printf("[ lora ] %d swaps, %d submits refused while the adapter was out\n", swaps.load(), refused.load());
    EXPECT_GT(swaps.load(), 0);
}

TEST(LoraHotSwap, DefaultAdaptersAndSessionSwitching) {
    EngineOptions eo;
    eo.device = "cpu";
    eo.threads = 1;
    eo.n_ctx = 64;
    auto base = Engine::load(model_path(), eo);
    eo.lora = {{lora_dir() + "/lora.gguf", 1.0f}};
    auto with = Engine::load(model_path(), eo);
    base->load_adapter("a", lora_dir() + "/peft", 1.0f);
    const std::vector<int32_t> prompt = {1, 397, 398, 263, 378};
    GenerateOptions g;
    g.max_tokens = 12;
    g.ignore_eos = true;
    const auto by_default = alone(with, prompt, g);
    GenerateOptions gb = g;
    gb.adapter = "base";
    EXPECT_EQ(alone(with, prompt, gb), alone(base, prompt, g));
    GenerateOptions ga = g;
    ga.adapter = "a";
    EXPECT_EQ(alone(base, prompt, ga), by_default);
    // One session switching: base, adapter, base again, each as a fresh session gives.
    Session s(base);
    s.append_tokens(prompt);
    Ids c1, c2, c3;
    s.generate(g, c1);
    s.generate(ga, c2);
    s.generate(g, c3);
    EXPECT_EQ(c1.ids, alone(base, prompt, g));
    std::vector<int32_t> p2 = prompt;
    p2.insert(p2.end(), c1.ids.begin(), c1.ids.end());
    EXPECT_EQ(c2.ids, alone(base, p2, ga));
    EXPECT_THROW(base->load_adapter("a", lora_dir() + "/peft"), Error);
    EXPECT_THROW(base->load_adapter("base", lora_dir() + "/peft"), Error);
    GenerateOptions gx = g;
    gx.adapter = "nope";
    Ids cx;
    EXPECT_THROW(s.generate(gx, cx), Error);
    const auto list = base->adapters();
    ASSERT_EQ(list.size(), 1u);
    EXPECT_EQ(list[0].name, "a");
    EXPECT_EQ(list[0].rank, 8);
}

}  // namespace
}  // namespace cera
