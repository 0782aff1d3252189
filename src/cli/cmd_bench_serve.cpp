// `cera bench-serve --url URL [-c 8] [--requests 64] [--endpoint chat|completions] [--prompt-tokens 128 |
// --prompts FILE] [--max-tokens 64] [--cancel-rate P] [--model NAME] [--api-key KEY] [--extra-body JSON]
// [--json]`: a load
// generator for any OpenAI-compatible server (cera serve, llama.cpp's llama-server, vLLM). N clients
// each send one request at a time until the total is reached; every request streams (server-sent
// events), so that each one gives its time to first token and the gaps between its text chunks. It
// prints requests/s, output tokens/s, time to first token, inter-token latency and request latency
// (mean, p50, p90, p99) and the errors.
//
// Prompts of a set length are random common words, cut to exactly --prompt-tokens tokens through the
// server's /tokenize and /detokenize (llama.cpp's extras, which cera serve has too); without them the
// word count stands in for the token count. Every request's prompt differs, so that no prefix cache
// turns the prefill into a lookup. Requests ask for exactly --max-tokens tokens: "ignore_eos": true,
// which cera serve and llama-server honour. --extra-body adds fields to every request (sampling settings,
// a logit_bias that keeps a random-weight model's text valid UTF-8 for servers that refuse it otherwise).
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"
#include "cli/grammar_flags.h"
#include "cli/parse_args.h"
#include "cli/percentile.h"

namespace cera::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeOptions {
    std::string url;
    std::string endpoint = "chat";  // chat: /v1/chat/completions; completions: /v1/completions
    int clients = 8;                // requests in flight at once
    int requests = 64;              // in all
    int prompt_tokens = 128;
    std::string prompts_file;  // one prompt a line, used in turn instead of generated ones
    int max_tokens = 64;
    bool ignore_eos = true;
    double temperature = 0.0;
    double cancel_rate = 0.0;  // the share of requests the client abandons part-way through
    std::string model;         // empty: the first of /v1/models
    std::string api_key;
    nlohmann::json extra_body = nlohmann::json::object();  // members added to every request body
    uint64_t seed = 1;
    int timeout_s = 600;  // per request, waiting for the next bytes
    bool json = false;
};

// The server: scheme://host:port and the path the API's routes hang from ("/v1", or "/x/v1" behind a
// proxy prefix).
struct Target {
    std::string origin;
    std::string api;   // ".../v1"
    std::string root;  // the prefix without "/v1", where /tokenize lives
};

Target parse_url(std::string url) {
    if (url.rfind("https://", 0) == 0)
        throw Error(ErrorCode::kInvalidArgument, "--url: https is not supported, use http://");
    if (url.rfind("http://", 0) != 0)
        throw Error(ErrorCode::kInvalidArgument, "--url must start with http:// (got '" + url + "')");
    const size_t slash = url.find('/', 7);
    Target t;
    t.origin = url.substr(0, slash);
    std::string path = slash == std::string::npos ? "" : url.substr(slash);
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (t.origin.size() <= 7) throw Error(ErrorCode::kInvalidArgument, "--url has no host: '" + url + "'");
    if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) path.resize(path.size() - 3);
    t.root = path;
    t.api = path + "/v1";
    return t;
}

std::unique_ptr<httplib::Client> connect(const Target& t, const BenchServeOptions& o) {
    auto c = std::make_unique<httplib::Client>(t.origin);
    if (!c->is_valid()) throw Error(ErrorCode::kInvalidArgument, "--url: cannot use '" + t.origin + "'");
    c->set_connection_timeout(10, 0);
    // As API clients do: one connection a client for all its requests, small writes sent at once.
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    c->set_read_timeout(o.timeout_s, 0);
    c->set_write_timeout(60, 0);
    if (!o.api_key.empty()) c->set_bearer_token_auth(o.api_key);
    return c;
}

