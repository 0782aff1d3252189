// LoRA adapters in the HTTP server over real HTTP: a request's "model" selects the base model ("base" or
// the served id) or a named adapter, and gets what a Session gives with that adapter; /v1/models lists
// the adapters; POST /lora and DELETE /lora/NAME add and remove them while serving, behind the API key;
// unknown names and bad adapters come back as OpenAI-shaped errors.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "cera/engine.h"
#include "cera/session.h"
#include "server/server.h"
#include "test_util.h"

namespace cera {
namespace {

using json = nlohmann::json;

std::string fx(const std::string& rel) { return test::data_path("fixtures/" + rel); }

struct Running {
    explicit Running(std::shared_ptr<Engine> e, ServeOptions o = {}) : engine(std::move(e)) {
        o.port = 0;
        o.alias = "tiny";
        o.batch.parallel = 4;
        o.batch.block_size = 16;
        server = std::make_unique<Server>(engine, o);
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
    json post(const std::string& path, const json& body, int* status) {
        auto res = client->Post(path, headers, body.dump(), "application/json");
        if (!res) return json{{"no", "answer"}};
        *status = res->status;
        return json::parse(res->body, nullptr, false);
    }
    std::shared_ptr<Engine> engine;
    std::unique_ptr<Server> server;
    std::thread thread;
    std::unique_ptr<httplib::Client> client;
    httplib::Headers headers;
};

std::shared_ptr<Engine> load_engine() {
    return Engine::load(fx("tiny-lfm2/model.gguf"), {.device = "cpu", .threads = 2, .n_ctx = 128});
}

std::string session_text(const std::shared_ptr<Engine>& e, const std::string& prompt, const std::string& adapter) {
    Session s(e);
    s.append_text(prompt, true);
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 12;
    g.ignore_eos = true;
    g.adapter = adapter;
    NullSink sink;
    return s.generate(g, sink).text;
}

json completion(const std::string& model, const std::string& prompt) {
    json j = {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 12}, {"ignore_eos", true}};
    if (!model.empty()) j["model"] = model;
    return j;
}

TEST(ServeLora, ModelFieldSelectsAdapter) {
    auto e = load_engine();
    e->load_adapter("story", fx("tiny-lfm2/lora/lora.gguf"));
    e->load_adapter("half", fx("tiny-lfm2/lora/peft"), 0.5f);
    Running r(e);
    const std::string prompt = "Once upon a time";
    const std::string base = session_text(e, prompt, "base"), story = session_text(e, prompt, "story"),
                      half = session_text(e, prompt, "half");
    EXPECT_NE(base, story);
    // Several at once, so that base and adapter sequences share steps.
    std::vector<std::thread> threads;
    std::vector<std::string> got(6);
    const std::string models[6] = {"", "tiny", "base", "story", "half", "story"};
    for (int i = 0; i < 6; ++i)
        threads.emplace_back([&, i] {
            int status = 0;
            const json j = r.post("/v1/completions", completion(models[i], prompt), &status);
            EXPECT_EQ(status, 200) << j.dump();
            if (status == 200) got[size_t(i)] = j["choices"][0]["text"].get<std::string>();
        });
    for (auto& t : threads) t.join();
    EXPECT_EQ(got[0], base);
    EXPECT_EQ(got[1], base);
    EXPECT_EQ(got[2], base);
    EXPECT_EQ(got[3], story);
    EXPECT_EQ(got[4], half);
    EXPECT_EQ(got[5], story);
    // Chat too.
    int status = 0;
    json j = r.post("/v1/chat/completions",
                    {{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}, &status);
    EXPECT_EQ(status, 404) << j.dump();
    EXPECT_EQ(j["error"]["code"], "model_not_found") << j.dump();
    j = r.post("/v1/chat/completions",
               {{"model", "story"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}, &status);
    EXPECT_EQ(status, 200) << j.dump();
    // /v1/models: the base id, then the adapters.
    auto res = r.client->Get("/v1/models");
    ASSERT_TRUE(res);
    const json models_list = json::parse(res->body);
    std::vector<std::string> ids;
    for (const json& m : models_list["data"]) ids.push_back(m["id"]);
    EXPECT_EQ(ids, (std::vector<std::string>{"tiny", "half", "story"})) << res->body;
    EXPECT_EQ(models_list["data"][1]["lora"]["scale"], 0.5);
    // Embeddings do not apply adapters: refused rather than silently ignored.
    j = r.post("/v1/embeddings", {{"model", "story"}, {"input", "hi"}}, &status);
    EXPECT_EQ(status, 400) << j.dump();
}

TEST(ServeLora, PostAndDeleteWhileServing) {
    auto e = load_engine();
    ServeOptions o;
    o.api_key = "k";
    Running r(e, o);
    int status = 0;
    // Behind the key.
    json j = r.post("/lora", {{"name", "story"}, {"path", fx("tiny-lfm2/lora/lora.gguf")}}, &status);
    EXPECT_EQ(status, 401) << j.dump();
    r.headers = {{"Authorization", "Bearer k"}};
    j = r.post("/v1/completions", completion("story", "Once"), &status);
    EXPECT_EQ(status, 404) << j.dump();
    j = r.post("/lora", {{"name", "story"}, {"path", fx("tiny-lfm2/lora/lora.gguf")}}, &status);
    ASSERT_EQ(status, 200) << j.dump();
    j = r.post("/v1/completions", completion("story", "Once upon a time"), &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], session_text(e, "Once upon a time", "story"));
    // A name in use, a bad path, an adapter of another model: 400 with the reason.
    j = r.post("/lora", {{"name", "story"}, {"path", fx("tiny-lfm2/lora/peft")}}, &status);
    EXPECT_EQ(status, 400) << j.dump();
    j = r.post("/lora", {{"name", "x"}, {"path", fx("tiny-lfm2/lora/missing.gguf")}}, &status);
    EXPECT_EQ(status, 400) << j.dump();
    j = r.post("/lora", {{"name", "x"}, {"path", fx("tiny-qwen3/lora/peft")}}, &status);
    EXPECT_EQ(status, 400) << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find("has ne {"), std::string::npos) << j.dump();
    j = r.post("/lora", {{"path", fx("tiny-lfm2/lora/peft")}}, &status);
    EXPECT_EQ(status, 400) << j.dump();
    // DELETE: then the name is unknown again.
    auto res = r.client->Delete("/lora/story", r.headers);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    res = r.client->Delete("/lora/story", r.headers);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404) << res->body;
    j = r.post("/v1/completions", completion("story", "Once"), &status);
    EXPECT_EQ(status, 404) << j.dump();
    res = r.client->Delete("/lora/story");  // no key
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
}

}  // namespace
}  // namespace cera
