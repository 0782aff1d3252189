// Published chat templates (LFM2, LFM2.5, Qwen2.5, Qwen3, Llama 3.2/3.3, Granite 3.3, the fixture ChatML)
// rendered over the conversations in tests/data/chat_templates/conversations.json and compared byte for
// byte with tests/data/chat_templates/expected/<case>.txt.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cera/error.h"
#include "test_util.h"

namespace {

using nlohmann::ordered_json;

std::string data_file(const std::string& name) {
    return cera::test::read_text(cera::test::source_path("tests/data/chat_templates/" + name));
}

std::vector<cera::ChatMessage> to_messages(const ordered_json& conv) {
    std::vector<cera::ChatMessage> out;
    for (const auto& m : conv) {
        cera::ChatMessage msg;
        msg.role = m.at("role").get<std::string>();
        msg.content = m.at("content").get<std::string>();
        msg.tool_call_id = m.value("tool_call_id", "");
        msg.name = m.value("name", "");
        msg.reasoning_content = m.value("reasoning_content", "");
        if (m.contains("tool_calls")) {
            for (const auto& c : m["tool_calls"])
                msg.tool_calls.push_back({c.value("id", ""), c.at("name").get<std::string>(),
                                          c.at("arguments").get<std::string>()});
        }
        out.push_back(std::move(msg));
    }
    return out;
}

struct Case {
    std::string name, template_file;
    std::vector<cera::ChatMessage> messages;
    cera::ChatTemplateOptions options;
};

std::vector<Case> load_cases() {
    ordered_json data = ordered_json::parse(data_file("conversations.json"));
    std::vector<Case> cases;
    for (const auto& c : data["cases"]) {
        Case k;
        k.name = c.at("name").get<std::string>();
        k.template_file = c.at("template").get<std::string>();
        k.messages = to_messages(data["conversations"].at(c.at("conversation").get<std::string>()));
        const auto& o = c.at("options");
        k.options.add_generation_prompt = o.value("add_generation_prompt", true);
        k.options.bos_token = o.value("bos_token", "");
        k.options.eos_token = o.value("eos_token", "");
        k.options.date_string = o.value("date_string", "");
        k.options.now_unix_seconds = o.value("now", int64_t{1721952000});
        if (o.contains("kwargs"))
            for (auto it = o["kwargs"].begin(); it != o["kwargs"].end(); ++it)
                k.options.extra_bool_or_string_kwargs[it.key()] = it.value().get<std::string>();
        if (c.contains("tools")) k.options.tools_json = data["tools"].at(c["tools"].get<std::string>()).dump();
        cases.push_back(std::move(k));
    }
    return cases;
}

TEST(ChatTemplate, PublishedTemplatesRenderByteExact) {
    std::vector<Case> cases = load_cases();
    ASSERT_EQ(cases.size(), 28u);
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        cera::ChatTemplate tmpl(data_file(c.template_file));
        std::string expected = data_file("expected/" + c.name + ".txt");
        EXPECT_EQ(tmpl.render(c.messages, c.options), expected);
    }
}

// A few renderings spelled out in full, independent of the data files.
TEST(ChatTemplate, ChatMlFixtureTemplate) {
    cera::ChatTemplate tmpl(data_file("chatml-fixture.jinja"));
    cera::ChatTemplateOptions o;
    o.bos_token = "<s>";
    std::vector<cera::ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hello"}};
    EXPECT_EQ(tmpl.render(msgs, o), "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
                                    "<|im_start|>assistant\n");
    o.add_generation_prompt = false;
    EXPECT_EQ(tmpl.render(msgs, o), "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3DropsEarlierThinkingAndKeepsTheLast) {
    cera::ChatTemplate tmpl(data_file("qwen3.jinja"));
    cera::ChatTemplateOptions o;
    o.add_generation_prompt = false;
    std::vector<cera::ChatMessage> msgs = {{"user", "Q1"},
                                           {"assistant", "<think>\nr1\n</think>\n\nA1"},
                                           {"user", "Q2"},
                                           {"assistant", "<think>\nr2\n</think>\n\nA2"}};
    EXPECT_EQ(tmpl.render(msgs, o),
              "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
              "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n");
    o.add_generation_prompt = true;
    o.extra_bool_or_string_kwargs["enable_thinking"] = "false";
    EXPECT_EQ(tmpl.render({{"user", "Q"}}, o),
              "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Llama3RaiseExceptionBecomesInvalidArgument) {
    cera::ChatTemplate tmpl(data_file("llama-3.3-instruct.jinja"));
    cera::ChatTemplateOptions o;
    std::vector<cera::ChatMessage> msgs = {{"user", "x"}, {"assistant", ""}};
    msgs[1].tool_calls = {{"1", "f", "{}"}, {"2", "g", "{}"}};
    try {
        tmpl.render(msgs, o);
        FAIL() << "expected an exception";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kInvalidArgument);
        EXPECT_STREQ(e.what(), "This model only supports single tool-calls at once!");
    }
    o.tools_json = "[]";
    try {
        tmpl.render({{"system", "only a system message"}}, o);
        FAIL() << "expected an exception";
    } catch (const cera::Error& e) {
        EXPECT_STREQ(e.what(), "Cannot put tools in the first user message when there's no first user message!");
    }
    // With no messages at all, messages[0]['role'] reads an undefined value (an error in Jinja too).
    try {
        tmpl.render({}, o);
        FAIL() << "expected an exception";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kParse);
        EXPECT_NE(std::string(e.what()).find("line 16"), std::string::npos) << e.what();
    }
}

TEST(ChatTemplate, BadToolsJsonIsInvalidArgument) {
    cera::ChatTemplate tmpl(data_file("qwen2.5-instruct.jinja"));
    cera::ChatTemplateOptions o;
    o.tools_json = "[{\"type\": ";
    try {
        tmpl.render({{"user", "x"}}, o);
        FAIL() << "expected an exception";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kInvalidArgument);
    }
    o.tools_json = "{\"a\": 1}";
    EXPECT_THROW(tmpl.render({{"user", "x"}}, o), cera::Error);
}

TEST(ChatTemplate, ToolCallArgumentsThatAreNotJsonStayText) {
    cera::ChatTemplate tmpl(data_file("qwen3.jinja"));
    cera::ChatTemplateOptions o;
    o.add_generation_prompt = false;
    std::vector<cera::ChatMessage> msgs = {{"user", "x"}, {"assistant", ""}};
    msgs[1].tool_calls = {{"", "f", "not json"}};
    EXPECT_EQ(tmpl.render(msgs, o),
              "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
              "<tool_call>\n{\"name\": \"f\", \"arguments\": not json}\n</tool_call><|im_end|>\n");
}

TEST(ChatTemplate, ParseErrorNamesLineAndColumn) {
    try {
        cera::ChatTemplate tmpl("{% for m in messages %}\n{{ m.content }\n{% endfor %}");
        FAIL() << "expected a parse error";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kParse);
        EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
}

}  // namespace