// A JSON answer of the server, or null when it cannot give one (no route, an error status, no server).
json call(httplib::Client& c, const std::string& method, const std::string& path, const json& body = nullptr,
          int* status = nullptr) {
    auto res = method == "GET" ? c.Get(path) : c.Post(path, body.dump(), "application/json");
    if (status) *status = res ? res->status : -1;
    if (!res || res->status != 200) return nullptr;
    json j = json::parse(res->body, nullptr, false);
    return j.is_discarded() ? json(nullptr) : j;
}

// ---- prompts ----

// Short, common English words, space-separated: nearly every BPE vocabulary holds each as one token
// after a space.
constexpr const char* kWordList =
    "the time people year way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city name team "
    "minute idea kid body back parent face others level office door health person art war history party "
    "result change morning reason research girl guy moment air teacher force education foot boy age "
    "policy music market sense nation plan college interest death experience effect class control care "
    "field development role effort rate heart drug show leader light voice wife police mind price report "
    "decision son view relationship town road arm difference value building action model season society "
    "tax director position player record paper space ground form event official matter center couple "
    "site project activity star table need court oil situation cost industry figure street image phone "
    "data picture practice piece land product doctor wall patient worker news test movie north love "
    "support technology step baby computer type attention film tree source organization hair window "
    "evidence population rock bird river garden small big old new good long great little own other large "
    "young early important few public bad same able red green blue happy quick slow warm cold bright "
    "dark soft loud quiet ";

std::vector<std::string> words() {
    std::vector<std::string> out;
    std::string w;
    for (const char* p = kWordList;; ++p) {
        if (*p == ' ' || *p == 0) {
            if (!w.empty()) out.push_back(std::move(w));
            w.clear();
            if (*p == 0) break;
        } else {
            w += *p;
        }
    }
    return out;
}

std::string random_words(std::mt19937_64& rng, int n) {
    static const std::vector<std::string> kWords = words();
    std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
    std::string s;
    for (int i = 0; i < n; ++i) {
        if (i) s += ' ';
        s += kWords[pick(rng)];
    }
    return s;
}

// One prompt per request. Generated ones are cut to the token count when the server can tokenize;
// `exact` tells whether it could.
std::vector<std::string> make_prompts(httplib::Client& c, const Target& t, const BenchServeOptions& o, bool* exact) {
    std::vector<std::string> out;
    if (!o.prompts_file.empty()) {
        std::ifstream f(o.prompts_file);
        if (!f) throw Error(ErrorCode::kIo, "cannot open --prompts file " + o.prompts_file);
        std::vector<std::string> lines;
        for (std::string line; std::getline(f, line);) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
        }
        if (lines.empty())
            throw Error(ErrorCode::kInvalidArgument, "--prompts file " + o.prompts_file + " has no prompts");
        for (int i = 0; i < o.requests; ++i) out.push_back(lines[size_t(i) % lines.size()]);
        *exact = false;
        return out;
    }
    *exact = true;
    for (int i = 0; i < o.requests; ++i) {
        std::mt19937_64 rng(o.seed * 1000003u + uint64_t(i));
        std::string text = random_words(rng, o.prompt_tokens);
        if (*exact) {
            // Enough words for the count (a word is at least one token), then the first prompt_tokens
            // of their tokens back as text.
            const json tok = call(c, "POST", t.root + "/tokenize", {{"content", text}});
            const json* ids =
                tok.is_object() && tok.contains("tokens") && tok["tokens"].is_array() ? &tok["tokens"] : nullptr;
            if (ids && int(ids->size()) >= o.prompt_tokens) {
                json cut = json::array();
                for (int k = 0; k < o.prompt_tokens; ++k) cut.push_back((*ids)[size_t(k)]);
                const json detok = call(c, "POST", t.root + "/detokenize", {{"tokens", cut}});
                if (detok.is_object() && detok.contains("content") && detok["content"].is_string())
                    text = detok["content"].get<std::string>();
                else
                    *exact = false;
            } else {
                *exact = false;
            }
        }
        // A leading space left by the cut would only add a token.
        if (!text.empty() && text.front() == ' ') text.erase(0, 1);
        out.push_back(std::move(text));
    }
    return out;
}

