// The server's OpenAI API beyond plain completions, on the bundled tiny LFM2 model over real HTTP:
// logprobs (chat and completions, plain and streamed) against a log-softmax of the model's own logits
// computed here, logit_bias, penalties, n choices with their seeds, embeddings against Session::embed,
// /metrics, response_format and grammars, and every refused request's status and error body.
#include <cmath>
#include <cstring>

#include "cera/batcher.h"
#include "cera/session.h"
#include "chat/chat_template.h"
#include "models/model.h"
#include "runtime/engine_impl.h"
#include "serve_util.h"
#include "server/chat_prompt.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::RunningServer;
using test::serve_engine;

// Greedy decoding by hand on a single-sequence model state: at each step the log-softmax (in double)
// of the logits plus `bias`, and the arg-max of those.
struct Step {
    int32_t token;
    double logprob;
    std::vector<std::pair<int32_t, double>> top;  // every id by log-probability, best first
};
std::vector<Step> reference_greedy(const std::vector<int32_t>& prompt, int n,
                                   const std::vector<std::pair<int32_t, float>>& bias = {}) {
    const Model& model = *serve_engine()->impl().model;
    auto state = model.create_state(256);
    const int32_t n_vocab = serve_engine()->info().n_vocab;
    std::vector<float> row(static_cast<size_t>(n_vocab));
    state->eval({.tokens = prompt, .logits = row.data()});
    std::vector<Step> out;
    for (int i = 0; i < n; ++i) {
        std::vector<double> l(row.begin(), row.end());
        for (const auto& [id, b] : bias) l[size_t(id)] += b;
        const double mx = *std::max_element(l.begin(), l.end());
        double z = 0.0;
        for (double x : l) z += std::exp(x - mx);
        const double lse = mx + std::log(z);
        Step s;
        for (int32_t id = 0; id < n_vocab; ++id) s.top.emplace_back(id, l[size_t(id)] - lse);
        std::stable_sort(s.top.begin(), s.top.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        s.token = s.top[0].first;
        s.logprob = s.top[0].second;
        out.push_back(s);
        if (serve_engine()->is_eog(s.token)) break;
        state->eval({.tokens = {&s.token, 1}, .logits = row.data()});
    }
    return out;
}

std::vector<int> bytes_of(int32_t id) {
    std::vector<int> b;
    for (unsigned char c : serve_engine()->token_bytes(id)) b.push_back(c);
    return b;
}

std::vector<int32_t> chat_ids(const std::string& user) {
    std::vector<ChatMessage> msgs(1);
    msgs[0].role = "user";
    msgs[0].content = user;
    const std::string src = serve_engine()->chat_template();
    return chat_prompt(*serve_engine(), ChatTemplate(src.empty() ? std::string(kChatMlTemplate) : src), msgs);
}

TEST(ServeApi, ChatLogprobsAreTheLogSoftmaxOfTheModelsLogits) {
    RunningServer r;
    const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
                       {"temperature", 0},
                       {"max_tokens", 6},
                       {"logprobs", true},
                       {"top_logprobs", 3}};
    int status = 0;
    const json j = r.post("/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const std::vector<Step> ref = reference_greedy(chat_ids("Tell me a story"), 6);
    const json& content = j["choices"][0]["logprobs"]["content"];
    ASSERT_TRUE(content.is_array()) << j.dump();
    // The end token (if any) is not part of the content.
    const size_t n_content = ref.size() - (serve_engine()->is_eog(ref.back().token) ? 1 : 0);
    ASSERT_EQ(content.size(), n_content);
    std::string text;
    for (size_t i = 0; i < n_content; ++i) {
        const json& e = content[i];
        EXPECT_EQ(e["bytes"].get<std::vector<int>>(), bytes_of(ref[i].token)) << "token " << i;
        EXPECT_NEAR(e["logprob"].get<double>(), ref[i].logprob, 2e-3) << "token " << i;
        ASSERT_EQ(e["top_logprobs"].size(), 3u);
        for (size_t k = 0; k < 3; ++k) {
            EXPECT_NEAR(e["top_logprobs"][k]["logprob"].get<double>(), ref[i].top[k].second, 2e-3);
            // Near-ties may swap places; a clear winner must match.
            if (ref[i].top[k].second - ref[i].top[k + 1].second > 1e-2 &&
                (k == 0 || ref[i].top[k - 1].second - ref[i].top[k].second > 1e-2)) {
                EXPECT_EQ(e["top_logprobs"][k]["bytes"].get<std::vector<int>>(), bytes_of(ref[i].top[k].first));
            }
        }
        text += serve_engine()->token_bytes(ref[i].token);
    }
    EXPECT_EQ(j["choices"][0]["message"]["content"], text);

    // Streamed: the chunks' logprobs add up to the same list.
    json sb = body;
    sb["stream"] = true;
    auto res = r.client->Post("/v1/chat/completions", sb.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    json streamed = json::array();
    for (const json& c : test::sse_events(res->body)) {
        if (c["choices"].empty()) continue;
        const json& lp = c["choices"][0]["logprobs"];
        if (lp.is_null()) continue;
        for (const json& e : lp["content"]) streamed.push_back(e);
    }
    EXPECT_EQ(streamed, content);
}

TEST(ServeApi, CompletionLogprobsWithLogitBias) {
    RunningServer r;
    const std::string prompt = "Once upon a time";
    const std::vector<int32_t> ids = serve_engine()->tokenize(prompt, serve_engine()->add_bos());
    // Bias the second most likely first token above the first, and ban the first.
    const std::vector<Step> plain = reference_greedy(ids, 1);
    const int32_t second = plain[0].top[1].first, first = plain[0].top[0].first;
    const std::vector<std::pair<int32_t, float>> bias = {{second, 5.0f}, {first, -100.0f}};
    const std::vector<Step> ref = reference_greedy(ids, 5, bias);
    ASSERT_EQ(ref[0].token, second);
    int status = 0;
    const json j = r.post("/v1/completions",
                          {{"prompt", prompt},
                           {"temperature", 0},
                           {"max_tokens", 5},
                           {"logprobs", 2},
                           {"logit_bias", {{std::to_string(second), 5.0}, {std::to_string(first), -100}}}},
                          &status);
    ASSERT_EQ(status, 200) << j.dump();
    const json& lp = j["choices"][0]["logprobs"];
    const size_t n = ref.size() - (serve_engine()->is_eog(ref.back().token) ? 1 : 0);
    ASSERT_EQ(lp["tokens"].size(), n) << lp.dump();
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(lp["tokens"][i], serve_engine()->token_bytes(ref[i].token));
        EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref[i].logprob, 2e-3);
        EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
        EXPECT_EQ(lp["text_offset"][i], offset);
        for (unsigned char c : serve_engine()->token_bytes(ref[i].token)) offset += (c & 0xC0) != 0x80;  // characters
    }
    EXPECT_TRUE(j["choices"][0]["text"].get<std::string>().rfind(serve_engine()->token_bytes(second), 0) == 0);
}

