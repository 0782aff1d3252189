#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "cera/error.h"
#include "core/check.h"
#include "server/chat_page.h"

namespace cera {

std::vector<int32_t> chat_prompt(const Engine& engine, const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages) {
    ChatTemplateOptions o;
    o.add_generation_prompt = true;
    if (engine.bos_token() >= 0) o.bos_token = engine.token_text(engine.bos_token());
    if (engine.eos_token() >= 0) o.eos_token = engine.token_text(engine.eos_token());
    std::vector<int32_t> ids = engine.tokenize(tmpl.render(messages, o), false, true);
    const int32_t bos = engine.bos_token();
    if (engine.add_bos() && bos >= 0 && (ids.empty() || ids.front() != bos)) ids.insert(ids.begin(), bos);
    return ids;
}

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A request the server refuses: its HTTP status and the OpenAI error fields.
struct Refusal {
    int status;
    std::string message, type, param, code;
};
[[noreturn]] void refuse(const std::string& message, const std::string& param = "", int status = 400,
                         const std::string& type = "invalid_request_error", const std::string& code = "") {
    throw Refusal{status, message, type, param, code};
}

json error_body(const Refusal& r) {
    auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    return {{"error", {{"message", r.message}, {"type", r.type}, {"param", opt(r.param)}, {"code", opt(r.code)}}}};
}

void send(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(), "application/json");
}

// Typed fields of a request body.
const json* field(const json& j, const char* key) {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}
double number(const json& j, const char* key, double def, double lo, double hi) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_number()) refuse(std::string("'") + key + "' must be a number", key);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        refuse(std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump(), key);
    return x;
}
int64_t integer(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_number_integer()) refuse(std::string("'") + key + "' must be an integer", key);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) refuse(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi), key);
    return x;
}
bool boolean(const json& j, const char* key, bool def) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_boolean()) refuse(std::string("'") + key + "' must be a boolean", key);
    return v->get<bool>();
}

// The sampling and stopping fields shared by both completion endpoints.
GenerateOptions generation(const json& j, int32_t n_ctx) {
    GenerateOptions g;
    SamplerParams& s = g.sampling;
    s.temperature = float(number(j, "temperature", 1.0, 0.0, 2.0));
    s.top_p = float(number(j, "top_p", 1.0, 0.0, 1.0));
    s.top_k = int32_t(integer(j, "top_k", 0, -1, 1 << 30));
    s.min_p = float(number(j, "min_p", 0.0, 0.0, 1.0));
    s.presence_penalty = float(number(j, "presence_penalty", 0.0, -2.0, 2.0));
    s.frequency_penalty = float(number(j, "frequency_penalty", 0.0, -2.0, 2.0));
    s.repeat_penalty = float(number(j, "repeat_penalty", 1.0, 0.0, 10.0));
    s.penalty_last_n = n_ctx;  // the API's penalties count every token so far
    const json* seed = field(j, "seed");
    if (seed && !seed->is_number_integer()) refuse("'seed' must be an integer", "seed");
    s.seed = seed ? seed->get<uint64_t>() : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
    const int64_t max_tokens = integer(j, "max_tokens", -1, 0, int64_t(1) << 30);
    g.max_tokens = int32_t(integer(j, "max_completion_tokens", max_tokens, 0, int64_t(1) << 30));
    if (const json* stop = field(j, "stop")) {
        if (stop->is_string()) {
            g.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            for (const json& x : *stop) {
                if (!x.is_string()) refuse("'stop' must be a string or a list of strings", "stop");
                g.stop.push_back(x.get<std::string>());
            }
        } else {
            refuse("'stop' must be a string or a list of strings", "stop");
        }
    }
    g.ignore_eos = boolean(j, "ignore_eos", false);  // as llama.cpp's server: load tools ask for exact lengths
    if (integer(j, "n", 1, 1, 128) != 1) refuse("'n' above 1 is not supported", "n");
    if (boolean(j, "logprobs", false) || field(j, "top_logprobs")) refuse("'logprobs' is not supported yet", "logprobs");
    if (field(j, "logit_bias")) refuse("'logit_bias' is not supported yet", "logit_bias");
    if (field(j, "user") && !field(j, "user")->is_string()) refuse("'user' must be a string", "user");
    return g;
}

const char* finish_name(FinishReason f) {
    switch (f) {
        case FinishReason::kLength:
        case FinishReason::kContextFull: return "length";
        default: return "stop";
    }
}

