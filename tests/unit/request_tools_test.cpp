// The server's request parser on tools: definitions, tool_choice, parallel_tool_calls and the
// assistant/tool messages of a conversation with calls, as OpenAI clients send them; bad ones refused
// with the field named.
#include <gtest/gtest.h>

#include "server/request.h"

namespace cera {
namespace {

const RequestLimits kLimits{"tiny", 1000, 256};

const std::string kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "d",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping"}}])";

CompletionRequest chat(const std::string& extra) {
    return parse_completion(R"({"messages": [{"role": "user", "content": "hi"}])" + extra + "}", true, kLimits);
}

std::string refused(const std::string& extra, const std::string& param) {
    try {
        chat(extra);
    } catch (const Refusal& r) {
        EXPECT_EQ(r.status, 400);
        EXPECT_EQ(r.param, param) << r.message;
        return r.message;
    }
    ADD_FAILURE() << "not refused: " << extra;
    return "";
}

TEST(RequestTools, ChoicesAndGrammars) {
    CompletionRequest r = chat(R"(, "tools": )" + kTools);
    EXPECT_EQ(r.tool_choice.choice, ToolChoice::kAuto);
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0].name, "get_weather");
    EXPECT_EQ(r.tools[1].parameters_json, "");
    ASSERT_NE(r.options.grammar, nullptr);
    EXPECT_EQ(r.options.grammar->trigger(), "<tool_call>");  // auto: lazy, Hermes by default
    EXPECT_NE(r.tools_json.find("get_weather"), std::string::npos);

    r = chat(R"(, "tools": )" + kTools + R"(, "tool_choice": "required", "parallel_tool_calls": false)");
    EXPECT_EQ(r.tool_choice.choice, ToolChoice::kRequired);
    EXPECT_FALSE(r.tool_choice.parallel);
    ASSERT_NE(r.options.grammar, nullptr);
    EXPECT_EQ(r.options.grammar->trigger(), "");
    const std::string call = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
    EXPECT_EQ(r.options.grammar->match(call), -1);
    EXPECT_NE(r.options.grammar->match(call + "\n" + call), -1);  // one call only

    r = chat(R"(, "tools": )" + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "ping"}})");
    EXPECT_EQ(r.tool_choice.choice, ToolChoice::kNamed);
    EXPECT_EQ(r.options.grammar->match(call), -1);
    EXPECT_NE(r.options.grammar->match(
                  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>"),
              -1);

    // none: no grammar, no tools in the prompt, nothing parsed.
    r = chat(R"(, "tools": )" + kTools + R"(, "tool_choice": "none")");
    EXPECT_EQ(r.options.grammar, nullptr);
    EXPECT_TRUE(r.tools.empty());
    EXPECT_TRUE(r.tools_json.empty());

    // The model's format decides the grammar.
    RequestLimits lfm2 = kLimits;
    lfm2.tool_format = ToolCallFormat::kLfm2;
    r = parse_completion(
        R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", "tools": )" + kTools + "}",
        true, lfm2);
    EXPECT_EQ(r.options.grammar->match("<|tool_call_start|>[get_weather(city=\"Oslo\")]<|tool_call_end|>"), -1);
}

TEST(RequestTools, ConversationWithCalls) {
    const CompletionRequest r = parse_completion(
        R"({"messages": [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
              {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "name": "ping", "content": "pong"}]})",
        true, kLimits);
    ASSERT_EQ(r.messages.size(), 4u);
    ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
    EXPECT_EQ(r.messages[1].content, "");
    EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
    EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
    EXPECT_EQ(r.messages[1].tool_calls[0].arguments_json, R"({"city": "Paris"})");
    EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
    EXPECT_EQ(r.messages[3].name, "ping");
}

