// Server setup and the routes other than completions: auth, the error shape of refused and failed
// requests, the per-request log line, /health, /v1/models, /tokenize, /detokenize, /apply-template,
// /v1/embeddings and /metrics.
#include "server/server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cera/error.h"
#include "server/chat_page.h"
#include "server/server_impl.h"

namespace cera {

std::vector<int32_t> chat_prompt(const Engine& engine, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, const std::string& tools_json,
                                 const std::map<std::string, std::string>& kwargs, std::string* text) {
    ChatTemplateOptions o;
    o.add_generation_prompt = true;
    o.tools_json = tools_json;
    o.extra_bool_or_string_kwargs = kwargs;
    if (engine.bos_token() >= 0) o.bos_token = engine.token_text(engine.bos_token());
    if (engine.eos_token() >= 0) o.eos_token = engine.token_text(engine.eos_token());
    const std::string rendered = tmpl.render(messages, o);
    if (text) *text = rendered;
    std::vector<int32_t> ids = engine.tokenize(rendered, false, true);
    const int32_t bos = engine.bos_token();
    if (engine.add_bos() && bos >= 0 && (ids.empty() || ids.front() != bos)) ids.insert(ids.begin(), bos);
    return ids;
}

using json = nlohmann::ordered_json;

void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    // (Text from the model or the client that is not whole UTF-8, as a token that ends mid-character,
    // comes out with U+FFFD in its place rather than failing the reply.)
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

namespace {

// Little-endian float32 bytes (the host's order on every supported CPU) as base64.
std::string base64_floats(const std::vector<float>& v) {
    static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes(v.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), v.data(), bytes.size());
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const uint32_t b0 = uint8_t(bytes[i]);
        const uint32_t b1 = i + 1 < bytes.size() ? uint8_t(bytes[i + 1]) : 0;
        const uint32_t b2 = i + 2 < bytes.size() ? uint8_t(bytes[i + 2]) : 0;
        const uint32_t w = b0 << 16 | b1 << 8 | b2;
        out += kAlphabet[w >> 18 & 63];
        out += kAlphabet[w >> 12 & 63];
        out += i + 1 < bytes.size() ? kAlphabet[w >> 6 & 63] : '=';
        out += i + 2 < bytes.size() ? kAlphabet[w & 63] : '=';
    }
    return out;
}

}  // namespace

std::shared_ptr<Request> Server::Impl::submit(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                                              std::shared_ptr<Sink> sink, std::span<const PromptImage> images,
                                              const char* prompt_param) {
    if (prompt.empty()) refuse("the prompt has no tokens", prompt_param);
    try {
        return batcher->submit(prompt, g, std::move(sink), images);
    } catch (const Error& e) {
        std::string why = e.what();
        if (why.rfind("submit: ", 0) == 0) why.erase(0, 8);  // the library call's name says nothing to a client
        if (e.code() == ErrorCode::kOverCapacity) refuse(why, "", 429, "server_error", "over_capacity");
        if (e.code() == ErrorCode::kOutOfRange)  // the prompt leaves no room in a sequence
            refuse(why, prompt_param, 400, "invalid_request_error", "context_length_exceeded");
        refuse(why);
    }
}

void Server::Impl::finish(const Exchange& x, const RequestLog& log) {
    metrics.request(x.endpoint, log.status);
    char ttft[32] = "-";
    if (log.ttft >= 0) std::snprintf(ttft, sizeof ttft, "%.4f s", log.ttft);
    char spec[64] = "";
    if (log.drafted > 0)
        std::snprintf(spec, sizeof spec, ", drafted %" PRId64 " accepted %" PRId64, log.drafted, log.accepted);
    std::fprintf(stderr,
                 "cera serve: request %" PRIu64 " %s %d: %" PRId64 " tokens in, %" PRId64
                 " out, first token %s, total %.3f s, %s%s\n",
                 x.id, x.endpoint, log.status, log.tokens_in, log.tokens_out, ttft, seconds_between(x.t0, Clock::now()),
                 log.outcome.c_str(), spec);
}

