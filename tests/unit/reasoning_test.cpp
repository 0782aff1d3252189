// The reply's reasoning apart from its answer: whole replies against their expected split, and every
// way of cutting a reply into streamed pieces against the whole reply's split.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace cera {
namespace {

struct Case {
    const char* text;
    bool in_thinking;
    const char* reasoning;
    const char* content;
};

const std::vector<Case>& cases() {
    static const std::vector<Case> c = {
        {"<think>\nThe user greets me.\n</think>\n\nHello!", false, "The user greets me.", "Hello!"},
        {"  \n<think>a</think>b", false, "a", "b"},
        {"<think>\n\n</think>\n\nNo thinking this time.", false, "", "No thinking this time."},
        {"<think>\nline one\n\nline two \n</think>answer\n", false, "line one\n\nline two", "answer\n"},
        {"<think>cut off in the middle  \n", false, "cut off in the middle", ""},
        {"<think>a < b and c </thin k> d</think>\n\n<b>x</b>", false, "a < b and c </thin k> d", "<b>x</b>"},
        {"<think>x</think>y<think>z</think>", false, "x", "y<think>z</think>"},
        {"<think>x</think>\n\n", false, "x", ""},
        {"Hello <think>not a reasoning block</think>", false, "", "Hello <think>not a reasoning block</think>"},
        {"<thin", false, "", "<thin"},
        {"<thinking>x</thinking>", false, "", "<thinking>x</thinking>"},
        {"\n", false, "", "\n"},
        {"", false, "", ""},
        {"Let me see: 2 + 2.\n</think>\n\n4", true, "Let me see: 2 + 2.", "4"},
        {"\nstill thinking when cut", true, "still thinking when cut", ""},
        {"</think>at once", true, "", "at once"},
        {"<think>\nUnicode: \xc3\xa9\xe2\x80\x94\xf0\x9f\x98\x80\n</think>\n\xc3\xa9", false,
         "Unicode: \xc3\xa9\xe2\x80\x94\xf0\x9f\x98\x80", "\xc3\xa9"},
    };
    return c;
}

TEST(Reasoning, WholeReplies) {
    for (const Case& c : cases()) {
        SCOPED_TRACE(c.text);
        const ReasoningDelta d = split_reasoning(c.text, c.in_thinking);
        EXPECT_EQ(d.reasoning, c.reasoning);
        EXPECT_EQ(d.content, c.content);
    }
}

// Streams the pieces; the deltas joined must be the whole reply's split.
void expect_stream(const Case& c, const std::vector<std::string>& pieces) {
    ReasoningStream s(c.in_thinking);
    std::string reasoning, content;
    for (const std::string& p : pieces) {
        const ReasoningDelta d = s.push(p);
        reasoning += d.reasoning, content += d.content;
    }
    const ReasoningDelta d = s.finish();
    reasoning += d.reasoning, content += d.content;
    EXPECT_EQ(reasoning, c.reasoning);
    EXPECT_EQ(content, c.content);
}

TEST(Reasoning, StreamedPiecesJoinIntoTheWholeSplit) {
    std::mt19937 rng(7);
    for (const Case& c : cases()) {
        const std::string text = c.text;
        SCOPED_TRACE(text);
        std::vector<std::string> bytes;
        for (char ch : text) bytes.emplace_back(1, ch);
        expect_stream(c, bytes);
        for (size_t cut = 0; cut <= text.size(); ++cut) expect_stream(c, {text.substr(0, cut), text.substr(cut)});
        for (int round = 0; round < 50; ++round) {
            std::vector<std::string> pieces;
            for (size_t i = 0; i < text.size();) {
                const size_t n = std::uniform_int_distribution<size_t>(1, 6)(rng);
                pieces.push_back(text.substr(i, n));
                i += n;
            }
            expect_stream(c, pieces);
        }
    }
}

TEST(Reasoning, ContentStreamsAsSoonAsItIsKnown) {
    // Once the reply is known not to think, each piece goes out as it comes.
    ReasoningStream s(false);
    EXPECT_EQ(s.push("Hi").content, "Hi");
    EXPECT_EQ(s.push(" there").content, " there");
    // Reasoning goes out too, all but a possible cut tag and the blanks before it.
    ReasoningStream t(false);
    EXPECT_TRUE(t.push("<thi").empty());
    EXPECT_EQ(t.push("nk>\nstep one").reasoning, "step one");
    EXPECT_TRUE(t.push("\n</thi").empty());
    EXPECT_EQ(t.push("nk>\n\nDone").content, "Done");
}

TEST(Reasoning, PromptThatOpensThinking) {
    EXPECT_TRUE(prompt_opens_thinking("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    EXPECT_TRUE(
        prompt_opens_thinking("<\xef\xbd\x9c"
                              "Assistant\xef\xbd\x9c><think>"));
    EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(prompt_opens_thinking("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n"));
    EXPECT_FALSE(prompt_opens_thinking(""));
}

TEST(Reasoning, PromptThatClosesThinking) {
    EXPECT_TRUE(prompt_closes_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(prompt_closes_thinking("<|im_start|>assistant\n"));
    EXPECT_FALSE(prompt_closes_thinking("<|im_start|>assistant\n<think>\n"));
}

// The thinking before a constrained answer: any text without "</think>" (checked against that
// definition on random texts over the tag's characters), the tag, blanks, then the answer's grammar.
TEST(Reasoning, GrammarAfterThinking) {
    const auto answer = Grammar::parse(R"(root ::= "x" [0-9]*)");
    const auto open = grammar_after_thinking(*answer, false), opened = grammar_after_thinking(*answer, true);
    std::mt19937 rng(11);
    const std::string alphabet = "</thinka >\n";
    for (int i = 0; i < 4000; ++i) {
        std::string t;
        const size_t n = std::uniform_int_distribution<size_t>(0, 14)(rng);
        for (size_t k = 0; k < n; ++k)
            t += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
        if (i % 3 == 0) t.insert(std::uniform_int_distribution<size_t>(0, t.size())(rng), "</think");
        const bool free = t.find("</think>") == std::string::npos;
        SCOPED_TRACE(t);
        EXPECT_EQ(opened->match(t + "</think>x1") == -1, free);
        EXPECT_EQ(opened->match(t + "</think>\n\nx") == -1, free);
        EXPECT_EQ(open->match("<think>" + t + "</think>x") == -1, free);
        if (free) EXPECT_NE(opened->match(t + "x"), -1);  // the opened block must close
    }
    EXPECT_EQ(open->match("x12"), -1);  // no thinking at all
    EXPECT_NE(open->match("<think>a</think>y"), -1);
    EXPECT_NE(open->match("<think>a</think>x</think>x"), -1);
    EXPECT_EQ(open->match("<think>a"), 8);  // a beginning of a reply in the language
    // The answer's own grammar: JSON mode.
    const auto json = grammar_after_thinking(*Grammar::json(), false);
    EXPECT_EQ(json->match("<think>\nThe user wants {an object}.\n</think>\n\n{\"a\": [1, 2]}"), -1);
    EXPECT_EQ(json->match("{\"a\": 1}"), -1);
    EXPECT_NE(json->match("<think>x</think>not json"), -1);
}

// Tool calls with tool_choice "auto" (a lazy grammar): a trigger inside the thinking does not count.
TEST(Reasoning, LazyTriggerAfterThinking) {
    const auto calls = Grammar::lazy(R"(root ::= "<tool_call>" [a-z]+ "</tool_call>")", "<tool_call>");
    const auto open = grammar_after_thinking(*calls, false), opened = grammar_after_thinking(*calls, true);
    const std::string thought = "<think>\nI could use <tool_call> here, or answer.\n</think>\n\n";
    EXPECT_NE(calls->match(thought + "<tool_call>abc</tool_call>"), -1);  // the plain lazy grammar fires early
    EXPECT_EQ(open->match(thought + "<tool_call>abc</tool_call>"), -1);
    EXPECT_EQ(open->match(thought + "Plain answer."), -1);
    EXPECT_NE(open->match(thought + "<tool_call>ab1</tool_call>"), -1);
    EXPECT_EQ(open->match("  <tool_call>abc</tool_call>"), -1);  // no thinking: as before
    EXPECT_NE(open->match("<tool_call>a b</tool_call>"), -1);
    EXPECT_EQ(open->match("<think>unfinished <tool_call> thought"), -1);
    EXPECT_EQ(opened->match("thinking of <tool_call> now</think><tool_call>x</tool_call>"), -1);
    EXPECT_NE(opened->match("thinking of</think><tool_call>x y</tool_call>"), -1);
    EXPECT_EQ(opened->match("<tool_call> stays thought"), -1);
}

}  // namespace
}  // namespace cera
