// Tool-call parsing of recorded outputs in each format, malformed ones included (returned as text).
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

namespace cera {
namespace {

void expect_call(const ToolCall& c, const std::string& name, const std::string& args) {
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.arguments_json, args);
}

TEST(ToolCalls, Lfm2Pythonic) {
    auto r = parse_tool_calls(
        "Let me check.<|tool_call_start|>[get_weather(city=\"Paris\", days=3), "
        "search(q='it\\'s', opts={'n': 2, \"exact\": True}, ids=[1, -2.5, None])]<|tool_call_end|>",
        ToolCallFormat::kLfm2);
    ASSERT_EQ(r.calls.size(), 2u);
    expect_call(r.calls[0], "get_weather", R"({"city":"Paris","days":3})");
    expect_call(r.calls[1], "search", R"({"q":"it's","opts":{"n":2,"exact":true},"ids":[1,-2.5,null]})");
    EXPECT_EQ(r.content, "Let me check.");
    r = parse_tool_calls("<|tool_call_start|>[ping()]<|tool_call_end|>", ToolCallFormat::kLfm2);
    ASSERT_EQ(r.calls.size(), 1u);
    expect_call(r.calls[0], "ping", "{}");
    // The JSON form.
    r = parse_tool_calls(R"(<|tool_call_start|>[{"name": "f", "arguments": {"a": 1}}]<|tool_call_end|>)",
                         ToolCallFormat::kLfm2);
    ASSERT_EQ(r.calls.size(), 1u);
    expect_call(r.calls[0], "f", R"({"a":1})");
}

TEST(ToolCalls, HermesQwen) {
    auto r = parse_tool_calls(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>",
        ToolCallFormat::kHermes);
    ASSERT_EQ(r.calls.size(), 2u);
    expect_call(r.calls[0], "get_weather", R"({"city":"Paris"})");
    expect_call(r.calls[1], "get_time", R"({"tz":"CET"})");
    EXPECT_EQ(r.content, "");
    r = parse_tool_calls("Sure.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}", ToolCallFormat::kHermes);
    ASSERT_EQ(r.calls.size(), 1u);  // the closing tag cut by max_tokens
    EXPECT_EQ(r.content, "Sure.");
}

TEST(ToolCalls, Llama3AndGranite) {
    auto r = parse_tool_calls(R"({"name": "get_weather", "parameters": {"city": "Paris; France"}})",
                              ToolCallFormat::kLlama3);
    ASSERT_EQ(r.calls.size(), 1u);
    expect_call(r.calls[0], "get_weather", R"({"city":"Paris; France"})");
    r = parse_tool_calls(R"(<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": ";"}})",
                         ToolCallFormat::kLlama3);
    ASSERT_EQ(r.calls.size(), 2u);
    expect_call(r.calls[1], "b", R"({"x":";"})");
    r = parse_tool_calls(R"(<|tool_call|>[{"name": "f", "arguments": {"n": 1}}, {"name": "g", "arguments": {}}])",
                         ToolCallFormat::kGranite);
    ASSERT_EQ(r.calls.size(), 2u);
    expect_call(r.calls[0], "f", R"({"n":1})");
}

TEST(ToolCalls, MalformedIsText) {
    const std::vector<std::pair<std::string, ToolCallFormat>> bad = {
        {"<|tool_call_start|>[get_weather(city=\"Paris\"]<|tool_call_end|>", ToolCallFormat::kLfm2},
        {"<|tool_call_start|>[f(x=)]<|tool_call_end|>", ToolCallFormat::kLfm2},
        {"<|tool_call_start|>[f(x='unterminated)]", ToolCallFormat::kLfm2},
        {"<|tool_call_start|>[]<|tool_call_end|>", ToolCallFormat::kLfm2},
        {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", ToolCallFormat::kHermes},
        {"<tool_call>{\"arguments\": {}}</tool_call>", ToolCallFormat::kHermes},
        {"<tool_call>{\"name\": 3}</tool_call>", ToolCallFormat::kHermes},
        {"{\"name\": \"f\", \"parameters\": [1]}", ToolCallFormat::kLlama3},
        {"{not json", ToolCallFormat::kLlama3},
        {"<|tool_call|>[{\"name\": \"f\"", ToolCallFormat::kGranite},
        {std::string("<|tool_call_start|>[f(x=\"\xff\")]<|tool_call_end|>"), ToolCallFormat::kLfm2},
        {"<|tool_call_start|>" + std::string(200, '[') + "<|tool_call_end|>", ToolCallFormat::kLfm2},
    };
    for (const auto& [text, format] : bad) {
        const auto r = parse_tool_calls(text, format);
        EXPECT_TRUE(r.calls.empty()) << text;
        EXPECT_EQ(r.content, text);
    }
    const auto plain = parse_tool_calls("Just an answer.", ToolCallFormat::kHermes);
    EXPECT_TRUE(plain.calls.empty());
    EXPECT_EQ(plain.content, "Just an answer.");
}

TEST(ToolCalls, FormatOfModel) {
    EXPECT_EQ(tool_call_format_for("lfm2", ""), ToolCallFormat::kLfm2);
    EXPECT_EQ(tool_call_format_for("lfm2moe", ""), ToolCallFormat::kLfm2);
    EXPECT_EQ(tool_call_format_for("qwen3", "... <tool_call> ..."), ToolCallFormat::kHermes);
    EXPECT_EQ(tool_call_format_for("llama", "{{- '<|python_tag|>' }}"), ToolCallFormat::kLlama3);
    EXPECT_EQ(tool_call_format_for("granite", ""), ToolCallFormat::kGranite);
    EXPECT_STREQ(tool_call_trigger(ToolCallFormat::kHermes), "<tool_call>");
}

}  // namespace
}  // namespace cera
