// Tool-call grammars: for a set of tool schemas, the strings each format's grammar must accept and
// reject; every accepted string parses back (chat/tool_calls.h) into the call it spells. Lazy grammars:
// free text until the trigger, then the calls.
#include "chat/tool_grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cera/error.h"

namespace cera {
namespace {

const std::vector<ToolDef> kTools = {
    {"get_weather",
     R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
         "days": {"type": "integer", "minimum": 1, "maximum": 7},
         "unit": {"enum": ["c", "f"]}}, "required": ["city"]})"},
    {"ping", ""},
    {"add_item", R"({"type": "object", "properties": {"item": {"$ref": "#/$defs/item"}}, "required": ["item"],
         "$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}, "required": ["id"]}}})"},
    {"pick", R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                           {"type": "object", "properties": {"b": {"type": "null"}}, "required": ["b"]}]})"},
};

bool in(const Grammar& g, const std::string& s) { return g.match(s) == -1; }

void expect_parses(const std::string& text, ToolCallFormat f, const std::string& name, const std::string& args) {
    const ParsedToolCalls p = parse_tool_calls(text, f);
    ASSERT_EQ(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.calls[0].name, name);
    EXPECT_EQ(p.calls[0].arguments_json, args);
}

TEST(ToolGrammar, Lfm2PythonicArguments) {
    const auto g = tool_call_grammar(ToolCallFormat::kLfm2, kTools, {ToolChoice::kRequired});
    const std::string ok[] = {
        R"(<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>)",
        R"(<|tool_call_start|>[get_weather(city="Paris", days=3, unit="f")]<|tool_call_end|>)",
        R"(<|tool_call_start|>[get_weather(city="Oslo", unit="c")]<|tool_call_end|>)",
        R"(<|tool_call_start|>[ping()]<|tool_call_end|>)",
        R"(<|tool_call_start|>[ping(), get_weather(city="x")]<|tool_call_end|>)",
        R"(<|tool_call_start|>[add_item(item={"id": 3, "tags": ["a"]})]<|tool_call_end|>)",
        // A parameters schema that is not a plain object of properties: the JSON form.
        R"(<|tool_call_start|>[{"name": "pick", "arguments": {"a": true}}]<|tool_call_end|>)",
    };
    for (const auto& s : ok) EXPECT_TRUE(in(*g, s)) << s;
    const std::string bad[] = {
        R"(<|tool_call_start|>[get_weather()]<|tool_call_end|>)",                        // city is required
        R"(<|tool_call_start|>[get_weather(days=3, city="Paris")]<|tool_call_end|>)",    // schema order
        R"(<|tool_call_start|>[get_weather(city="Paris", days=9)]<|tool_call_end|>)",    // maximum
        R"(<|tool_call_start|>[get_weather(city="Paris", unit="k")]<|tool_call_end|>)",  // enum
        R"(<|tool_call_start|>[get_weather(city=3)]<|tool_call_end|>)",                  // type
        R"(<|tool_call_start|>[unknown()]<|tool_call_end|>)",
        R"(<|tool_call_start|>[]<|tool_call_end|>)",
        R"(<|tool_call_start|>[add_item(item={"tags": []})]<|tool_call_end|>)",  // id is required in $defs
        R"(<|tool_call_start|>[{"name": "pick", "arguments": {}}]<|tool_call_end|>)",
        R"(Sure. <|tool_call_start|>[ping()]<|tool_call_end|>)",  // required: a call from the first byte
    };
    for (const auto& s : bad) EXPECT_FALSE(in(*g, s)) << s;
    expect_parses(ok[1], ToolCallFormat::kLfm2, "get_weather", R"({"city":"Paris","days":3,"unit":"f"})");
    expect_parses(ok[5], ToolCallFormat::kLfm2, "add_item", R"({"item":{"id":3,"tags":["a"]}})");
    expect_parses(ok[6], ToolCallFormat::kLfm2, "pick", R"({"a":true})");
}