// Tools, arguments and schemas reach the template and the grammar in the client's key order (as Hugging
// Face's apply_chat_template and OpenAI's structured outputs take them), not sorted; an assistant's
// earlier reasoning reaches the template too.
TEST(RequestTools, KeysKeepTheClientsOrder) {
    const CompletionRequest r = parse_completion(
        R"({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "reasoning_content": "think first",
             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"zeta": 1, "alpha": 2}}}]},
            {"role": "assistant", "content": "b", "reasoning": "newer name"}],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters":
              {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}}}}}]})",
        true, kLimits);
    EXPECT_EQ(r.tools_json,
              R"([{"type":"function","function":{"name":"f","description":"d","parameters":)"
              R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}}}}}])");
    EXPECT_EQ(r.tools[0].parameters_json,
              R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}}})");
    EXPECT_EQ(r.messages[1].tool_calls[0].arguments_json, R"({"zeta":1,"alpha":2})");
    EXPECT_EQ(r.messages[1].reasoning_content, "think first");
    EXPECT_EQ(r.messages[2].reasoning_content, "newer name");

    const CompletionRequest s = chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "p",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name", "age"], "additionalProperties": false}}})");
    ASSERT_NE(s.options.grammar, nullptr);
    EXPECT_EQ(s.options.grammar->match(R"({"name": "a", "age": 3})"), -1);
    EXPECT_NE(s.options.grammar->match(R"({"age": 3, "name": "a"})"), -1);
}

// Values nested deeper than 256 levels are refused before anything writes them out (that recurses).
TEST(RequestTools, DeepNestingIsRefused) {
    const std::string deep = std::string(300, '[') + std::string(300, ']');
    try {
        chat(R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": )" + deep + "}}]");
        ADD_FAILURE() << "not refused";
    } catch (const Refusal& r) {
        EXPECT_EQ(r.status, 400);
        EXPECT_NE(r.message.find("nested deeper than 256 levels"), std::string::npos) << r.message;
    }
    EXPECT_NO_THROW(chat(R"(, "metadata": )" + std::string(200, '[') + std::string(200, ']')));
}

TEST(RequestTools, BadToolsAreRefused) {
    EXPECT_NE(refused(R"(, "tools": {"a": 1})", "tools").find("non-empty list"), std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [])", "tools").find("non-empty list"), std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [3])", "tools").find("'tools[0]'"), std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [{"type": "retrieval"}])", "tools").find("only \"function\""), std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [{"type": "function", "function": {}}])", "tools").find("function.name"),
              std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [{"type": "function", "function": {"name": "a b"}}])", "tools").find("'a b'"),
              std::string::npos);
    EXPECT_NE(
        refused(R"(, "tools": [{"function": {"name": "f"}}, {"function": {"name": "f"}}])", "tools").find("repeats"),
        std::string::npos);
    EXPECT_NE(
        refused(R"(, "tools": [{"function": {"name": "f", "parameters": {"type": "object", "minProperties": 3}}}])",
                "tools")
            .find("tool 'f' parameters"),
        std::string::npos);
    EXPECT_NE(refused(R"(, "tools": [{"function": {"name": "f", "parameters": []}}])", "tools").find("JSON Schema"),
              std::string::npos);
    refused(R"(, "tools": )" + kTools + R"(, "tool_choice": "always")", "tool_choice");
    refused(R"(, "tools": )" + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})",
            "tool_choice");
    refused(R"(, "tool_choice": "required")", "tool_choice");
    refused(R"(, "tools": )" + kTools + R"(, "parallel_tool_calls": "yes")", "parallel_tool_calls");
    refused(R"(, "tools": )" + kTools + R"(, "response_format": {"type": "json_object"})", "tools");
    // A bad tool is refused even with tool_choice none.
    refused(R"(, "tools": [{"function": {"name": "f", "parameters": {"type": "nope"}}}], "tool_choice": "none")",
            "tools");
    // Tools are for chat.
    try {
        parse_completion(R"({"prompt": "x", "tools": )" + kTools + "}", false, kLimits);
        ADD_FAILURE() << "not refused";
    } catch (const Refusal& r) {
        EXPECT_EQ(r.param, "tools");
    }
}

}  // namespace
}  // namespace cera