void Server::Impl::embeddings(const httplib::Request& req, httplib::Response& res, Exchange& x) {
    const EmbeddingRequest er = parse_embedding(req.body, limits);
    const EngineInfo& info = engine->info();
    if (!info.pooling_unsupported.empty())
        refuse("this model pools its embeddings by " + info.pooling_unsupported + ", which is not supported", "model");
    // Tokenized as `cera embed` does: BOS and EOS where the model wants them, special-token text parsed.
    std::vector<std::vector<int32_t>> inputs;
    int64_t n_tokens = 0;
    for (const PromptInput& in : er.inputs) {
        const std::vector<int32_t> ids = in.is_ids ? in.ids : engine->tokenize(in.text, true, true);
        if (ids.empty()) refuse("an 'input' has no tokens", "input");
        if (int64_t(ids.size()) > batcher->n_ctx())
            refuse("an 'input' of " + std::to_string(ids.size()) + " tokens is longer than the context of " +
                       std::to_string(batcher->n_ctx()),
                   "input", 400, "invalid_request_error", "context_length_exceeded");
        n_tokens += int64_t(ids.size());
        inputs.push_back(std::move(ids));
    }
    json data = json::array();
    {
        std::lock_guard<std::mutex> lk(embed_mu);
        if (!embed_session) embed_session = std::make_unique<Session>(engine, batcher->n_ctx());
        for (size_t i = 0; i < inputs.size(); ++i) {
            // Pooled as the model was made to be, and of length 1 as OpenAI's embeddings are.
            std::vector<float> v = embed_session->embed(inputs[i], info.pooling);
            double ss = 0.0;
            for (float e : v) ss += double(e) * e;
            const float inv = ss > 0.0 ? float(1.0 / std::sqrt(ss)) : 0.0f;
            for (float& e : v) e *= inv;
            data.push_back(
                {{"object", "embedding"}, {"index", i}, {"embedding", er.base64 ? json(base64_floats(v)) : json(v)}});
        }
    }
    send_json(res, 200,
              {{"object", "list"},
               {"data", std::move(data)},
               {"model", o.alias},
               {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}});
    metrics.embedded(n_tokens);
    finish(x, {200, n_tokens, 0, -1.0, "embedded " + std::to_string(inputs.size())});
    x.deferred = true;  // logged here, with its tokens
}

