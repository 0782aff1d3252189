// Shared by the server tests: the bundled tiny LFM2 model and a Server on a free port, serving on its
// own thread, with an HTTP client.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cera/engine.h"
#include "cera/session.h"
#include "server/server.h"
#include "test_util.h"

namespace cera::test {

inline std::shared_ptr<Engine> serve_engine() {
    static std::shared_ptr<Engine> e = [] {
        EngineOptions o;
        o.device = "cpu";
        o.threads = 2;
        o.n_ctx = 256;
        return Engine::load(source_path("models/tiny-lfm2-Q8_0.gguf"), o);
    }();
    return e;
}

struct RunningServer {
    // On `engine`, or the bundled tiny model when null.
    explicit RunningServer(ServeOptions o = {}, int parallel = 4, std::shared_ptr<Engine> engine = nullptr) {
        o.port = 0;
        o.alias = "tiny";
        o.batch.parallel = parallel;
        o.batch.block_size = 16;
        server = std::make_unique<Server>(engine ? engine : serve_engine(), o);
        EXPECT_TRUE(server->bind());
        thread = std::thread([this] { server->run(); });
        client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
        client->set_read_timeout(60, 0);
        for (int i = 0; i < 100 && !client->Get("/health"); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ~RunningServer() {
        server->stop();
        thread.join();
    }
    // POSTs JSON; the parsed answer (status in `status`).
    nlohmann::json post(const std::string& path, const nlohmann::json& body, int* status = nullptr) {
        auto res = client->Post(path, body.dump(), "application/json");
        if (!res) {
            ADD_FAILURE() << "no answer from " << path;
            return {};
        }
        if (status) *status = res->status;
        return nlohmann::json::parse(res->body, nullptr, false);
    }
    // Waits (up to 10 s) until the batcher runs and queues nothing and every KV block is free (the last
    // step's stats are published after its requests have answered). False when that does not happen.
    bool settle() {
        for (int i = 0; i < 1000; ++i) {
            const BatcherStats s = server->stats();
            if (s.running == 0 && s.waiting == 0 && s.kv_blocks_free == s.kv_blocks_total) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }
    std::unique_ptr<Server> server;
    std::thread thread;
    std::unique_ptr<httplib::Client> client;
};

// The JSON events of a server-sent-event body, without [DONE] (done tells whether it came).
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done = nullptr) {
    std::vector<nlohmann::json> out;
    std::istringstream lines(body);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("data: ", 0) != 0) continue;
        const std::string data = line.substr(6);
        if (data == "[DONE]") {
            if (done) *done = true;
            continue;
        }
        out.push_back(nlohmann::json::parse(data));
    }
    return out;
}

// What a Session of `engine` writes greedily after `ids`, at most n tokens: the reference a server
// reply at temperature 0 is held to.
inline std::string greedy_after(const std::shared_ptr<Engine>& engine, const std::vector<int32_t>& ids, int n) {
    Session s(engine);
    s.append_tokens(ids);
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = n;
    NullSink sink;
    return s.generate(g, sink).text;
}

}  // namespace cera::test