// chat_template_kwargs reach the template as variables (booleans as booleans), as vLLM and llama.cpp
// pass them: the prompt this template renders is longer with the flag set.
TEST(ServeApi, ChatTemplateKwargsReachTheTemplate) {
    ServeOptions o;
    o.chat_template =
        "{% if flag is true %}one two three four five {% endif %}{{ tone | default('') }}"
        "{{ messages[0]['content'] }}";
    RunningServer r(o);
    auto prompt_tokens = [&](const json& kwargs) {
        json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}, {"temperature", 0}};
        if (!kwargs.is_null()) body["chat_template_kwargs"] = kwargs;
        int status = 0;
        const json j = r.post("/v1/chat/completions", body, &status);
        EXPECT_EQ(status, 200) << j.dump();
        return j["usage"]["prompt_tokens"].get<int>();
    };
    const int plain = prompt_tokens(nullptr);
    EXPECT_EQ(prompt_tokens({{"flag", false}}), plain);
    EXPECT_GT(prompt_tokens({{"flag", true}}), plain + 3);
    EXPECT_GT(prompt_tokens({{"tone", "calm calm calm "}}), plain);
    int status = 0;
    r.post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"chat_template_kwargs", {{"flag", 3}}}}, &status);
    EXPECT_EQ(status, 400);
    r.post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"chat_template_kwargs", {{"messages", "x"}}}},
           &status);
    EXPECT_EQ(status, 400);
}

