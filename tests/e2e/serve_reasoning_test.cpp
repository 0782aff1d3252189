// Chat replies that think, on the bundled tiny model over real HTTP, made to write a <think> block by a
// grammar: the block comes back as the message's reasoning_content and the rest as its content, plain
// and streamed. The reference is the same reply's raw text (reasoning_format "none") taken apart by a
// regular expression.
#include <regex>

#include "serve_util.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::RunningServer;

std::string trimmed(const std::string& s) {
    const size_t b = s.find_first_not_of(" \n"), e = s.find_last_not_of(" \n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

json chat_body(const std::string& grammar, int max_tokens) {
    return {{"messages", {{{"role", "user"}, {"content", "Think, then answer."}}}},
            {"temperature", 0},
            {"max_tokens", max_tokens},
            {"grammar", grammar}};
}

// The reply's message, or null after a failed assertion.
json message_of(RunningServer& r, const json& body) {
    int status = 0;
    const json j = r.post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << j.dump();
    if (status != 200) return nullptr;
    return j["choices"][0]["message"];
}

struct Split {
    std::string reasoning, content;
    bool reasoning_first = true;  // streamed: no reasoning delta after a content delta
};

Split streamed(RunningServer& r, json body) {
    body["stream"] = true;
    auto res = r.client->Post("/v1/chat/completions", body.dump(), "application/json");
    Split s;
    if (!res) {
        ADD_FAILURE() << "no answer";
        return s;
    }
    EXPECT_EQ(res->status, 200) << res->body;
    bool done = false;
    for (const json& e : test::sse_events(res->body, &done)) {
        const json& d = e["choices"][0]["delta"];
        if (d.contains("reasoning_content")) {
            s.reasoning += d["reasoning_content"].get<std::string>();
            if (!s.content.empty()) s.reasoning_first = false;
        }
        if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
    }
    EXPECT_TRUE(done);
    return s;
}

void expect_split(const json& message, const std::string& reasoning, const std::string& content) {
    ASSERT_TRUE(message.is_object());
    EXPECT_EQ(message["content"], content) << message.dump();
    if (reasoning.empty())
        EXPECT_FALSE(message.contains("reasoning_content")) << message.dump();
    else
        EXPECT_EQ(message["reasoning_content"], reasoning) << message.dump();
}

// usage counts the reply's tokens up to the one that closes </think> as its reasoning tokens; the raw
// reply's log-probabilities (raw_body: reasoning_format "none") give its tokens one by one.
void expect_reasoning_tokens(RunningServer& r, json raw_body, const json& split_body, bool opened = false) {
    raw_body["logprobs"] = true;
    int status = 0;
    const json raw = r.post("/v1/chat/completions", raw_body, &status);
    ASSERT_EQ(status, 200) << raw.dump();
    std::string so_far = opened ? "<think>" : "";
    int64_t thinking_tokens = 0;
    for (const json& t : raw["choices"][0]["logprobs"]["content"]) {
        if (so_far.find("</think>") != std::string::npos) break;
        so_far += t["token"].get<std::string>();
        ++thinking_tokens;
    }
    ASSERT_NE(so_far.find("</think>"), std::string::npos) << raw.dump();
    EXPECT_FALSE(raw["usage"].contains("completion_tokens_details"));
    const json split = r.post("/v1/chat/completions", split_body, &status);
    EXPECT_EQ(split["usage"]["completion_tokens_details"]["reasoning_tokens"], thinking_tokens) << split.dump();
    EXPECT_LT(thinking_tokens, split["usage"]["completion_tokens"].get<int64_t>());
}

TEST(ServeReasoning, ThinkingBlockComesApartFromTheAnswer) {
    RunningServer r;
    const std::string g = R"(root ::= "<think>" [a-z ]{4,16} "</think>\n\n" [a-z]{2,10})";
    json raw_body = chat_body(g, 60);
    raw_body["reasoning_format"] = "none";
    const json raw = message_of(r, raw_body);
    ASSERT_TRUE(raw.is_object());
    ASSERT_FALSE(raw.contains("reasoning_content"));
    std::smatch m;
    const std::string text = raw["content"];
    ASSERT_TRUE(std::regex_match(text, m, std::regex(R"(<think>([a-z ]*)</think>\n\n([a-z]*))"))) << text;
    const std::string reasoning = trimmed(m[1]), content = m[2];

    expect_split(message_of(r, chat_body(g, 60)), reasoning, content);

    expect_reasoning_tokens(r, raw_body, chat_body(g, 60));

    json deepseek = chat_body(g, 60);
    deepseek["reasoning_format"] = "deepseek";
    expect_split(message_of(r, deepseek), reasoning, content);
    const Split s = streamed(r, chat_body(g, 60));
    EXPECT_EQ(s.reasoning, reasoning);
    EXPECT_EQ(s.content, content);
    EXPECT_TRUE(s.reasoning_first);

    // Cut at the token limit while thinking: what it thought so far is reasoning, the content empty.
    const std::string long_g = R"(root ::= "<think>" [a-z ]{200,220} "</think>" [a-z]{2,10})";
    json cut_raw = chat_body(long_g, 16);
    cut_raw["reasoning_format"] = "none";
    const std::string cut_text = message_of(r, cut_raw)["content"];
    ASSERT_EQ(cut_text.rfind("<think>", 0), 0u) << cut_text;
    ASSERT_GT(trimmed(cut_text.substr(7)).size(), 0u) << cut_text;
    int status = 0;
    const json cut = r.post("/v1/chat/completions", chat_body(long_g, 16), &status);
    EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(cut["usage"]["completion_tokens_details"]["reasoning_tokens"], cut["usage"]["completion_tokens"]);
    expect_split(cut["choices"][0]["message"], trimmed(cut_text.substr(7)), "");
}

TEST(ServeReasoning, TemplateThatOpensTheThinking) {
    // A template that writes <think> itself (as DeepSeek-R1's does): the reply starts as reasoning.
    ServeOptions o;
    o.chat_template =
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: <think>\n{% endif %}";
    RunningServer r(o);
    const std::string g = R"(root ::= [a-z ]{4,16} "</think>" [a-z]{2,10})";
    json raw_body = chat_body(g, 60);
    raw_body["reasoning_format"] = "none";
    const std::string text = message_of(r, raw_body)["content"];
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, std::regex(R"(([a-z ]*)</think>([a-z]*))"))) << text;
    expect_split(message_of(r, chat_body(g, 60)), trimmed(m[1]), m[2]);
    expect_reasoning_tokens(r, raw_body, chat_body(g, 60), true);
    const Split s = streamed(r, chat_body(g, 60));
    EXPECT_EQ(s.reasoning, trimmed(m[1]));
    EXPECT_EQ(s.content, m[2]);
}