// ---- one streamed request ----

struct Sample {
    bool ok = false, cancelled = false;
    std::string error;
    double start = 0, end = 0;  // seconds from the run's start
    double ttft = -1;           // seconds to the first text
    std::vector<double> gaps;   // seconds between consecutive text chunks
    int64_t prompt_tokens = -1;
    int64_t output_tokens = 0;  // the usage figure when the server sends one, else the text chunks
    bool unanswered = false;    // the connection failed before any response came (see run_request's callers)
};

// Parses the server-sent events of one streamed completion as they arrive.
struct EventReader {
    bool chat = true;
    std::string buf;
    bool done = false, finished = false;
    std::string error;
    int64_t chunks = 0, prompt_tokens = -1, completion_tokens = -1;
    Clock::time_point first{}, last{};
    std::vector<double> gaps;

    void feed(const char* data, size_t n) {
        for (size_t i = 0; i < n; ++i)
            if (data[i] != '\r') buf += data[i];
        for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
            const std::string event = buf.substr(0, end);
            buf.erase(0, end + 2);
            size_t pos = 0;
            while (pos <= event.size()) {
                size_t nl = event.find('\n', pos);
                if (nl == std::string::npos) nl = event.size();
                const std::string line = event.substr(pos, nl - pos);
                pos = nl + 1;
                if (line.rfind("data:", 0) == 0) on_data(line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5));
            }
        }
    }

    void on_data(const std::string& data) {
        if (data == "[DONE]") {
            done = true;
            return;
        }
        const json j = json::parse(data, nullptr, false);
        if (!j.is_object()) {
            if (error.empty()) error = "a stream event is not JSON";
            return;
        }
        if (j.contains("error")) {
            const json& e = j["error"];
            error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                       : e.dump();
            return;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
            const json& u = j["usage"];
            if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
                prompt_tokens = u["prompt_tokens"].get<int64_t>();
            if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
                completion_tokens = u["completion_tokens"].get<int64_t>();
        }
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
        const json& c = j["choices"][0];
        const json* text = nullptr;
        if (chat && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content"))
            text = &c["delta"]["content"];
        else if (!chat && c.contains("text"))
            text = &c["text"];
        if (text && text->is_string() && !text->get_ref<const std::string&>().empty()) {
            const auto now = Clock::now();
            if (chunks == 0)
                first = now;
            else
                gaps.push_back(std::chrono::duration<double>(now - last).count());
            last = now;
            ++chunks;
        }
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) finished = true;
    }
};