// /apply-template renders a chat request as its completion's prompt: the template's own text for these
// messages, tools and kwargs.
TEST(ServeApi, ApplyTemplateGivesThePromptText) {
    ServeOptions o;
    o.chat_template =
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if tools %}tools={{ tools | length }} "
        "{{ tools[0].function.name }}\n{% endif %}{% if loud is true %}LOUD\n{% endif %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}";
    RunningServer r(o);
    const json messages = {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}};
    int status = 0;
    json j = r.post("/apply-template", {{"messages", messages}}, &status);
    EXPECT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j, json({{"prompt", "<system>be brief\n<user>hi\n<assistant>"}}));
    const json tools = {{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", {{"type", "object"}}}}}}};
    j = r.post("/apply-template",
               {{"messages", messages}, {"tools", tools}, {"chat_template_kwargs", {{"loud", true}}}}, &status);
    EXPECT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["prompt"], "<system>be brief\n<user>hi\ntools=1 add\nLOUD\n<assistant>");
    // The same checks as a chat request's: no messages is a 400 naming them.
    j = r.post("/apply-template", {{"prompt", "x"}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_NE(j.dump().find("messages"), std::string::npos) << j.dump();
}

// The OpenAI routes answer without the /v1 prefix too, with the same replies.
TEST(ServeApi, RoutesWithoutTheV1Prefix) {
    RunningServer r;
    const json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 6}, {"temperature", 0}};
    int status = 0;
    const json a = r.post("/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << a.dump();
    const json b = r.post("/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << b.dump();
    EXPECT_EQ(a["choices"], b["choices"]);
    const json c = r.post("/completions", {{"prompt", "hi"}, {"max_tokens", 4}, {"temperature", 0}}, &status);
    EXPECT_EQ(status, 200) << c.dump();
    EXPECT_EQ(c["object"], "text_completion");
    const json e = r.post("/embeddings", {{"input", "hi"}}, &status);
    EXPECT_EQ(status, 200) << e.dump();
    EXPECT_EQ(e["object"], "list");
    auto models = r.client->Get("/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
    auto v1_models = r.client->Get("/v1/models");
    ASSERT_TRUE(v1_models);
    EXPECT_EQ(json::parse(models->body), json::parse(v1_models->body));
    auto wrong = r.client->Get("/chat/completions");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 405);
    EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
}

// A token that ends inside a UTF-8 character detokenizes with U+FFFD in place of the broken bytes, as a
// reply's text does, not as a failed reply.
TEST(ServeApi, DetokenizeOfPartOfACharacter) {
    RunningServer r;
    int32_t partial = -1;
    for (int32_t id = 0; id < serve_engine()->info().n_vocab && partial < 0; ++id) {
        const std::string b = serve_engine()->token_bytes(id);
        if (b.size() == 1 && static_cast<unsigned char>(b[0]) >= 0xC2) partial = id;  // a lead byte alone
    }
    if (partial < 0) GTEST_SKIP() << "the vocabulary has no lone lead-byte token";
    int status = 0;
    const json j = r.post("/detokenize", {{"tokens", {partial}}}, &status);
    EXPECT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["content"], "\uFFFD") << j.dump();
}

// What a Session gives for the prompt with these sampling settings.
std::string session_text(const std::vector<int32_t>& prompt, const SamplerParams& s, int max_tokens) {
    Session session(serve_engine());
    session.append_tokens(prompt);
    GenerateOptions g;
    g.sampling = s;
    g.max_tokens = max_tokens;
    NullSink sink;
    return session.generate(g, sink).text;
}

TEST(ServeApi, PenaltiesAndChoicesWithTheirSeeds) {
    RunningServer r;
    const std::string prompt = "The little dog";
    const std::vector<int32_t> ids = serve_engine()->tokenize(prompt, serve_engine()->add_bos());
    SamplerParams s;
    s.temperature = 0.0f;
    s.top_k = 0, s.top_p = 1.0f, s.min_p = 0.0f;
    s.frequency_penalty = 1.5f;
    s.presence_penalty = 0.5f;
    s.penalty_last_n = 256;  // the server's penalties count every token
    int status = 0;
    json j = r.post("/v1/completions",
                    {{"prompt", prompt},
                     {"temperature", 0},
                     {"max_tokens", 12},
                     {"frequency_penalty", 1.5},
                     {"presence_penalty", 0.5},
                     {"user", "someone"}},
                    &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], session_text(ids, s, 12));

    // n = 3 sampled choices: choice i is the single request with seed 11 + i; usage sums the choices.
    s = SamplerParams{};
    s.temperature = 1.0f, s.top_k = 0, s.top_p = 1.0f, s.min_p = 0.0f;
    s.penalty_last_n = 256;
    j = r.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 10}, {"seed", 11}, {"n", 3}}, &status);
    ASSERT_EQ(status, 200) << j.dump();
    ASSERT_EQ(j["choices"].size(), 3u);
    int64_t generated = 0;
    for (int i = 0; i < 3; ++i) {
        s.seed = uint64_t(11 + i);
        EXPECT_EQ(j["choices"][i]["index"], i);
        EXPECT_EQ(j["choices"][i]["text"], session_text(ids, s, 10)) << "choice " << i;
        const json one = r.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 10}, {"seed", 11 + i}});
        EXPECT_EQ(one["choices"][0]["text"], j["choices"][i]["text"]);
        generated += one["usage"]["completion_tokens"].get<int64_t>();
    }
    EXPECT_EQ(j["usage"]["completion_tokens"], generated);
    EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());

    // Streamed chat with n = 2: each index's chunks add up to that choice's text.
    const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}, {"seed", 5}, {"n", 2}};
    const json plain = r.post("/v1/chat/completions", chat);
    json sc = chat;
    sc["stream"] = true;
    auto res = r.client->Post("/v1/chat/completions", sc.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    std::vector<std::string> texts(2);
    std::vector<std::string> finish(2);
    bool done = false;
    for (const json& c : test::sse_events(res->body, &done)) {
        const json& ch = c["choices"][0];
        const int i = ch["index"];
        if (ch["delta"].contains("content")) texts[size_t(i)] += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) finish[size_t(i)] = ch["finish_reason"];
    }
    EXPECT_TRUE(done);
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(texts[size_t(i)], plain["choices"][i]["message"]["content"]) << "choice " << i;
        EXPECT_EQ(finish[size_t(i)], plain["choices"][i]["finish_reason"]);
    }
}

