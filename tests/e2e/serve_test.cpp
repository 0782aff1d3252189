// The HTTP server (server/server.h) on the bundled tiny LFM2 model, over real HTTP on a free port:
// chat and text completions (plain and streamed) give what a Session gives for the same prompt and
// options, concurrent requests what they give one at a time, and every refused request its status
// and an OpenAI-shaped error body.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "cera/engine.h"
#include "cera/session.h"
#include "serve_util.h"
#include "server/server.h"
#include "test_util.h"

namespace cera {
namespace {

using json = nlohmann::json;

std::shared_ptr<Engine> engine() {
    static std::shared_ptr<Engine> e =
        Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 2, .n_ctx = 256});
    return e;
}

// A server on a free port, serving on its own thread.
struct Running {
    explicit Running(ServeOptions o = {}) {
        o.port = 0;
        o.alias = "tiny";
        o.batch.parallel = 4;
        o.batch.block_size = 16;
        server = std::make_unique<Server>(engine(), o);
        EXPECT_TRUE(server->bind());
        thread = std::thread([this] { server->run(); });
        client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
        client->set_read_timeout(60, 0);
        for (int i = 0; i < 100 && !client->Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ~Running() {
        server->stop();
        thread.join();
    }
    std::unique_ptr<Server> server;
    std::thread thread;
    std::unique_ptr<httplib::Client> client;
};

std::string session_text(const std::vector<int32_t>& prompt, int max_tokens) {
    return test::greedy_after(engine(), prompt, max_tokens);
}

const char* const kMessages = R"([{"role": "system", "content": "You are terse."},
                                  {"role": "user", "content": [{"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}]}])";

TEST(Serve, ChatCompletionIsTheSessionsText) {
    Running r;
    auto res = r.client->Post("/v1/chat/completions",
                              R"({"model": "tiny", "temperature": 0, "max_tokens": 12, "messages": )" + std::string(kMessages) + "}",
                              "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["model"], "tiny");
    std::vector<ChatMessage> msgs(2);
    msgs[0].role = "system", msgs[0].content = "You are terse.";
    msgs[1].role = "user", msgs[1].content = "Once upon a time";
    ChatTemplate tmpl(engine()->chat_template().empty() ? std::string(kChatMlTemplate) : engine()->chat_template());
    const std::vector<int32_t> prompt = chat_prompt(*engine(), tmpl, msgs);
    EXPECT_EQ(j["choices"][0]["message"]["content"], session_text(prompt, 12));
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
    const std::string reason = j["choices"][0]["finish_reason"];
    EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
}

TEST(Serve, StreamedChunksAddUpToThePlainText) {
    Running r;
    const std::string body = R"({"temperature": 0, "max_tokens": 16, "messages": )" + std::string(kMessages);
    auto plain = r.client->Post("/v1/chat/completions", body + "}", "application/json");
    ASSERT_TRUE(plain && plain->status == 200);
    auto res = r.client->Post("/v1/chat/completions", body + R"(, "stream": true, "stream_options": {"include_usage": true}})",
                              "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200);
    std::string text, finish;
    bool role = false, usage = false, done = false;
    std::istringstream lines(res->body);
    for (std::string line; std::getline(lines, line);) {
        if (line.empty()) continue;
        ASSERT_EQ(line.rfind("data: ", 0), 0u) << line;
        const std::string data = line.substr(6);
        if (data == "[DONE]") {
            done = true;
            continue;
        }
        const json c = json::parse(data);
        EXPECT_EQ(c["object"], "chat.completion.chunk");
        if (c["choices"].empty()) {
            usage = c["usage"]["completion_tokens"].get<int>() > 0;
            continue;
        }
        const json& d = c["choices"][0]["delta"];
        if (d.contains("role")) role = true;
        if (d.contains("content")) text += d["content"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_TRUE(role && usage && done);
    EXPECT_EQ(text, json::parse(plain->body)["choices"][0]["message"]["content"]);
    EXPECT_EQ(finish, json::parse(plain->body)["choices"][0]["finish_reason"]);
}

TEST(Serve, CompletionsAndConcurrentRequests) {
    Running r;
    std::vector<std::string> prompts;
    for (int i = 0; i < 12; ++i) prompts.push_back("Story number " + std::to_string(i) + ": once");
    std::vector<std::string> got(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i)
        threads.emplace_back([&, i] {
            httplib::Client c("127.0.0.1", r.server->port());
            c.set_read_timeout(60, 0);
            auto res = c.Post("/v1/completions", json{{"prompt", prompts[i]}, {"temperature", 0}, {"max_tokens", 10}}.dump(),
                              "application/json");
            if (res && res->status == 200) got[i] = json::parse(res->body)["choices"][0]["text"];
        });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(got[i], session_text(engine()->tokenize(prompts[i], engine()->add_bos()), 10)) << "request " << i;
    auto tok = r.client->Post("/tokenize", R"({"content": "Once upon a time"})", "application/json");
    ASSERT_TRUE(tok && tok->status == 200);
    auto detok = r.client->Post("/detokenize", json{{"tokens", json::parse(tok->body)["tokens"]}}.dump(), "application/json");
    ASSERT_TRUE(detok && detok->status == 200);
    EXPECT_EQ(json::parse(detok->body)["content"], "Once upon a time");
    auto models = r.client->Get("/v1/models");
    ASSERT_TRUE(models && models->status == 200);
    EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
    auto one = r.client->Get("/v1/models/tiny");
    ASSERT_TRUE(one && one->status == 200);
    EXPECT_EQ(json::parse(one->body)["id"], "tiny");
    auto none = r.client->Get("/v1/models/nope");
    ASSERT_TRUE(none && none->status == 404);
    EXPECT_EQ(json::parse(none->body)["error"]["code"], "model_not_found");
    // llama.cpp's /props: the context, the slots, the template, what a request that sets nothing samples with.
    auto props = r.client->Get("/props");
    ASSERT_TRUE(props && props->status == 200);
    const json p = json::parse(props->body);
    EXPECT_EQ(p["default_generation_settings"]["n_ctx"], engine()->info().n_ctx);
    EXPECT_FLOAT_EQ(p["default_generation_settings"]["params"]["temperature"].get<float>(), 0.8f);
    EXPECT_EQ(p["default_generation_settings"]["params"]["top_k"], 40);
    EXPECT_EQ(p["total_slots"], 4);
    EXPECT_EQ(p["model_alias"], "tiny");
    EXPECT_EQ(p["model_path"], engine()->info().path);
    EXPECT_EQ(p["modalities"]["vision"], false);
    EXPECT_EQ(p["chat_template"], engine()->chat_template());
    EXPECT_EQ(p["eos_token"], engine()->detokenize(std::vector<int32_t>{engine()->eos_token()}, true));
}

// llama.cpp's /completion: its request fields and response shapes, the text a Session gives.
TEST(Serve, LlamaCppCompletionEndpoint) {
    Running r;
    const std::vector<int32_t> prompt = engine()->tokenize("Once upon a time", engine()->add_bos());
    const std::string want = session_text(prompt, 12);
    auto res = r.client->Post("/completion", R"({"prompt": "Once upon a time", "n_predict": 12, "temperature": 0})",
                              "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    const json j = json::parse(res->body);
    EXPECT_EQ(j["content"], want);
    EXPECT_EQ(j["stop"], true);
    EXPECT_EQ(j["model"], "tiny");
    EXPECT_EQ(j["tokens_predicted"], 12);
    EXPECT_EQ(j["tokens_evaluated"], prompt.size());
    EXPECT_EQ(j["stop_type"], "limit");
    // Streamed: the pieces, then one last object with stop true; no [DONE].
    res = r.client->Post("/completion",
                         R"({"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "stream": true})",
                         "application/json");
    ASSERT_TRUE(res && res->status == 200);
    bool done = false;
    const std::vector<json> events = test::sse_events(res->body, &done);
    EXPECT_FALSE(done);
    ASSERT_GE(events.size(), 2u);
    std::string text;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        EXPECT_EQ(events[i]["stop"], false);
        text += events[i]["content"].get<std::string>();
    }
    EXPECT_EQ(text, want);
    EXPECT_EQ(events.back()["stop"], true);
    EXPECT_EQ(events.back()["tokens_predicted"], 12);
    // A stop word ends it, named; token ids as the prompt.
    const std::string word = want.substr(want.size() / 2, 3);
    res = r.client->Post("/completion",
                         json{{"prompt", prompt}, {"n_predict", 12}, {"temperature", 0}, {"stop", {word}}}.dump(),
                         "application/json");
    ASSERT_TRUE(res && res->status == 200);
    EXPECT_EQ(json::parse(res->body)["stop_type"], "word");
    EXPECT_EQ(json::parse(res->body)["stopping_word"], word);
    EXPECT_EQ(json::parse(res->body)["content"], want.substr(0, want.find(word)));
    // n_probs: each token's id, text and log-probability with its 3 likeliest alternatives, the same
    // figures as the OpenAI completions' logprobs of the request (checked against the model's logits in
    // serve_api_test), plain and streamed.
    const json probe = {{"prompt", "Once upon a time"}, {"n_predict", 12}, {"temperature", 0}, {"n_probs", 3}};
    res = r.client->Post("/completion", probe.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
    const json probs = json::parse(res->body)["completion_probabilities"];
    ASSERT_EQ(probs.size(), 12u) << res->body;
    res = r.client->Post(
        "/v1/completions",
        json{{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 3}}.dump(),
        "application/json");
    ASSERT_TRUE(res && res->status == 200);
    const json oai = json::parse(res->body)["choices"][0]["logprobs"];
    std::string joined;
    for (size_t i = 0; i < probs.size(); ++i) {
        const json& p = probs[i];
        joined += p["token"].get<std::string>();
        EXPECT_EQ(p["token"], oai["tokens"][i]);
        EXPECT_NEAR(p["logprob"].get<double>(), oai["token_logprobs"][i].get<double>(), 1e-6);
        ASSERT_EQ(p["top_logprobs"].size(), 3u);
        EXPECT_EQ(p["top_logprobs"][0]["id"], p["id"]);  // greedy: the likeliest
        EXPECT_EQ(engine()->token_bytes(p["id"].get<int32_t>()), p["token"].get<std::string>());
        for (const json& t : p["top_logprobs"])
            EXPECT_NEAR(t["logprob"].get<double>(), oai["top_logprobs"][i][t["token"].get<std::string>()].get<double>(),
                        1e-6);
    }
    EXPECT_EQ(joined, want);
    json streamed_probe = probe;
    streamed_probe["stream"] = true;
    res = r.client->Post("/completion", streamed_probe.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    json streamed = json::array();
    for (const json& e : test::sse_events(res->body))
        if (e.contains("completion_probabilities"))
            for (const json& p : e["completion_probabilities"]) streamed.push_back(p);
    EXPECT_EQ(streamed, probs);
    res = r.client->Post("/completion", R"({"prompt": "x", "n_probs": 1000})", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
    EXPECT_EQ(json::parse(res->body)["error"]["param"], "n_probs");
}

TEST(Serve, RefusedRequestsGetTheirStatusAndAnErrorBody) {
    ServeOptions o;
    o.max_body_bytes = 4096;
    Running r(o);
    struct Case {
        const char* path;
        std::string body;
        int status;
        const char* param;
    };
    const std::vector<Case> cases = {
        {"/v1/chat/completions", "{not json", 400, nullptr},
        {"/v1/chat/completions", "[1, 2]", 400, nullptr},
        {"/v1/chat/completions", R"({"messages": []})", 400, "messages"},
        {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", 400, "messages"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages"},
        {"/v1/chat/completions", R"({"temperature": "hot", "messages": [{"role": "user", "content": "hi"}]})", 400,
         "temperature"},
        {"/v1/chat/completions", R"({"n": 0, "messages": [{"role": "user", "content": "hi"}]})", 400, "n"},
        {"/v1/chat/completions", R"({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]})", 404,
         "model"},
        {"/v1/completions", R"({"prompt": 7})", 400, "prompt"},
        {"/v1/completions", R"({"prompt": [1, -4]})", 400, "prompt"},
        {"/v1/completions", json{{"prompt", std::vector<int>(300, 1)}}.dump(), 400, "prompt"},
        {"/v1/completions", R"({"prompt": "hi", "max_tokens": -3})", 400, "max_tokens"},
        {"/v1/completions", std::string(5000, ' '), 413, nullptr},
        {"/v1/nothing", "{}", 404, nullptr},
    };
    for (const Case& c : cases) {
        auto res = r.client->Post(c.path, c.body, "application/json");
        ASSERT_TRUE(res) << c.body.substr(0, 80);
        EXPECT_EQ(res->status, c.status) << c.body.substr(0, 80) << " -> " << res->body;
        const json e = json::parse(res->body, nullptr, false);
        ASSERT_FALSE(e.is_discarded()) << res->body;
        EXPECT_TRUE(e["error"]["message"].is_string()) << res->body;
        if (c.param) {
            EXPECT_EQ(e["error"]["param"], json(c.param)) << res->body;
        }
    }
}

TEST(Serve, ApiKey) {
    ServeOptions o;
    o.api_key = "sesame";
    Running r(o);
    EXPECT_EQ(r.client->Get("/health")->status, 200);
    auto no = r.client->Get("/v1/models");
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 401);
    EXPECT_EQ(json::parse(no->body)["error"]["code"], "invalid_api_key");
    EXPECT_EQ(r.client->Get("/v1/models", {{"Authorization", "Bearer wrong"}})->status, 401);
    EXPECT_EQ(r.client->Get("/v1/models", {{"Authorization", "Bearer sesame"}})->status, 200);
}

// A path asked for with a method it does not take is a 405 naming the methods it takes; a browser's
// CORS preflight, which carries no key, learns them too, and every reply allows any origin.
TEST(Serve, MethodsAndCorsPreflight) {
    ServeOptions o;
    o.api_key = "sesame";
    Running r(o);
    const httplib::Headers key = {{"Authorization", "Bearer sesame"}};
    struct Case {
        const char* method;
        const char* path;
        const char* allow;
    };
    for (const Case& c :
         {Case{"GET", "/v1/chat/completions", "POST"}, Case{"DELETE", "/v1/models", "GET"},
          Case{"POST", "/v1/models/tiny", "GET"}, Case{"GET", "/lora/x", "DELETE"}, Case{"PUT", "/tokenize", "POST"}}) {
        httplib::Request req;
        req.method = c.method;
        req.path = c.path;
        req.headers = key;
        if (req.method != "GET" && req.method != "DELETE")
            req.body = "{}", req.set_header("Content-Type", "application/json");
        auto res = r.client->send(req);
        ASSERT_TRUE(res) << c.method << " " << c.path;
        EXPECT_EQ(res->status, 405) << c.method << " " << c.path << " -> " << res->body;
        EXPECT_EQ(res->get_header_value("Allow"), c.allow) << c.method << " " << c.path;
        const json e = json::parse(res->body, nullptr, false);
        ASSERT_FALSE(e.is_discarded()) << res->body;
        EXPECT_EQ(e["error"]["message"], "method not allowed");
    }
    EXPECT_EQ(r.client->Get("/v1/nothing", key)->status, 404);

    auto pre =
        r.client->Options("/v1/chat/completions", {{"Origin", "http://example.test"},
                                                   {"Access-Control-Request-Method", "POST"},
                                                   {"Access-Control-Request-Headers", "authorization,content-type"}});
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "*");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization,content-type");
    EXPECT_EQ(r.client->Options("/v1/nothing")->status, 404);

    auto models = r.client->Get("/v1/models", {{"Authorization", "Bearer sesame"}, {"Origin", "http://example.test"}});
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
    EXPECT_EQ(models->get_header_value("Access-Control-Allow-Origin"), "*");
    auto refused = r.client->Get("/v1/models", {{"Origin", "http://example.test"}});
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 401);
    EXPECT_EQ(refused->get_header_value("Access-Control-Allow-Origin"), "*");
}

}  // namespace
}  // namespace cera