Sample run_request(httplib::Client& c, const Target& t, const BenchServeOptions& o, const std::string& model,
                   const std::string& prompt, int64_t cancel_after, Clock::time_point t0) {
    const bool chat = o.endpoint == "chat";
    json body = {{"max_tokens", o.max_tokens},
                 {"temperature", o.temperature},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}},
                 {"ignore_eos", o.ignore_eos}};
    if (!model.empty()) body["model"] = model;
    for (const auto& [key, value] : o.extra_body.items()) body[key] = value;
    if (chat)
        body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
    else
        body["prompt"] = prompt;

    Sample s;
    EventReader ev;
    ev.chat = chat;
    int status = -1;
    std::string error_body;
    httplib::Request req;
    req.method = "POST";
    req.path = t.api + (chat ? "/chat/completions" : "/completions");
    req.body = body.dump();
    req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    if (!o.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + o.api_key);
    req.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        return true;
    };
    bool cancelling = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (status != 200) {
            if (error_body.size() < 4096) error_body.append(data, n);
            return true;
        }
        ev.feed(data, n);
        if (cancel_after > 0 && ev.chunks >= cancel_after && !ev.finished) cancelling = true;
        return !cancelling;  // false closes the connection: the server sees the client go away
    };
    const auto start = Clock::now();
    s.start = std::chrono::duration<double>(start - t0).count();
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = c.send(req, res, err);
    s.end = std::chrono::duration<double>(Clock::now() - t0).count();
    if (ev.chunks > 0) s.ttft = std::chrono::duration<double>(ev.first - start).count();
    s.gaps = std::move(ev.gaps);
    s.prompt_tokens = ev.prompt_tokens;
    s.output_tokens = ev.completion_tokens >= 0 ? ev.completion_tokens : ev.chunks;
    if (cancelling) {
        s.cancelled = true;
        s.output_tokens = ev.chunks;
    } else if (!sent && status != 200) {
        s.error = std::string("HTTP request failed: ") + httplib::to_string(err);
        s.unanswered = status < 0;
    } else if (status != 200) {
        const json j = json::parse(error_body, nullptr, false);
        std::string msg = j.is_object() && j.contains("error") && j["error"].is_object() &&
                                  j["error"].contains("message") && j["error"]["message"].is_string()
                              ? j["error"]["message"].get<std::string>()
                              : error_body.substr(0, 200);
        s.error = "HTTP " + std::to_string(status) + ": " + msg;
    } else if (!ev.error.empty()) {
        s.error = "stream error: " + ev.error;
    } else if (!sent) {
        s.error = std::string("stream cut: ") + httplib::to_string(err);
    } else if (!ev.finished && !ev.done) {
        s.error = "the stream ended without a finish reason";
    } else {
        s.ok = true;
    }
    return s;
}

// ---- summary ----


json distribution(const std::vector<double>& v, double scale) {
    double sum = 0;
    for (double x : v) sum += x;
    return {{"n", v.size()},
            {"mean", v.empty() ? 0.0 : sum / double(v.size()) * scale},
            {"p50", percentile(v, 0.50) * scale},
            {"p90", percentile(v, 0.90) * scale},
            {"p99", percentile(v, 0.99) * scale}};
}

json summarize(const BenchServeOptions& o, const std::string& model, bool exact, const std::vector<Sample>& samples) {
    int ok = 0, cancelled = 0, errors = 0;
    int64_t out_tokens = 0, in_tokens = 0, in_known = 0;
    double first = 1e300, last = 0;
    std::vector<double> ttft, gaps, latency;
    std::map<std::string, int> messages;
    for (const Sample& s : samples) {
        first = std::min(first, s.start);
        last = std::max(last, s.end);
        if (s.ok || s.cancelled) out_tokens += s.output_tokens;
        if (s.prompt_tokens >= 0) in_tokens += s.prompt_tokens, ++in_known;
        if (s.ok) {
            ++ok;
            if (s.ttft >= 0) ttft.push_back(s.ttft);
            gaps.insert(gaps.end(), s.gaps.begin(), s.gaps.end());
            latency.push_back(s.end - s.start);
        } else if (s.cancelled) {
            ++cancelled;
        } else {
            ++errors;
            ++messages[s.error];
        }
    }
    const double duration = samples.empty() ? 0.0 : last - first;
    json errs = json::array();
    for (const auto& [m, n] : messages) errs.push_back({{"message", m}, {"count", n}});
    return {{"url", o.url},
            {"endpoint", o.endpoint},
            {"model", model},
            {"clients", o.clients},
            {"prompt_tokens", o.prompts_file.empty() ? json(o.prompt_tokens) : json(nullptr)},
            {"prompt_tokens_exact", exact},
            {"max_tokens", o.max_tokens},
            {"requests", {{"total", samples.size()}, {"ok", ok}, {"cancelled", cancelled}, {"errors", errors}}},
            {"duration_s", duration},
            {"requests_per_s", duration > 0 ? ok / duration : 0.0},
            {"input_tokens", in_tokens},
            {"input_tokens_mean", in_known ? double(in_tokens) / double(in_known) : 0.0},
            {"output_tokens", out_tokens},
            {"output_tokens_per_s", duration > 0 ? double(out_tokens) / duration : 0.0},
            {"ttft_ms", distribution(ttft, 1e3)},
            {"itl_ms", distribution(gaps, 1e3)},
            {"latency_s", distribution(latency, 1.0)},
            {"errors", errs}};
}

