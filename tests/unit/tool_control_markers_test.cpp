// Tool-call markers that the vocabulary holds as single control tokens (LFM2's <|tool_call_start|> and
// <|tool_call_end|> are special tokens in its released GGUFs): a grammar spelling the marker text allows
// the control token, a lazy grammar triggers on it, and a detokenizer told to keep it renders its text,
// so that the reply parses into calls. Without them the model's own marker token would be masked out
// (required), never trigger (auto), and vanish from the text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/grammar/grammar_impl.h"
#include "chat/grammar/matcher.h"
#include "chat/tool_calls.h"
#include "chat/tool_grammar.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_io.h"

namespace cera {
namespace {

bool bit(const uint64_t* mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

// The tiny LFM2 fixture's vocabulary with LFM2's two call markers added as control tokens.
struct MarkerVocab {
    std::unique_ptr<Tokenizer> tok;
    int32_t start = -1, end = -1;
    MarkerVocab() {
        auto f = gguf::File::open(test::data_path("fixtures/tiny-lfm2/model.gguf"));
        VocabData d = vocab_data_from_gguf(*f);
        if (d.types.empty()) d.types.assign(d.tokens.size(), TokenType::kNormal);
        for (const char* m : {"<|tool_call_start|>", "<|tool_call_end|>"}) {
            d.tokens.push_back(m);
            d.types.push_back(TokenType::kControl);
            if (!d.scores.empty()) d.scores.push_back(0.0f);
        }
        start = int32_t(d.tokens.size()) - 2, end = start + 1;
        tok = std::make_unique<Tokenizer>(Vocab(std::move(d)));
    }
};

ToolGrammarOptions choice(ToolChoice c) {
    ToolGrammarOptions o;
    o.choice = c;
    return o;
}

std::vector<int32_t> ids(const Tokenizer& tok, const std::string& text) { return tok.encode(text, false, false); }

const std::vector<ToolDef> kTools = {
    {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"}};

TEST(ToolControlMarkers, MarkersAreSingleControlTokens) {
    MarkerVocab v;
    EXPECT_EQ(v.tok->encode("<|tool_call_start|>", false, true), std::vector<int32_t>{v.start});
    EXPECT_TRUE(v.tok->is_control(v.start));
    EXPECT_EQ(tool_call_markers(ToolCallFormat::kLfm2),
              (std::vector<std::string>{"<|tool_call_start|>", "<|tool_call_end|>"}));
}

TEST(ToolControlMarkers, RequiredGrammarAllowsTheMarkerToken) {
    MarkerVocab v;
    const auto trie = grammar::TokenTrie::from_tokenizer(*v.tok);
    const auto g = tool_call_grammar(ToolCallFormat::kLfm2, kTools, choice(ToolChoice::kRequired));
    auto m = make_matcher(*g, trie);
    EXPECT_TRUE(bit(m->mask(), v.start));   // the model's own marker token
    EXPECT_FALSE(bit(m->mask(), v.end));    // not the closing one first
    ASSERT_TRUE(m->accept_token(v.start));
    for (int32_t t : ids(*v.tok, "[get_weather(city=\"Oslo\")]")) {
        ASSERT_TRUE(bit(m->mask(), t)) << t;
        ASSERT_TRUE(m->accept_token(t));
    }
    EXPECT_TRUE(bit(m->mask(), v.end));
    ASSERT_TRUE(m->accept_token(v.end));
    EXPECT_TRUE(m->is_complete());
}

TEST(ToolControlMarkers, LazyGrammarTriggersOnTheMarkerToken) {
    MarkerVocab v;
    const auto trie = grammar::TokenTrie::from_tokenizer(*v.tok);
    const auto g = tool_call_grammar(ToolCallFormat::kLfm2, kTools, choice(ToolChoice::kAuto));
    auto m = make_matcher(*g, trie);
    for (int32_t t : ids(*v.tok, "Let me check. ")) ASSERT_TRUE(m->accept_token(t));
    EXPECT_TRUE(m->is_waiting());
    ASSERT_TRUE(m->accept_token(v.start));
    EXPECT_FALSE(m->is_waiting());  // constrained from here on
    // An unknown tool's name is now refused.
    const std::vector<int32_t> bad = ids(*v.tok, "[nope(");
    bool refused = false;
    for (int32_t t : bad)
        if (!bit(m->mask(), t) || !m->accept_token(t)) {
            refused = true;
            break;
        }
    EXPECT_TRUE(refused);
}

TEST(ToolControlMarkers, DetokenizerKeepsOnlyTheMarkersItIsGiven) {
    MarkerVocab v;
    std::vector<int32_t> reply = ids(*v.tok, "Let me check.");
    reply.push_back(v.start);
    for (int32_t t : ids(*v.tok, "[get_weather(city=\"Oslo\")]")) reply.push_back(t);
    reply.push_back(v.end);
    auto text = [&](StreamingDetokenizer d) {
        std::string s;
        for (int32_t t : reply) s += d.push(t);
        return s + d.flush();
    };
    const std::string plain = text(StreamingDetokenizer(*v.tok));
    EXPECT_EQ(plain.find("<|tool_call_start|>"), std::string::npos);
    EXPECT_TRUE(parse_tool_calls(plain, ToolCallFormat::kLfm2).calls.empty());  // the calls are lost
    const std::string kept = text(StreamingDetokenizer(*v.tok, false, {v.start, v.end}));
    const ParsedToolCalls p = parse_tool_calls(kept, ToolCallFormat::kLfm2);
    ASSERT_EQ(p.calls.size(), 1u) << kept;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments_json, R"({"city":"Oslo"})");
}

}  // namespace
}  // namespace cera
