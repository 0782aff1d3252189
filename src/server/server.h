// The OpenAI-compatible HTTP server over a Batcher (`cera serve`): /v1/chat/completions and
// /v1/completions (plain and streamed as server-sent events; logprobs, logit_bias, n choices),
// /v1/embeddings, /v1/models, /health, /metrics (Prometheus), /tokenize and /detokenize, errors in the
// OpenAI error shape, a log line per request on stderr.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "server/chat_prompt.h"

namespace cera {

struct ServeOptions {
    std::string host = "127.0.0.1";
    int port = 8080;            // 0: a free port (Server::port() tells which)
    std::string api_key;        // non-empty: every request needs "Authorization: Bearer <key>"
    std::string alias;          // the model's id in /v1/models and in responses
    std::string chat_template;  // Jinja source replacing the model's; empty: the model's, else ChatML
    size_t max_body_bytes = size_t(32) << 20;  // a request body (base64 images make big ones)
    // A folder whose image files chat requests may name in image_url parts (file:// URLs or absolute
    // paths); empty: images come as data: URLs only. Needs a vision projector (EngineOptions::mmproj).
    std::string allow_local_images;
    // Threads answering HTTP requests (a streaming request holds one until it ends, so requests waiting
    // for a sequence slot hold one too); 0: 8 per sequence slot (batch.parallel) and 16 more, at least 64,
    // so that /health and short requests still find one while many clients wait.
    int http_threads = 0;
    // Chat replies that start with <think>: the thinking as the message's reasoning_content, apart from
    // its content (a request's reasoning_format "none" keeps it in the content); false: the text as is.
    bool split_reasoning = true;
    BatcherOptions batch;
};

class Server {
 public:
    Server(std::shared_ptr<Engine> engine, const ServeOptions& options);
    ~Server();
    // Binds the address; false (with the reason in `why`) when it cannot.
    bool bind(std::string* why = nullptr);
    // Serves on this thread until stop(); requests still running are cancelled.
    void run();
    void stop();
    int port() const;
    BatcherStats stats() const;  // the batcher's (KV blocks, running and waiting sequences)

 private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace cera