void print_text(const json& r) {
    const json& q = r["requests"];
    std::printf("cera bench-serve: %s, %s, model %s, %d clients\n", r["url"].get<std::string>().c_str(),
                r["endpoint"].get<std::string>().c_str(), r["model"].get<std::string>().c_str(),
                r["clients"].get<int>());
    std::printf("requests:      %d ok, %d cancelled, %d errors of %d in %.2f s: %.2f requests/s\n", q["ok"].get<int>(),
                q["cancelled"].get<int>(), q["errors"].get<int>(), q["total"].get<int>(), r["duration_s"].get<double>(),
                r["requests_per_s"].get<double>());
    std::printf("tokens:        %.1f in a request (mean)%s, %lld out: %.1f output tokens/s\n",
                r["input_tokens_mean"].get<double>(),
                r["prompt_tokens_exact"].get<bool>() ? "" : " (prompt length approximate)",
                (long long)r["output_tokens"].get<int64_t>(), r["output_tokens_per_s"].get<double>());
    auto line = [&](const char* name, const json& d, const char* unit) {
        std::printf("%-14s mean %8.2f  p50 %8.2f  p90 %8.2f  p99 %8.2f %s (%d samples)\n", name,
                    d["mean"].get<double>(), d["p50"].get<double>(), d["p90"].get<double>(), d["p99"].get<double>(),
                    unit, d["n"].get<int>());
    };
    line("TTFT:", r["ttft_ms"], "ms");
    line("ITL:", r["itl_ms"], "ms");
    line("latency:", r["latency_s"], "s");
    for (const json& e : r["errors"])
        std::printf("error (%d): %s\n", e["count"].get<int>(), e["message"].get<std::string>().c_str());
}