TEST(ToolGrammar, JsonFormats) {
    struct Case {
        ToolCallFormat f;
        std::string one, two;
    };
    const std::string w = R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 2}})";
    const std::string p = R"({"name": "ping", "arguments": {}})";
    const std::string lw = R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 2}})";
    const std::string lp = R"({"name": "ping", "parameters": {}})";
    const Case cases[] = {
        {ToolCallFormat::kHermes, "<tool_call>\n" + w + "\n</tool_call>",
         "<tool_call>\n" + w + "\n</tool_call>\n<tool_call>\n" + p + "\n</tool_call>"},
        {ToolCallFormat::kGranite, "<|tool_call|>[" + w + "]", "<|tool_call|>[" + w + ", " + p + "]"},
        {ToolCallFormat::kLlama3, lw, lw + "; " + lp},
    };
    for (const Case& c : cases) {
        const auto g = tool_call_grammar(c.f, kTools, {ToolChoice::kRequired});
        EXPECT_TRUE(in(*g, c.one)) << c.one;
        EXPECT_TRUE(in(*g, c.two)) << c.two;
        expect_parses(c.one, c.f, "get_weather", R"({"city":"Paris","days":2})");
        EXPECT_EQ(parse_tool_calls(c.two, c.f).calls.size(), 2u) << c.two;
        // One call only.
        const auto single = tool_call_grammar(c.f, kTools, {ToolChoice::kRequired, "", false});
        EXPECT_TRUE(in(*single, c.one)) << c.one;
        EXPECT_FALSE(in(*single, c.two)) << c.two;
        // A named function: only that one.
        const auto named = tool_call_grammar(c.f, kTools, {ToolChoice::kNamed, "ping"});
        EXPECT_FALSE(in(*named, c.one)) << c.one;
        // Arguments against the schema.
        std::string bad = c.one;
        bad.replace(bad.find("\"Paris\""), 7, "12");
        EXPECT_FALSE(in(*g, bad)) << bad;
        EXPECT_FALSE(in(*g, "hello " + c.one));
    }
}

TEST(ToolGrammar, AutoIsLazy) {
    const auto g = tool_call_grammar(ToolCallFormat::kHermes, kTools, {ToolChoice::kAuto});
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->trigger(), "<tool_call>");
    EXPECT_TRUE(in(*g, "Just text, no call."));
    EXPECT_TRUE(in(*g, "Let me look.\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(in(*g, "Let me look.\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(in(*g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call> and then text"));
    EXPECT_EQ(tool_call_grammar(ToolCallFormat::kHermes, kTools, {ToolChoice::kNone}), nullptr);
}

TEST(ToolGrammar, BadToolsAreErrors) {
    auto code = [](const std::vector<ToolDef>& tools, const ToolGrammarOptions& o) {
        try {
            tool_call_grammar(ToolCallFormat::kHermes, tools, o);
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()), "");
            return e.code();
        }
        return ErrorCode::kIo;  // no error
    };
    EXPECT_EQ(code({}, {ToolChoice::kRequired}), ErrorCode::kInvalidArgument);
    EXPECT_EQ(code({{"bad name", ""}}, {ToolChoice::kRequired}), ErrorCode::kInvalidArgument);
    EXPECT_EQ(code(kTools, {ToolChoice::kNamed, "missing"}), ErrorCode::kInvalidArgument);
    EXPECT_EQ(code({{"f", "{not json"}}, {ToolChoice::kRequired}), ErrorCode::kParse);
    EXPECT_EQ(code({{"f", R"({"type": "object", "patternProperties": {}})"}}, {ToolChoice::kRequired}),
              ErrorCode::kUnsupported);
    try {
        tool_call_grammar(ToolCallFormat::kHermes, {{"f", R"({"not": {}})"}}, {ToolChoice::kRequired});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tool 'f'"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace cera