void Server::Impl::routes() {
    http.set_payload_max_length(o.max_body_bytes);
    const size_t threads = size_t(o.http_threads > 0 ? o.http_threads : std::max(64, 8 * o.batch.parallel + 16));
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // A stream is many small writes: each goes out at once, not held for the previous one's ACK.
    http.set_tcp_nodelay(true);
    http.set_socket_options([this](socket_t sock) {
        httplib::default_socket_options(sock);
        listen_fd = int(sock);
    });
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        // Any origin may call the API (a browser page, as OpenAI's API allows); the key guards it, and a
        // CORS preflight, which carries no key, only learns the methods.
        res.set_header("Access-Control-Allow-Origin", "*");
        // The chat page loads without the key; it asks for one and sends it with its API calls.
        if (o.api_key.empty() || req.path == "/health" || req.path == "/" || req.method == "OPTIONS")
            return httplib::Server::HandlerResponse::Unhandled;
        if (req.get_header_value("Authorization") == "Bearer " + o.api_key)
            return httplib::Server::HandlerResponse::Unhandled;
        send_json(res, 401, error_body({401, "invalid API key", "invalid_request_error", "", "invalid_api_key"}));
        return httplib::Server::HandlerResponse::Handled;
    });
    // Statuses no route produced (no such path, a body over the limit, a wrong method), and 401s.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (res.status == 404 && res.body.empty()) {
            if (const std::string allow = methods_of(req.path); !allow.empty()) {
                res.status = 405;
                res.set_header("Allow", allow);
            }
        }
        const int s = res.status;
        if (!res.body.empty() && s != 401) return;  // a route's own error, counted and logged there
        if (res.body.empty()) {
            const std::string message = s == 404   ? "no such endpoint"
                                        : s == 413 ? "the request body is too large"
                                        : s == 405 ? "method not allowed"
                                                   : "request failed";
            send_json(res, s, error_body({s, message, "invalid_request_error", "", ""}));
        }
        const Exchange x{next_id++, "other", Clock::now()};
        finish(x, {s, 0, 0, -1.0, req.method + " " + req.path});
    });
    // Every route: refusals and failures as OpenAI error bodies, one log line per request.
    auto guarded = [this](const char* endpoint, auto fn) {
        return [this, endpoint, fn](const httplib::Request& req, httplib::Response& res) {
            Exchange x{next_id++, endpoint, Clock::now()};
            auto fail = [&](const Refusal& r) {
                send_json(res, r.status, error_body(r));
                if (r.status == 429) res.set_header("Retry-After", "1");
                finish(x, {r.status, 0, 0, -1.0, r.message});
            };
            try {
                fn(req, res, x);
                if (!x.deferred) finish(x, {res.status, 0, 0, -1.0, "ok"});
            } catch (const Refusal& r) {
                fail(r);
            } catch (const Error& e) {
                if (e.code() == ErrorCode::kMissing) {  // an adapter unloaded since the request was read
                    fail({404, e.what(), "invalid_request_error", "model", "model_not_found"});
                    return;
                }
                const int s = e.code() == ErrorCode::kParse || e.code() == ErrorCode::kInvalidArgument ||
                                      e.code() == ErrorCode::kOutOfRange
                                  ? 400
                                  : 500;
                fail({s, e.what(), s == 400 ? "invalid_request_error" : "server_error", "", ""});
            } catch (const std::exception& e) {
                fail({500, e.what(), "server_error", "", ""});
            }
        };
    };
    // Registers a route and records its method for methods_of.
    auto on = [this](const char* method, const std::string& pattern, httplib::Server::Handler h) {
        route_methods.emplace_back(std::regex(pattern), method);
        if (std::strcmp(method, "GET") == 0)
            http.Get(pattern, std::move(h));
        else if (std::strcmp(method, "POST") == 0)
            http.Post(pattern, std::move(h));
        else
            http.Delete(pattern, std::move(h));
    };
    on("GET", "/", serve_chat_page);
    on("GET", "/health", [](const httplib::Request&, httplib::Response& res) {
        send_json(res, 200, {{"status", "ok"}});
    });
    // The served models: the base ("vision": chat messages may hold image_url parts, a projector is
    // loaded), then the named LoRA adapters.
    auto model_objects = [this] {
        json data = json::array({{{"id", o.alias},
                                  {"object", "model"},
                                  {"created", 0},
                                  {"owned_by", "cera"},
                                  {"vision", engine->has_vision()}}});
        for (const AdapterInfo& a : engine->adapters())
            data.push_back({{"id", a.name},
                            {"object", "model"},
                            {"created", 0},
                            {"owned_by", "cera"},
                            {"parent", o.alias},
                            {"lora", {{"path", a.path}, {"scale", a.scale}, {"rank", a.rank}}}});
        return data;
    };
    // The OpenAI routes answer with and without the /v1 prefix (clients given the bare server address
    // as their base URL), as llama.cpp's server does.
    on("GET", "/(?:v1/)?models",
       guarded("models", [model_objects](const httplib::Request&, httplib::Response& res, Exchange&) {
           send_json(res, 200, {{"object", "list"}, {"data", model_objects()}});
       }));
    on("GET", R"(/(?:v1/)?models/(.+))",
       guarded("models", [model_objects](const httplib::Request& req, httplib::Response& res, Exchange&) {
           const std::string id = req.matches[1];
           for (const json& m : model_objects())
               if (m["id"] == id) return send_json(res, 200, m);
           refuse("The model '" + id + "' does not exist", "model", 404, "invalid_request_error", "model_not_found");
       }));
    // LoRA adapters while serving: POST /lora {"name", "path", "scale"?} loads one, DELETE /lora/NAME
    // unloads it (requests already running with it finish with it). Behind the API key like every route.
    on("POST", "/lora", guarded("lora", [this](const httplib::Request& req, httplib::Response& res, Exchange&) {
           const json j = json::parse(req.body, nullptr, false);
           if (!j.is_object()) refuse("the request body must be a JSON object");
           const json* name = j.contains("name") ? &j["name"] : nullptr;
           const json* path = j.contains("path") ? &j["path"] : nullptr;
           if (!name || !name->is_string() || name->get<std::string>().empty())
               refuse("'name' must be a non-empty string", "name");
           if (!path || !path->is_string()) refuse("'path' must be a string", "path");
           float scale = 1.0f;
           if (j.contains("scale")) {
               if (!j["scale"].is_number()) refuse("'scale' must be a number", "scale");
               scale = j["scale"].get<float>();
           }
           if (name->get<std::string>() == o.alias) refuse("'name' is the base model's id", "name");
           try {
               engine->load_adapter(name->get<std::string>(), path->get<std::string>(), scale);
           } catch (const Error& e) {
               refuse(e.what(), e.code() == ErrorCode::kInvalidArgument ? "name" : "path");
           }
           send_json(res, 200,
                     {{"id", name->get<std::string>()},
                      {"object", "model"},
                      {"parent", o.alias},
                      {"lora", {{"path", path->get<std::string>()}, {"scale", scale}}}});
       }));
    on("DELETE", R"(/lora/([^/]+))",
       guarded("lora", [this](const httplib::Request& req, httplib::Response& res, Exchange&) {
           const std::string name = req.matches[1];
           if (!engine->unload_adapter(name))
               refuse("no LoRA adapter named '" + name + "'", "name", 404, "invalid_request_error", "model_not_found");
           send_json(res, 200, {{"id", name}, {"object", "model"}, {"deleted", true}});
       }));
    // llama.cpp's server properties, which tools written for it read (the context, the chat template).
    // The sampling defaults are those of a /completion request that sets none.
    on("GET", "/props", guarded("props", [this](const httplib::Request&, httplib::Response& res, Exchange&) {
           const SamplerParams s = parse_native_completion(R"({"prompt": "-"})", limits).options.sampling;
           auto text = [this](int32_t id) {
               return id < 0 ? std::string() : engine->detokenize(std::vector<int32_t>{id}, true);
           };
           json params = {{"n_predict", -1},
                          {"temperature", s.temperature},
                          {"top_k", s.top_k},
                          {"top_p", s.top_p},
                          {"min_p", s.min_p},
                          {"repeat_penalty", s.repeat_penalty},
                          {"presence_penalty", s.presence_penalty},
                          {"frequency_penalty", s.frequency_penalty}};
           send_json(res, 200,
                     {{"default_generation_settings", {{"n_ctx", batcher->n_ctx()}, {"params", params}}},
                      {"total_slots", o.batch.parallel},
                      {"model_alias", o.alias},
                      {"model_path", engine->info().path},
                      {"modalities", {{"vision", engine->has_vision()}, {"video", false}, {"audio", false}}},
                      {"chat_template", tmpl.source()},
                      {"bos_token", text(engine->bos_token())},
                      {"eos_token", text(engine->eos_token())},
                      {"build_info", "cera"}});
       }));
    on("GET", "/metrics", guarded("metrics", [this](const httplib::Request&, httplib::Response& res, Exchange&) {
           res.status = 200;
           res.set_content(metrics.render(batcher->stats()), "text/plain; version=0.0.4");
       }));
    on("POST", "/(?:v1/)?chat/completions",
       guarded("chat",
               [this](const httplib::Request& q, httplib::Response& s, Exchange& x) { complete(q, s, true, x); }));
    on("POST", "/(?:v1/)?completions",
       guarded("completion",
               [this](const httplib::Request& q, httplib::Response& s, Exchange& x) { complete(q, s, false, x); }));
    on("POST", "/completion",
       guarded("completion", [this](const httplib::Request& q, httplib::Response& s, Exchange& x) {
           complete(q, s, false, x, true);
       }));
    on("POST", "/infill", guarded("infill", [this](const httplib::Request& q, httplib::Response& s, Exchange& x) {
           complete(q, s, false, x, true, true);
       }));
    on("POST", "/(?:v1/)?embeddings",
       guarded("embedding",
               [this](const httplib::Request& q, httplib::Response& s, Exchange& x) { embeddings(q, s, x); }));
    // A chat request's messages (and tools) rendered with the template, as its completion's prompt
    // would be: {"prompt": text}. llama.cpp's /apply-template.
    on("POST", "/apply-template",
       guarded("apply-template", [this](const httplib::Request& req, httplib::Response& res, Exchange&) {
           const CompletionRequest cr = parse_completion(req.body, true, limits);
           std::string text;
           (void)chat_prompt(*engine, tmpl, cr.messages, cr.tools_json, cr.template_kwargs, &text);
           send_json(res, 200, {{"prompt", text}});
       }));
    on("POST", "/tokenize", guarded("tokenize", [this](const httplib::Request& req, httplib::Response& res, Exchange&) {
           const TokenizeRequest t = parse_tokenize(req.body, limits);
           send_json(res, 200, {{"tokens", engine->tokenize(t.content, t.add_special, true)}});
       }));
    on("POST", "/detokenize",
       guarded("detokenize", [this](const httplib::Request& req, httplib::Response& res, Exchange&) {
           send_json(res, 200, {{"content", engine->detokenize(parse_detokenize(req.body, limits))}});
       }));
    // CORS preflights: the methods of the path (404 for a path no route serves) and the headers asked for.
    http.Options(R"(.*)", [this](const httplib::Request& req, httplib::Response& res) {
        const std::string allow = methods_of(req.path);
        if (allow.empty())
            return send_json(res, 404, error_body({404, "no such endpoint", "invalid_request_error", "", ""}));
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", allow + ", OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
        res.set_header("Access-Control-Max-Age", "86400");
    });
}