int run_bench_serve(const std::vector<std::string>& args) {
    CLI::App app{
        "Load-tests an OpenAI-compatible server (cera serve, llama-server, ...): concurrent streamed requests; "
        "requests/s, output tokens/s, time to first token and inter-token latency.",
        "cera bench-serve"};
    BenchServeOptions o;
    bool keep_eos = false;
    app.add_option("--url", o.url, "the server, e.g. http://127.0.0.1:8080")->required();
    app.add_option("-c,--clients", o.clients, "concurrent clients")->capture_default_str()->check(CLI::Range(1, 4096));
    app.add_option("--requests", o.requests, "requests in all")->capture_default_str()->check(CLI::Range(1, 1000000));
    app.add_option("--endpoint", o.endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
        ->capture_default_str()
        ->check(CLI::IsMember({"chat", "completions"}));
    app.add_option("-p,--prompt-tokens", o.prompt_tokens, "prompt length in tokens (generated prompts)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--prompts", o.prompts_file, "a file of prompts, one a line, used in turn");
    app.add_option("-n,--max-tokens", o.max_tokens, "tokens to generate per request")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_flag("--keep-eos", keep_eos, "let requests end at end-of-generation (default: ask for ignore_eos)");
    app.add_option("--temp", o.temperature, "sampling temperature")->capture_default_str()->check(CLI::Range(0.0, 2.0));
    app.add_option("--cancel-rate", o.cancel_rate, "share of requests abandoned part-way through, at random")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--model", o.model, "the model field (default: the first of /v1/models)");
    app.add_option("--api-key", o.api_key, "sent as 'Authorization: Bearer KEY'");
    app.add_option("--seed", o.seed, "seeds the prompts and the cancels")->capture_default_str();
    app.add_option("--timeout", o.timeout_s, "seconds to wait for a server's next bytes")
        ->capture_default_str()
        ->check(CLI::Range(1, 86400));
    std::string extra_body;
    app.add_option("--extra-body", extra_body,
                   "a JSON object (its text, or a file holding it) whose members every request body gets");
    app.add_flag("--json", o.json, "print the results as one JSON object");
    if (int rc = parse_args(app, args, "bench-serve"); rc >= 0) return rc;
    o.ignore_eos = !keep_eos;
    if (!extra_body.empty()) {
        o.extra_body = json::parse(json_object_arg(extra_body), nullptr, false);
        if (!o.extra_body.is_object())
            throw Error(ErrorCode::kInvalidArgument, "--extra-body: not a JSON object: " + extra_body.substr(0, 80));
        for (const char* own : {"stream", "prompt", "messages"})
            if (o.extra_body.contains(own))
                throw Error(ErrorCode::kInvalidArgument,
                            std::string("--extra-body: '") + own + "' is the tool's own field and cannot be set");
    }
    const Target target = parse_url(o.url);

    auto control = connect(target, o);
    int status = -1;
    const json models = call(*control, "GET", target.api + "/models", nullptr, &status);
    if (status < 0) throw Error(ErrorCode::kIo, "cannot reach " + o.url);
    if (status == 401) throw Error(ErrorCode::kInvalidArgument, o.url + " needs an API key (--api-key) or another one");
    std::string model = o.model;
    if (model.empty() && models.is_object() && models.contains("data") && models["data"].is_array() &&
        !models["data"].empty() && models["data"][0].contains("id") && models["data"][0]["id"].is_string())
        model = models["data"][0]["id"].get<std::string>();
    bool exact = false;
    const std::vector<std::string> prompts = make_prompts(*control, target, o, &exact);

    // Which requests the client abandons, and after how many text chunks, fixed up front by the seed.
    std::vector<int64_t> cancel_after(size_t(o.requests), 0);
    std::mt19937_64 rng(o.seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<int64_t> at(1, std::max(1, o.max_tokens - 1));
    for (auto& c : cancel_after) c = u(rng) < o.cancel_rate ? at(rng) : 0;

    std::vector<Sample> samples(size_t(o.requests));
    std::atomic<int> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int k = 0; k < std::min(o.clients, o.requests); ++k)
        clients.emplace_back([&] {
            auto c = connect(target, o);
            bool reused = false;
            for (int i; (i = next++) < o.requests;) {
                Sample& s = samples[size_t(i)];
                s = run_request(*c, target, o, model, prompts[size_t(i)], cancel_after[size_t(i)], t0);
                // A kept-alive connection that the server closed after its last answer fails the next
                // request before any byte of a response, as HTTP clients know: once on a new connection,
                // timed from the first attempt.
                if (s.unanswered && reused) {
                    const double first_start = s.start;
                    c = connect(target, o);
                    s = run_request(*c, target, o, model, prompts[size_t(i)], cancel_after[size_t(i)], t0);
                    if (s.ttft >= 0) s.ttft += s.start - first_start;
                    s.start = first_start;
                }
                reused = !s.unanswered;
            }
        });
    for (auto& t : clients) t.join();

    const json r = summarize(o, model, exact, samples);
    if (o.json)
        std::printf("%s\n", r.dump(2).c_str());
    else
        print_text(r);
    const json& q = r["requests"];
    if (q["ok"].get<int>() + q["cancelled"].get<int>() == 0) {
        std::fprintf(stderr, "cera bench-serve: error: every request failed (%s)\n",
                     r["errors"].empty() ? "?" : r["errors"][0]["message"].get<std::string>().c_str());
        return 1;
    }
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(bench_serve, "bench-serve", "load-test an OpenAI-compatible server (streamed, concurrent)",
                 run_bench_serve);

}  // namespace cera::cli
