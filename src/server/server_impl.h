// The server's state shared by its route files: server.cpp (setup, auth, errors, small routes,
// embeddings, metrics) and completions.cpp (chat and text completions, plain and streamed).
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/server.h"

namespace cera {

using Clock = std::chrono::steady_clock;

// One HTTP request as the routes see it: its number (in ids and the log) and arrival time.
struct Exchange {
    uint64_t id = 0;
    const char* endpoint = "";
    Clock::time_point t0;
    bool deferred = false;  // the route logs the request itself, later (a stream ends after the handler)
};

// The log line and request count of a finished request.
struct RequestLog {
    int status = 200;
    int64_t tokens_in = 0, tokens_out = 0;
    double ttft = -1.0;   // seconds to the first token; < 0: none
    std::string outcome;  // a finish reason, or the error
    int64_t drafted = 0, accepted = 0;  // speculative decoding: tokens drafted, and kept
};

struct Server::Impl {
    std::shared_ptr<Engine> engine;
    ServeOptions o;
    ChatTemplate tmpl{kChatMlTemplate};
    Metrics metrics;  // before the batcher: the requests' sinks use it until the batcher's thread ends
    std::shared_ptr<Batcher> batcher;
    RequestLimits limits;
    httplib::Server http;
    int port = 0;
    int listen_fd = -1;  // the listening socket, once bound
    std::atomic<uint64_t> next_id{1};
    // Embeddings run on a Session of their own, one request at a time; its evaluations and the batcher's
    // steps take turns on the backend (Backend::exec_mutex).
    std::mutex embed_mu;
    std::unique_ptr<Session> embed_session;
    // Each route's path pattern and method, for the methods a path takes: a path asked for with another
    // method is a 405 with an Allow header, and a browser's CORS preflight is told them.
    std::vector<std::pair<std::regex, std::string>> route_methods;

    void routes();
    // "GET, POST" for the methods of the routes whose pattern matches path; empty for none.
    std::string methods_of(const std::string& path) const;
    // /v1/chat/completions (chat), /v1/completions, or llama.cpp's /completion (native: its request
    // fields and its response shapes) and /infill (native and infill: fill in the middle).
    void complete(const httplib::Request& req, httplib::Response& res, bool chat, Exchange& x, bool native = false,
                  bool infill = false);
    void embeddings(const httplib::Request& req, httplib::Response& res, Exchange& x);
    // Submits one choice; a refusal for what the batcher refuses (429 when over capacity).
    // prompt_param: the request field a prompt too long for a sequence is reported against.
    std::shared_ptr<Request> submit(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                                    std::shared_ptr<Sink> sink, std::span<const PromptImage> images = {},
                                    const char* prompt_param = "messages");
    // Counts the request in the metrics and writes its log line.
    void finish(const Exchange& x, const RequestLog& log);
};

void send_json(httplib::Response& res, int status, const nlohmann::ordered_json& body);
double seconds_between(Clock::time_point a, Clock::time_point b);

}  // namespace cera