// What the batcher streams for one request: text pieces and the end, for the HTTP thread to send.
struct Stream : Sink {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> pieces;
    bool done = false;
    GenerationResult result;
    Clock::time_point first_token{};
    void on_text(std::string_view t) override {
        std::lock_guard<std::mutex> lk(mu);
        pieces.emplace_back(t);
        cv.notify_all();
    }
    void on_token(int32_t) override {
        std::lock_guard<std::mutex> lk(mu);
        if (first_token == Clock::time_point{}) first_token = Clock::now();
    }
    void on_done(const GenerationResult& r) override {
        std::lock_guard<std::mutex> lk(mu);
        result = r;
        done = true;
        cv.notify_all();
    }
};

}  // namespace

struct Server::Impl {
    std::shared_ptr<Engine> engine;
    ServeOptions o;
    ChatTemplate tmpl{kChatMlTemplate};
    std::shared_ptr<Batcher> batcher;
    httplib::Server http;
    int port = 0;
    std::atomic<uint64_t> next_id{1};

    std::string model_id() const { return o.alias; }

    void check_model(const json& j) const {
        const json* m = field(j, "model");
        if (m && (!m->is_string() || m->get<std::string>() != o.alias))
            refuse("the model '" + (m->is_string() ? m->get<std::string>() : m->dump()) + "' does not exist", "model", 404,
                   "invalid_request_error", "model_not_found");
    }

    json parse_body(const httplib::Request& req) const {
        json j = json::parse(req.body, nullptr, false);
        if (j.is_discarded()) refuse("the request body is not valid JSON");
        if (!j.is_object()) refuse("the request body must be a JSON object");
        check_model(j);
        return j;
    }