// The library behind the server: a Session and the Batcher report the same log-probabilities for a
// sampled (not greedy), biased generation, each token's entry matching the token it sampled.
TEST(ServeApi, SessionAndBatcherReportTheSameLogprobs) {
    const std::vector<int32_t> prompt = serve_engine()->tokenize("The little dog", serve_engine()->add_bos());
    GenerateOptions g;
    g.max_tokens = 10;
    g.sampling.temperature = 0.9f;
    g.sampling.seed = 3;
    g.sampling.logit_bias = {{prompt.back(), 2.0f}};
    g.logprobs = 4;
    Session session(serve_engine());
    session.append_tokens(prompt);
    struct Tokens : NullSink {
        std::vector<int32_t> ids;
        std::vector<SampledLogprobs> lps;
        void on_token(int32_t t) override { ids.push_back(t); }
        void on_logprobs(const SampledLogprobs& lp) override { lps.push_back(lp); }
    } sink;
    const GenerationResult a = session.generate(g, sink);
    auto batcher = Batcher::create(serve_engine(), {.parallel = 2, .n_ctx = 256});
    const GenerationResult b = batcher->submit(prompt, g)->wait();
    EXPECT_EQ(a.text, b.text);
    ASSERT_EQ(a.logprobs.size(), size_t(a.generated_tokens));
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    ASSERT_EQ(sink.lps.size(), a.logprobs.size());
    for (size_t i = 0; i < a.logprobs.size(); ++i) {
        EXPECT_EQ(a.logprobs[i].token.id, sink.ids[i]);
        EXPECT_EQ(sink.lps[i].token.id, sink.ids[i]);
        EXPECT_EQ(b.logprobs[i].token.id, a.logprobs[i].token.id);
        EXPECT_NEAR(b.logprobs[i].token.logprob, a.logprobs[i].token.logprob, 1e-4);
        ASSERT_EQ(a.logprobs[i].top.size(), 4u);
        for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(b.logprobs[i].top[k].logprob, a.logprobs[i].top[k].logprob, 1e-4);
        EXPECT_LE(a.logprobs[i].token.logprob, a.logprobs[i].top[0].logprob);
    }
}

