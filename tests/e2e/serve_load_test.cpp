// The server under load, on the bundled tiny LFM2 model over real HTTP: 64 concurrent greedy requests
// give the texts the same requests give one at a time, and 200 requests of which clients abort about
// half mid-stream leave the server healthy, every KV block free, and no error but the aborted ones.
#include <atomic>
#include <random>

#include "serve_util.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::RunningServer;

std::string completion(int port, const json& body, int* status) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    *status = res ? res->status : -1;
    if (!res) ADD_FAILURE() << "no answer: " << httplib::to_string(res.error());
    if (!res || res->status != 200) return "";
    return json::parse(res->body)["choices"][0]["text"];
}

TEST(ServeLoad, ConcurrentGreedyRequestsGiveTheirTextsAlone) {
    RunningServer r({}, 16);
    constexpr int kRequests = 64;
    std::vector<json> bodies;
    for (int i = 0; i < kRequests; ++i)
        bodies.push_back({{"prompt", "Story " + std::to_string(i) + ": once upon a time there was"},
                          {"temperature", 0},
                          {"max_tokens", 8 + i % 9}});
    std::vector<std::string> together(kRequests);
    std::vector<int> status(kRequests, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i)
        threads.emplace_back(
            [&, i] { together[size_t(i)] = completion(r.server->port(), bodies[size_t(i)], &status[size_t(i)]); });
    for (auto& t : threads) t.join();
    for (int i = 0; i < kRequests; ++i) {
        ASSERT_EQ(status[size_t(i)], 200) << "request " << i;
        int s = 0;
        EXPECT_EQ(together[size_t(i)], completion(r.server->port(), bodies[size_t(i)], &s)) << "request " << i;
        EXPECT_FALSE(together[size_t(i)].empty()) << "request " << i;
    }
    EXPECT_TRUE(r.settle());
}

TEST(ServeLoad, AbortedStreamsLeaveTheServerHealthy) {
    RunningServer r({}, 8);
    constexpr int kClients = 8, kEach = 25;
    std::atomic<int> aborted{0}, ok{0}, failed{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c)
        threads.emplace_back([&, c] {
            std::mt19937 rng{uint32_t(c)};
            for (int i = 0; i < kEach; ++i) {
                httplib::Client cli("127.0.0.1", r.server->port());
                cli.set_read_timeout(120, 0);
                // About half abort after a few chunks; those ask for many tokens, so that only a cancel
                // ends them early.
                const bool abort = rng() % 2 == 0;
                const int after = 1 + int(rng() % 4);
                const json body = {{"prompt", "Request " + std::to_string(c * kEach + i) + " says"},
                                   {"max_tokens", abort ? 200 : 4 + int(rng() % 12)},
                                   {"stream", true}};
                httplib::Request req;
                req.method = "POST";
                req.path = "/v1/completions";
                req.body = body.dump();
                req.set_header("Content-Type", "application/json");
                int chunks = 0;
                std::string got;
                req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
                    got.append(data, n);
                    return !(abort && ++chunks >= after);
                };
                auto res = cli.send(req);
                if (abort) {
                    ++aborted;
                } else if (res && res->status == 200 && got.find("data: [DONE]") != std::string::npos) {
                    ++ok;
                } else {
                    ++failed;
                }
            }
        });
    for (auto& t : threads) t.join();
    EXPECT_EQ(failed.load(), 0);
    EXPECT_EQ(ok.load() + aborted.load(), kClients * kEach);
    EXPECT_GT(aborted.load(), 0);
    ASSERT_TRUE(r.settle());
    const BatcherStats s = r.server->stats();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    auto health = r.client->Get("/health");
    ASSERT_TRUE(health && health->status == 200);
    // Every request was counted: answered (200) or gone mid-stream (499), nothing else.
    auto m = r.client->Get("/metrics");
    ASSERT_TRUE(m && m->status == 200);
    double answered = 0, gone = 0;
    std::istringstream lines(m->body);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("cera_requests_total{endpoint=\"completion\"", 0) != 0) continue;
        const double v = std::stod(line.substr(line.rfind(' ') + 1));
        if (line.find("status=\"200\"") != std::string::npos)
            answered += v;
        else if (line.find("status=\"499\"") != std::string::npos)
            gone += v;
        else
            ADD_FAILURE() << line;
    }
    EXPECT_EQ(answered + gone, kClients * kEach);
    EXPECT_LE(gone, aborted.load());
    EXPECT_GE(answered, ok.load());
    // Still serving.
    int status = 0;
    EXPECT_FALSE(completion(r.server->port(), {{"prompt", "After"}, {"max_tokens", 4}}, &status).empty());
    EXPECT_EQ(status, 200);
}

}  // namespace
}  // namespace cera
