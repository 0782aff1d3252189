// Streamed tool-call parsing of recorded outputs of each format, fed in pieces of every size from 1
// byte: the content deltas hold no markup, each call is announced once with its name, the argument
// fragments come as arguments complete and join into what parse_tool_calls() gives for the whole
// text; malformed and cut-off outputs end as the whole parse says.
#include "chat/tool_call_stream.h"

#include <gtest/gtest.h>

namespace cera {
namespace {

struct Streamed {
    std::string content;
    std::vector<ToolCall> calls;
    std::vector<size_t> fragments;  // argument fragments per call (non-empty ones)
};

Streamed run(const std::string& text, ToolCallFormat f, size_t piece) {
    ToolCallStream s(f, "call_");
    Streamed out;
    auto take = [&](const ToolStreamDelta& d) {
        out.content += d.content;
        for (const ToolCallDelta& c : d.calls) {
            if (!c.id.empty()) {
                EXPECT_EQ(c.index, out.calls.size()) << "a call is announced once, in order";
                out.calls.push_back({c.id, c.name, ""});
                out.fragments.push_back(0);
            }
            EXPECT_LT(c.index, out.calls.size()) << "arguments of a call not announced";
            if (c.index >= out.calls.size()) continue;
            out.calls[c.index].arguments_json += c.arguments;
            if (!c.arguments.empty()) ++out.fragments[c.index];
        }
    };
    for (size_t i = 0; i < text.size(); i += piece) take(s.push(text.substr(i, piece)));
    take(s.finish());
    return out;
}

void check(const std::string& text, ToolCallFormat f, const std::string& content, size_t n_calls) {
    const ParsedToolCalls whole = parse_tool_calls(text, f);
    ASSERT_EQ(whole.calls.size(), n_calls) << text;
    for (size_t piece : {size_t(1), size_t(2), size_t(3), size_t(5), size_t(8), text.size()}) {
        SCOPED_TRACE("pieces of " + std::to_string(piece) + ": " + text);
        const Streamed s = run(text, f, piece);
        EXPECT_EQ(s.content, content);
        ASSERT_EQ(s.calls.size(), n_calls);
        for (size_t i = 0; i < n_calls; ++i) {
            EXPECT_EQ(s.calls[i].id, "call_" + std::to_string(i));
            EXPECT_EQ(s.calls[i].name, whole.calls[i].name);
            EXPECT_EQ(s.calls[i].arguments_json, whole.calls[i].arguments_json);
            // Arguments stream as they are written: a call with two arguments comes in several
            // fragments when the text comes in small pieces.
            if (piece < 4 && whole.calls[i].arguments_json.find(',') != std::string::npos) {
                EXPECT_GE(s.fragments[i], 3u);
            }
        }
    }
}

TEST(ToolCallStream, Lfm2) {
    check(
        "Let me check. <|tool_call_start|>[get_weather(city=\"Paris, FR\", days=3), "
        "search(q='it\\'s (a) [test]', opts={'n': 2})]<|tool_call_end|>",
        ToolCallFormat::kLfm2, "Let me check.", 2);
    check("<|tool_call_start|>[ping()]<|tool_call_end|>", ToolCallFormat::kLfm2, "", 1);
    check("<|tool_call_start|>[{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [2, 3]}}]<|tool_call_end|>",
          ToolCallFormat::kLfm2, "", 1);
}

// Text after the calls comes as content, streamed or not (LFM2 often writes a sentence after its call).
TEST(ToolCallStream, TextAfterTheCallsIsContent) {
    check("Let me check.<|tool_call_start|>[ping()]<|tool_call_end|>Checking now.", ToolCallFormat::kLfm2,
          "Let me check.Checking now.", 1);
    check("<|tool_call_start|>[ping()]<|tool_call_end|>Done", ToolCallFormat::kLfm2, "Done", 1);
    check("<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\nOK.", ToolCallFormat::kHermes,
          "OK.", 1);
    EXPECT_EQ(parse_tool_calls("<|tool_call_start|>[ping()]<|tool_call_end|>Done", ToolCallFormat::kLfm2).content,
              "Done");
}

TEST(ToolCallStream, Hermes) {
    check(
        "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": {\"x\": "
        "\"}\"}}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
        ToolCallFormat::kHermes, "Sure.", 2);
    // Arguments as a JSON string: they come whole at the end.
    check("<tool_call>{\"name\": \"t\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call>",
          ToolCallFormat::kHermes, "", 1);
}

TEST(ToolCallStream, Llama3AndGranite) {
    check("{\"name\": \"a\", \"parameters\": {\"x\": \";\", \"y\": 2}}; {\"name\": \"b\", \"parameters\": {}}",
          ToolCallFormat::kLlama3, "", 2);
    check("I will call it. {\"name\": \"a\", \"parameters\": {\"x\": 1, \"y\": 2}}", ToolCallFormat::kLlama3,
          "I will call it.", 1);
    check("<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1, \"y\": 2}}", ToolCallFormat::kLlama3, "", 1);
    check(
        "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"n\": 1, \"m\": \"a,b\"}}, {\"name\": \"g\", "
        "\"arguments\": {}}]",
        ToolCallFormat::kGranite, "", 2);
}

TEST(ToolCallStream, PlainTextAndMarkerLookalikes) {
    check("No tools needed: 2 < 3 and <tool> is not a marker.", ToolCallFormat::kHermes,
          "No tools needed: 2 < 3 and <tool> is not a marker.", 0);
    check("A text ending in <tool_ca", ToolCallFormat::kHermes, "A text ending in <tool_ca", 0);
    check("<|tool_call_start|> then nothing", ToolCallFormat::kLfm2, "<|tool_call_start|> then nothing", 0);
}

TEST(ToolCallStream, MalformedAndCutOff) {
    // Malformed before a call's name is known: the stream ends with the text as content (the part
    // before the marker came first). (A call cut off after its name stays announced: grammars make
    // every complete output valid, so only max_tokens cuts one.)
    for (const auto& [text, f] : std::vector<std::pair<std::string, ToolCallFormat>>{
             {"Hi <|tool_call_start|>[not a call]<|tool_call_end|>", ToolCallFormat::kLfm2},
             {"Hi <tool_call>{\"name\": 3}</tool_call>", ToolCallFormat::kHermes},
             {"Hi <|tool_call|>[{\"arguments\": {}}]", ToolCallFormat::kGranite}}) {
        for (size_t piece : {size_t(1), size_t(4), text.size()}) {
            const Streamed s = run(text, f, piece);
            EXPECT_EQ(s.content, text) << text;
            EXPECT_TRUE(s.calls.empty()) << text;
        }
    }
    // Cut off after a complete call (max_tokens): the call stands, as in the whole parse.
    check("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", ToolCallFormat::kHermes, "", 1);
}

}  // namespace
}  // namespace cera