// The mean of the final-norm hidden states scaled to length 1 (the model names no pooling).
std::vector<float> session_embedding(const std::vector<int32_t>& ids) {
    Session s(serve_engine());
    std::vector<float> v = s.embed(ids, Pooling::kMean);
    double ss = 0.0;
    for (float x : v) ss += double(x) * x;
    for (float& x : v) x = float(x / std::sqrt(ss));
    return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-6) << what << " element " << k;
}

std::vector<float> from_base64(const std::string& s) {
    auto val = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        return c == '+' ? 62 : c == '/' ? 63 : -1;
    };
    std::string bytes;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : s) {
        const int v = val(c);
        if (v < 0) continue;
        acc = acc << 6 | uint32_t(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            bytes.push_back(char(acc >> bits & 0xFF));
        }
    }
    std::vector<float> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
}

TEST(ServeApi, EmbeddingsAreSessionEmbeddings) {
    RunningServer r;
    // A generation runs meanwhile: embeddings and batched steps take turns on the engine.
    std::thread gen([&] {
        httplib::Client c("127.0.0.1", r.server->port());
        c.set_read_timeout(60, 0);
        c.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 40}}.dump(), "application/json");
    });
    int status = 0;
    const json j = r.post("/v1/embeddings", {{"input", {"Once upon a time", "Hello"}}, {"model", "tiny"}}, &status);
    ASSERT_EQ(status, 200) << j.dump();
    ASSERT_EQ(j["data"].size(), 2u);
    int64_t tokens = 0;
    for (int i = 0; i < 2; ++i) {
        const std::string text = i == 0 ? "Once upon a time" : "Hello";
        std::vector<int32_t> ids;
        if (serve_engine()->add_bos()) ids.push_back(serve_engine()->bos_token());
        for (int32_t t : serve_engine()->tokenize(text, false)) ids.push_back(t);
        tokens += int64_t(ids.size());
        const std::vector<float> want = session_embedding(ids);
        const std::vector<float> got = j["data"][i]["embedding"].get<std::vector<float>>();
        ASSERT_EQ(got.size(), size_t(serve_engine()->info().n_embd));
        expect_close(got, want, "input " + std::to_string(i));
        EXPECT_EQ(j["data"][i]["index"], i);
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], tokens);
    // Token ids and base64: the same floats, as little-endian float32 bytes.
    const std::vector<int32_t> ids = {1, 300, 301, 302};
    const json b = r.post("/v1/embeddings", {{"input", ids}, {"encoding_format", "base64"}}, &status);
    ASSERT_EQ(status, 200) << b.dump();
    expect_close(from_base64(b["data"][0]["embedding"]), session_embedding(ids), "base64");
    gen.join();
}

// A sample's value from a Prometheus exposition ("name{labels}" as written), or -1.
double metric(const std::string& text, const std::string& name) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    return -1;
}

TEST(ServeApi, Metrics) {
    RunningServer r;
    for (int i = 0; i < 3; ++i)
        r.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}});
    r.post("/v1/completions", {{"prompt", 7}});
    r.post("/v1/embeddings", {{"input", {1, 2, 3}}});
    ASSERT_TRUE(r.settle());
    auto res = r.client->Get("/metrics");
    ASSERT_TRUE(res && res->status == 200);
    const std::string& m = res->body;
    EXPECT_EQ(metric(m, R"(cera_requests_total{endpoint="completion",status="200"})"), 3) << m;
    EXPECT_EQ(metric(m, R"(cera_requests_total{endpoint="completion",status="400"})"), 1);
    EXPECT_EQ(metric(m, "cera_generated_tokens_total"), 12);
    EXPECT_EQ(metric(m, "cera_embedding_tokens_total"), 3);
    EXPECT_EQ(metric(m, R"(cera_requests_total{endpoint="embedding",status="200"})"), 1);
    const size_t n_prompt = serve_engine()->tokenize("Once upon a time", serve_engine()->add_bos()).size();
    EXPECT_EQ(metric(m, "cera_prompt_tokens_total"), 3.0 * double(n_prompt));
    // The second and third requests take the first's full blocks from the prefix cache, if it has any.
    EXPECT_GE(metric(m, "cera_prefix_cache_hit_ratio"), 0.0);
    EXPECT_EQ(metric(m, "cera_kv_blocks_used"), 0);
    EXPECT_GT(metric(m, "cera_kv_blocks_free"), 0);
    EXPECT_EQ(metric(m, "cera_running_sequences"), 0);
    EXPECT_EQ(metric(m, "cera_queue_depth"), 0);
    EXPECT_EQ(metric(m, "cera_time_to_first_token_seconds_count"), 3);
    EXPECT_EQ(metric(m, R"(cera_time_to_first_token_seconds_bucket{le="+Inf"})"), 3);
    EXPECT_EQ(metric(m, "cera_inter_token_seconds_count"), 9);
}