std::string Server::Impl::methods_of(const std::string& path) const {
    std::string allow;
    for (const auto& [pattern, method] : route_methods)
        if (std::regex_match(path, pattern) && allow.find(method) == std::string::npos)
            allow += (allow.empty() ? "" : ", ") + method;
    return allow;
}

Server::Server(std::shared_ptr<Engine> engine, const ServeOptions& options) : impl_(std::make_unique<Impl>()) {
    Impl& im = *impl_;
    im.engine = std::move(engine);
    im.o = options;
    if (im.o.alias.empty()) im.o.alias = im.engine->info().path.substr(im.engine->info().path.find_last_of('/') + 1);
    const std::string source = !options.chat_template.empty() ? options.chat_template : im.engine->chat_template();
    if (!source.empty()) im.tmpl = ChatTemplate(source);
    im.batcher = Batcher::create(im.engine, options.batch);
    im.limits.model = im.o.alias;
    im.limits.n_vocab = im.engine->info().n_vocab;
    im.limits.n_ctx = im.batcher->n_ctx();
    im.limits.tool_format = tool_call_format_for(im.engine->info().architecture, im.tmpl.source());
    im.limits.is_adapter = [e = im.engine.get()](const std::string& name) {
        for (const AdapterInfo& a : e->adapters())
            if (a.name == name) return true;
        return false;
    };
    im.limits.vision = im.engine->has_vision();
    im.limits.local_images_dir = options.allow_local_images;
    im.routes();
}

Server::~Server() {
    stop();
    // Streams the HTTP server dropped while stopping may still run: they end (cancelled) with the batcher,
    // before the state their sinks use goes.
    impl_->batcher.reset();
}

bool Server::bind(std::string* why) {
    Impl& im = *impl_;
    im.port = im.o.port == 0 ? im.http.bind_to_any_port(im.o.host)
                             : (im.http.bind_to_port(im.o.host, im.o.port) ? im.o.port : -1);
    if (im.port < 0 && why) *why = "cannot listen on " + im.o.host + ":" + std::to_string(im.o.port);
    // The HTTP library listens with a backlog of 5 connections, which a burst of clients overflows (their
    // connections then stall or fail); a second listen() sets a new backlog.
    if (im.port >= 0 && im.listen_fd >= 0) ::listen(im.listen_fd, SOMAXCONN);
    return im.port >= 0;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() { impl_->http.stop(); }

int Server::port() const { return impl_->port; }

BatcherStats Server::stats() const { return impl_->batcher->stats(); }

}  // namespace cera