// A schema's answer comes after the thinking: where the template opened <think>, the grammar holds the
// reply to free thinking until </think>, then the schema; where the prompt closed it (Qwen3's
// enable_thinking false), the schema applies from the first token.
TEST(ServeReasoning, StructuredAnswerAfterTheThinking) {
    const json schema = {{"type", "object"},
                         {"properties", {{"a", {{"type", "integer"}}}}},
                         {"required", {"a"}},
                         {"additionalProperties", false}};
    auto body = [&](int max_tokens) {
        json b = {{"messages", {{{"role", "user"}, {"content", "Give me a."}}}},
                  {"temperature", 0},
                  {"max_tokens", max_tokens},
                  {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}};
        return b;
    };
    {
        ServeOptions o;
        o.chat_template =
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: <think>\n{% endif %}";
        RunningServer r(o);
        int status = 0;
        const json j = r.post("/v1/chat/completions", body(3), &status);
        ASSERT_EQ(status, 200) << j.dump();
        const json& m = j["choices"][0]["message"];
        EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
        EXPECT_EQ(m["content"], "") << m.dump();  // three tokens of thinking, no answer yet
        json none = body(3);
        none["reasoning_format"] = "none";  // the text as is: the schema from the first token
        const std::string raw = r.post("/v1/chat/completions", none)["choices"][0]["message"]["content"];
        EXPECT_EQ(raw.rfind("{", 0), 0u) << raw;
        // Split, the same three tokens would be reasoning too; the thinking is the model's free text instead.
        EXPECT_NE(m.value("reasoning_content", std::string()), raw) << m.dump();
    }
    {
        ServeOptions o;
        o.chat_template =
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% endif %}{% endif %}";
        RunningServer r(o);
        json b = body(3);
        b["chat_template_kwargs"] = {{"enable_thinking", false}};
        const json m = message_of(r, b);
        ASSERT_TRUE(m.is_object());
        EXPECT_EQ(m["content"].get<std::string>().rfind("{", 0), 0u) << m.dump();
        EXPECT_FALSE(m.contains("reasoning_content"));
        // Thinking allowed: a reply that finishes answers in the schema, thought or not; one cut at the
        // token limit while thinking has no answer (this tiny story model starts a <think> here and
        // writes a story in it).
        int status = 0;
        const json j = r.post("/v1/chat/completions", body(200), &status);
        ASSERT_EQ(status, 200) << j.dump();
        const json& full = j["choices"][0]["message"];
        if (j["choices"][0]["finish_reason"] == "stop") {
            const json answer = json::parse(full["content"].get<std::string>(), nullptr, false);
            ASSERT_TRUE(answer.is_object()) << full.dump();
            EXPECT_TRUE(answer["a"].is_number_integer()) << full.dump();
        } else {
            EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
            EXPECT_EQ(full["content"], "") << full.dump();
            EXPECT_FALSE(full.value("reasoning_content", std::string()).empty()) << full.dump();
        }
    }
}

TEST(ServeReasoning, ServerOptionAndRequestField) {
    ServeOptions o;
    o.split_reasoning = false;  // --reasoning-format none
    RunningServer r(o);
    const std::string g = R"(root ::= "<think>" [a-z ]{4,16} "</think>\n\n" [a-z]{2,10})";
    const json raw = message_of(r, chat_body(g, 60));
    ASSERT_TRUE(raw.is_object());
    EXPECT_FALSE(raw.contains("reasoning_content"));
    const std::string text = raw["content"];
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, std::regex(R"(<think>([a-z ]*)</think>\n\n([a-z]*))"))) << text;
    json body = chat_body(g, 60);
    body["reasoning_format"] = "auto";
    expect_split(message_of(r, body), trimmed(m[1]), m[2]);

    for (const json& bad : {json("deepseek-legacy"), json(true), json("None")}) {
        json b = chat_body(g, 8);
        b["reasoning_format"] = bad;
        int status = 0;
        const json e = r.post("/v1/chat/completions", b, &status);
        EXPECT_EQ(status, 400) << bad;
        EXPECT_EQ(e["error"]["param"], "reasoning_format") << e.dump();
    }
}

}  // namespace
}  // namespace cera