// response_format and llama.cpp's json_schema / grammar fields: sampled replies (temperature 1, several
// seeds) that finish are in the language, checked here by parsing them.
TEST(ServeApi, ResponseFormatConstrainsTheOutput) {
    RunningServer r;
    const json schema = {{"type", "object"},
                         {"properties",
                          {{"name", {{"type", "string"}, {"maxLength", 8}}},
                           {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 120}}}}},
                         {"required", {"name", "age"}}};
    int finished = 0;
    for (int seed = 1; seed <= 6; ++seed) {
        const json msgs = {{{"role", "user"}, {"content", "Describe a person as JSON"}}};
        int status = 0;
        const json a = r.post("/v1/chat/completions",
                              {{"messages", msgs},
                               {"temperature", 1.0},
                               {"seed", seed},
                               {"max_tokens", 200},
                               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}}}},
                              &status);
        ASSERT_EQ(status, 200) << a.dump();
        if (a["choices"][0]["finish_reason"] == "stop") {
            ++finished;
            const json v = json::parse(a["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
            ASSERT_TRUE(v.is_object()) << a.dump();
            EXPECT_EQ(v.size(), 2u) << v.dump();
            ASSERT_TRUE(v["name"].is_string()) << v.dump();
            const std::string name = v["name"];
            EXPECT_LE(std::count_if(name.begin(), name.end(), [](char ch) { return (uint8_t(ch) & 0xC0) != 0x80; }), 8)
                << v.dump();  // code points
            ASSERT_TRUE(v["age"].is_number_integer()) << v.dump();
            EXPECT_GE(v["age"].get<int64_t>(), 0);
            EXPECT_LE(v["age"].get<int64_t>(), 120);
        }
        const json b = r.post("/v1/completions",
                              {{"prompt", "Answer:"}, {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 120},
                               {"response_format", {{"type", "json_object"}}}},
                              &status);
        ASSERT_EQ(status, 200) << b.dump();
        if (b["choices"][0]["finish_reason"] == "stop") {
            ++finished;
            EXPECT_TRUE(json::parse(b["choices"][0]["text"].get<std::string>(), nullptr, false).is_object()) << b.dump();
        }
        const json c = r.post("/v1/completions",
                              {{"prompt", "Yes or no?"}, {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 8},
                               {"grammar", "root ::= \"yes\" | \"no\""}},
                              &status);
        ASSERT_EQ(status, 200) << c.dump();
        EXPECT_EQ(c["choices"][0]["finish_reason"], "stop") << c.dump();
        const std::string t = c["choices"][0]["text"];
        EXPECT_TRUE(t == "yes" || t == "no") << c.dump();
    }
    EXPECT_GE(finished, 4) << "too few constrained replies finished to check";
}