    std::vector<ChatMessage> messages(const json& j) const {
        const json* m = field(j, "messages");
        if (!m || !m->is_array() || m->empty()) refuse("'messages' must be a non-empty list", "messages");
        std::vector<ChatMessage> out;
        for (const json& x : *m) {
            if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
                refuse("each message needs a 'role' string", "messages");
            ChatMessage c;
            c.role = x["role"].get<std::string>();
            if (c.role == "developer") c.role = "system";
            if (c.role != "system" && c.role != "user" && c.role != "assistant" && c.role != "tool")
                refuse("unknown message role '" + c.role + "'", "messages");
            const json* content = field(x, "content");
            if (content && content->is_string()) {
                c.content = content->get<std::string>();
            } else if (content && content->is_array()) {
                for (const json& part : *content) {
                    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
                        !part["text"].is_string())
                        refuse("only text content parts are supported", "messages");
                    c.content += part["text"].get<std::string>();
                }
            } else if (content) {
                refuse("a message's 'content' must be a string or a list of parts", "messages");
            }
            if (const json* id = field(x, "tool_call_id"); id && id->is_string()) c.tool_call_id = id->get<std::string>();
            if (const json* name = field(x, "name"); name && name->is_string()) c.name = name->get<std::string>();
            out.push_back(std::move(c));
        }
        return out;
    }

    std::vector<int32_t> completion_prompt(const json& j) const {
        const json* p = field(j, "prompt");
        if (!p) refuse("'prompt' is required", "prompt");
        if (p->is_string()) return engine->tokenize(p->get<std::string>(), engine->add_bos(), true);
        if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
            std::vector<int32_t> ids;
            for (const json& x : *p) {
                if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= engine->info().n_vocab)
                    refuse("'prompt' token ids must be integers in the vocabulary", "prompt");
                ids.push_back(x.get<int32_t>());
            }
            return ids;
        }
        if (p->is_array() && p->size() == 1 && (*p)[0].is_string())
            return engine->tokenize((*p)[0].get<std::string>(), engine->add_bos(), true);
        refuse("'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
    }

    std::shared_ptr<Request> submit(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                                    std::shared_ptr<Sink> sink) {
        if (prompt.empty()) refuse("the prompt has no tokens", "prompt");
        try {
            return batcher->submit(prompt, g, std::move(sink));
        } catch (const Error& e) {
            if (e.code() == ErrorCode::kOverCapacity) refuse(e.what(), "", 429, "server_error", "over_capacity");
            if (e.code() == ErrorCode::kOutOfRange)  // the prompt leaves no room in a sequence
                refuse(e.what(), "messages", 400, "invalid_request_error", "context_length_exceeded");
            refuse(e.what());
        }
    }

    // /v1/chat/completions (chat) and /v1/completions.
    void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
        const auto t0 = Clock::now();
        const json j = parse_body(req);
        const std::vector<int32_t> prompt = chat ? chat_prompt(*engine, tmpl, messages(j)) : completion_prompt(j);
        if (!chat && (boolean(j, "echo", false) || field(j, "suffix")))
            refuse("'echo' and 'suffix' are not supported", boolean(j, "echo", false) ? "echo" : "suffix");
        const GenerateOptions g = generation(j, batcher->n_ctx());
        const bool stream = boolean(j, "stream", false);
        bool usage_chunk = false;
        if (const json* so = field(j, "stream_options"); so && so->is_object()) usage_chunk = boolean(*so, "include_usage", false);
        auto sink = std::make_shared<Stream>();
        std::shared_ptr<Request> r = submit(prompt, g, sink);
        const uint64_t n = next_id++;
        const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(n);
        const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
        const std::string object = chat ? "chat.completion" : "text_completion";
        // By value: the stream's provider calls it after this function has returned.
        auto usage = [n_prompt = int64_t(prompt.size())](const GenerationResult& g) {
            return json{{"prompt_tokens", n_prompt},
                        {"completion_tokens", g.generated_tokens},
                        {"total_tokens", n_prompt + g.generated_tokens}};
        };
        auto log = [this, n, t0, sink, prompt_n = prompt.size(), chat](const GenerationResult& g, int status) {
            const double total = std::chrono::duration<double>(Clock::now() - t0).count();
            Clock::time_point first;
            {
                std::lock_guard<std::mutex> lk(sink->mu);
                first = sink->first_token;
            }
            const double ttft = first == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(first - t0).count();
            std::fprintf(stderr, "cera serve: request %llu %s %d: %zu tokens in, %d out, first token %.3f s, %.3f s, %s\n",
                         (unsigned long long)n, chat ? "chat" : "completion", status, prompt_n, g.generated_tokens, ttft,
                         total, finish_reason_name(g.finish));
        };
        if (!stream) {
            const GenerationResult gr = r->wait();
            json choice = {{"index", 0}, {"finish_reason", finish_name(gr.finish)}, {"logprobs", nullptr}};
            if (chat) choice["message"] = {{"role", "assistant"}, {"content", gr.text}};
            else choice["text"] = gr.text;
            send(res, 200, {{"id", id}, {"object", object}, {"created", created}, {"model", model_id()},
                            {"choices", json::array({choice})}, {"usage", usage(gr)}});
            log(gr, 200);
            return;
        }
        // Server-sent events: a chunk per text piece, the finish reason, [DONE]. A client that goes
        // away cancels its request at once.
        const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
        auto chunk = [=, this](const json& delta_or_text, const json& finish) {
            json c = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
            if (chat) c["delta"] = delta_or_text;
            else c["text"] = delta_or_text;
            return "data: " + json{{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model_id()},
                                   {"choices", json::array({c})}}.dump() + "\n\n";
        };
        auto started = std::make_shared<bool>(false);
        res.set_chunked_content_provider(
            "text/event-stream",
            [=, this](size_t, httplib::DataSink& out) {
                auto write = [&](const std::string& s) { return out.write(s.data(), s.size()); };
                if (!*started) {
                    *started = true;
                    if (chat && !write(chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
                }
                std::unique_lock<std::mutex> lk(sink->mu);
                sink->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return !sink->pieces.empty() || sink->done; });
                while (!sink->pieces.empty()) {
                    const std::string t = std::move(sink->pieces.front());
                    sink->pieces.pop_front();
                    lk.unlock();
                    if (!write(chunk(chat ? json{{"content", t}} : json(t), nullptr))) return false;
                    lk.lock();
                }
                if (!sink->done) return out.is_writable();
                const GenerationResult gr = sink->result;
                lk.unlock();
                bool ok = write(chunk(chat ? json::object() : json(""), finish_name(gr.finish)));
                if (ok && usage_chunk)
                    ok = write("data: " + json{{"id", id}, {"object", chunk_object}, {"created", created},
                                               {"model", model_id()}, {"choices", json::array()}, {"usage", usage(gr)}}
                                              .dump() +
                               "\n\n");
                if (ok) ok = write("data: [DONE]\n\n");
                out.done();
                log(gr, 200);
                return ok;
            },
            [r](bool success) {
                if (!success) r->cancel();  // the client went away
            });
    }

    void routes() {
        http.set_payload_max_length(o.max_body_bytes);
        http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            // The chat page loads without the key; it asks for one and sends it with its API calls.
            if (o.api_key.empty() || req.path == "/health" || req.path == "/")
                return httplib::Server::HandlerResponse::Unhandled;
            if (req.get_header_value("Authorization") == "Bearer " + o.api_key)
                return httplib::Server::HandlerResponse::Unhandled;
            send(res, 401, error_body({401, "invalid API key", "invalid_request_error", "", "invalid_api_key"}));
            return httplib::Server::HandlerResponse::Handled;
        });
        http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
            if (!res.body.empty()) return;
            const int s = res.status;
            const std::string message = s == 404   ? "no such endpoint"
                                        : s == 413 ? "the request body is too large"
                                        : s == 405 ? "method not allowed"
                                                   : "request failed";
            send(res, s, error_body({s, message, "invalid_request_error", "", ""}));
        });
        auto guarded = [this](auto fn) {
            return [this, fn](const httplib::Request& req, httplib::Response& res) {
                try {
                    fn(req, res);
                } catch (const Refusal& r) {
                    send(res, r.status, error_body(r));
                    if (r.status == 429) res.set_header("Retry-After", "1");
                } catch (const Error& e) {
                    const int s = e.code() == ErrorCode::kParse || e.code() == ErrorCode::kInvalidArgument ? 400 : 500;
                    send(res, s, error_body({s, e.what(), s == 400 ? "invalid_request_error" : "server_error", "", ""}));
                } catch (const std::exception& e) {
                    send(res, 500, error_body({500, e.what(), "server_error", "", ""}));
                }
            };
        };
        http.Get("/", serve_chat_page);
        http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send(res, 200, {{"status", "ok"}}); });
        http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
                     send(res, 200, {{"object", "list"},
                                     {"data", json::array({{{"id", model_id()}, {"object", "model"}, {"created", 0},
                                                            {"owned_by", "cera"}}})}});
                 }));
        http.Post("/v1/chat/completions",
                  guarded([this](const httplib::Request& q, httplib::Response& s) { complete(q, s, true); }));
        http.Post("/v1/completions",
                  guarded([this](const httplib::Request& q, httplib::Response& s) { complete(q, s, false); }));
        http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                      const json j = parse_body(req);
                      const json* c = field(j, "content");
                      if (!c || !c->is_string()) refuse("'content' must be a string", "content");
                      send(res, 200, {{"tokens", engine->tokenize(c->get<std::string>(), boolean(j, "add_special", false), true)}});
                  }));
        http.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                      const json j = parse_body(req);
                      const json* t = field(j, "tokens");
                      if (!t || !t->is_array()) refuse("'tokens' must be a list of token ids", "tokens");
                      std::vector<int32_t> ids;
                      for (const json& x : *t) {
                          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= engine->info().n_vocab)
                              refuse("'tokens' must be token ids of the vocabulary", "tokens");
                          ids.push_back(x.get<int32_t>());
                      }
                      send(res, 200, {{"content", engine->detokenize(ids)}});
                  }));
    }
};

Server::Server(std::shared_ptr<Engine> engine, const ServeOptions& options) : impl_(std::make_unique<Impl>()) {
    Impl& im = *impl_;
    im.engine = std::move(engine);
    im.o = options;
    if (im.o.alias.empty()) im.o.alias = im.engine->info().path.substr(im.engine->info().path.find_last_of('/') + 1);
    const std::string source = !options.chat_template.empty() ? options.chat_template : im.engine->chat_template();
    if (!source.empty()) im.tmpl = ChatTemplate(source);
    im.batcher = Batcher::create(im.engine, options.batch);
    im.routes();
}

Server::~Server() { stop(); }

bool Server::bind(std::string* why) {
    Impl& im = *impl_;
    im.port = im.o.port == 0 ? im.http.bind_to_any_port(im.o.host) : (im.http.bind_to_port(im.o.host, im.o.port) ? im.o.port : -1);
    if (im.port < 0 && why) *why = "cannot listen on " + im.o.host + ":" + std::to_string(im.o.port);
    return im.port >= 0;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() { impl_->http.stop(); }

int Server::port() const { return impl_->port; }

}  // namespace cera