TEST(ServeApi, EveryRefusalHasItsStatusAndErrorBody) {
    ServeOptions o;
    o.max_body_bytes = 4096;
    o.api_key = "k";
    o.batch.max_queue = 0;  // every generation is over capacity
    RunningServer r(o);
    const httplib::Headers auth = {{"Authorization", "Bearer k"}};
    struct Case {
        const char* path;
        std::string body;
        int status;
        const char* param;
        const char* code;
    };
    const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
    const std::vector<Case> cases = {
        {"/v1/chat/completions", "{not json", 400, nullptr, nullptr},
        {"/v1/chat/completions", "\"text\"", 400, nullptr, nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "model": "gpt-9"})", 404, "model", "model_not_found"},
        {"/v1/chat/completions", "{" + user + R"(, "max_tokens": "ten"})", 400, "max_tokens", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "top_p": 3})", 400, "top_p", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "stop": [1]})", 400, "stop", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "n": 0})", 400, "n", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "n": 1000})", 400, "n", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "top_logprobs": 2})", 400, "top_logprobs", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "logprobs": true, "top_logprobs": 21})", 400, "top_logprobs",
         nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "logprobs": 3})", 400, "logprobs", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "logit_bias": {"x": 1}})", 400, "logit_bias", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "logit_bias": {"5": 101}})", 400, "logit_bias", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "logit_bias": {"99999999": 1}})", 400, "logit_bias", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "user": 5})", 400, "user", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "stream_options": 5})", 400, "stream_options", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "tools": []})", 400, "tools", nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "response_format": {"type": "xml"}})", 400, "response_format",
         nullptr},
        {"/v1/chat/completions", "{" + user + R"(, "response_format": {"type": "json_schema"}})", 400,
         "response_format", nullptr},
        {"/v1/chat/completions",
         "{" + user +
             R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "frobnicate": 1}}}})",
         400, "response_format", nullptr},
        {"/v1/completions", R"({"prompt": "hi", "grammar": "root ::= undefined"})", 400, "grammar", nullptr},
        {"/v1/completions", R"({"prompt": "hi", "grammar": "root ::= \"a\"", "json_schema": {}})", 400,
         "response_format", nullptr},
        {"/v1/completions", R"({"prompt": "hi", "logprobs": true})", 400, "logprobs", nullptr},
        {"/v1/completions", R"({"prompt": "hi", "echo": true})", 400, "echo", nullptr},
        {"/v1/completions", R"({"prompt": "hi", "suffix": "x"})", 400, "suffix", nullptr},
        {"/v1/completions", json{{"prompt", std::vector<int>(300, 1)}}.dump(), 400, "prompt",
         "context_length_exceeded"},
        // Nesting deeper than the server writes values out (a schema, tools) is refused before any use.
        {"/v1/chat/completions",
         "{" + user + R"(, "json_schema": {"x": )" + std::string(1000, '[') + std::string(1000, ']') + "}}", 400,
         nullptr, nullptr},
        {"/v1/chat/completions", "", 400, nullptr, nullptr},
        {"/v1/completions", R"({"prompt": "hi"})", 429, nullptr, "over_capacity"},
        {"/v1/embeddings", R"({"input": []})", 400, "input", nullptr},
        {"/v1/embeddings", R"({"input": ""})", 400, "input", nullptr},
        {"/v1/embeddings", R"({"input": [1, 2.5]})", 400, "input", nullptr},
        {"/v1/embeddings", R"({"input": "hi", "encoding_format": "hex"})", 400, "encoding_format", nullptr},
        {"/v1/embeddings", json{{"input", std::vector<int>(300, 1)}}.dump(), 400, "input", "context_length_exceeded"},
        {"/v1/completions", std::string(5000, ' '), 413, nullptr, nullptr},
        {"/v1/nothing", "{}", 404, nullptr, nullptr},
    };
    for (const Case& c : cases) {
        auto res = r.client->Post(c.path, auth, c.body, "application/json");
        ASSERT_TRUE(res) << c.body.substr(0, 80);
        EXPECT_EQ(res->status, c.status) << c.body.substr(0, 80) << " -> " << res->body;
        const json e = json::parse(res->body, nullptr, false);
        ASSERT_FALSE(e.is_discarded()) << res->body;
        EXPECT_TRUE(e["error"]["message"].is_string()) << res->body;
        EXPECT_TRUE(e["error"]["type"].is_string()) << res->body;
        if (c.param) {
            EXPECT_EQ(e["error"]["param"], json(c.param)) << res->body;
        }
        if (c.code) {
            EXPECT_EQ(e["error"]["code"], json(c.code)) << res->body;
        }
        if (c.status == 429) {
            EXPECT_EQ(res->get_header_value("Retry-After"), "1");
        }
    }
    // Missing and wrong keys.
    for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer nope"}}}) {
        auto res = r.client->Post("/v1/completions", h, R"({"prompt": "hi"})", "application/json");
        ASSERT_TRUE(res);
        EXPECT_EQ(res->status, 401);
        EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
    }
    // Each refusal is counted by its status.
    auto m = r.client->Get("/metrics", auth);
    ASSERT_TRUE(m && m->status == 200);
    EXPECT_EQ(metric(m->body, R"(cera_requests_total{endpoint="completion",status="429"})"), 1) << m->body;
    EXPECT_EQ(metric(m->body, R"(cera_requests_total{endpoint="other",status="401"})"), 2) << m->body;
}

}  // namespace
}  // namespace cera
