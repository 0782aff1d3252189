// Token masks: each mask equals the brute-force answer (for every token: does the text so far plus its
// bytes stay a prefix of the language?), on a small vocabulary with tokens that span grammar elements
// and split UTF-8 characters, and on Qwen3's 151,669-token vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cera/grammar.h"
#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_impl.h"
#include "chat/grammar/matcher.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace cera {
namespace {

using grammar::Matcher;
using grammar::TokenTrie;

// The reference: a text matcher (no vocabulary, no trie) over text + piece from the grammar's start.
// One matcher per grammar is reset for each text: building one for each of a vocabulary's tokens
// would cost more than the matching.
bool viable(const Grammar& g, const std::string& text) {
    thread_local const grammar::GrammarDef* def = nullptr;
    thread_local std::unique_ptr<Matcher> m;
    if (def != g.impl().def.get()) {
        m = std::make_unique<Matcher>(g.impl().def);
        def = g.impl().def.get();
    }
    m->reset();
    return m->accept_bytes(text) == text.size();
}

bool bit(const uint64_t* mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

// Walks random allowed tokens, checking every mask against the reference; returns the texts made.
std::vector<std::string> check_walks(const Grammar& g, const std::shared_ptr<const TokenTrie>& trie, int walks,
                                     int max_steps, uint64_t seed, int check_every = 1) {
    std::mt19937_64 rng(seed);
    std::vector<std::string> texts;
    auto m = make_matcher(g, trie);
    for (int w = 0; w < walks; ++w) {
        m->reset();
        std::string text;
        for (int step = 0; step < max_steps; ++step) {
            const uint64_t* mask = m->mask();
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < trie->n_vocab(); ++id) {
                const bool got = bit(mask, id);
                if (step % check_every == 0) {
                    bool want;
                    if (trie->is_eog(id))
                        want = g.match(text) == -1;
                    else if (trie->is_excluded(id))
                        want = false;
                    else
                        want = viable(g, text + trie->piece(id));
                    if (got != want) {
                        ADD_FAILURE() << "token " << id << " '" << trie->piece(id) << "' after '" << text << "': mask "
                                      << got << ", reference " << want;
                        return texts;
                    }
                }
                if (got) allowed.push_back(id);
            }
            if (allowed.empty()) break;
            const int32_t t = allowed[rng() % allowed.size()];
            EXPECT_TRUE(m->accept_token(t));
            if (trie->is_eog(t)) break;
            text += trie->piece(t);
        }
        texts.push_back(text);
    }
    return texts;
}

std::shared_ptr<const TokenTrie> small_vocab() {
    std::vector<std::string> p = {
        "<eos>",    "{",        "}",  "\"",  "\":", "\"}",  "{\"",  ", ",       ",",        ":",    " ",
        "a",        "b",        "ab", "abc", "\"a", "1",    "12",   "-",        "0",        "true", "tr",
        "ue",       "null",     "[",  "]",   "[]",  "\xc3", "\xa9", "\xc3\xa9", "\xe4\xb8", "\xad", "\xe4\xb8\xad",
        "\xf0\x9f", "\x98\x80", "\\", "\\n", "n",   "e",    "\n",   "  ",       "x\"",      "<ctl>"};
    std::vector<bool> eog(p.size(), false), control(p.size(), false);
    eog[0] = true;
    control.back() = true;
    return std::make_shared<const TokenTrie>(p, eog, control);
}

TEST(GrammarMatcher, MasksEqualTheReferenceOnASmallVocabulary) {
    const auto trie = small_vocab();
    for (const char* gbnf : {
             R"(root ::= "{" ws "\"" [a-c]+ "\":" ws value ws "}"
value ::= "true" | "null" | "-"? [0-9]+ | "\"" [^"\\\x00-\x1F]{0,6} "\""
ws ::= " "?)",
             R"(root ::= ( [é中😀] | "ab" | "\n" ){1,8})",
             R"(root ::= "[" ( "1" | "a" "b"? )* "]" )",
         }) {
        SCOPED_TRACE(gbnf);
        auto g = Grammar::parse(gbnf);
        const auto texts = check_walks(*g, trie, 30, 24, 7);
        EXPECT_EQ(texts.size(), 30u);
    }
    // JSON mode on the small vocabulary.
    check_walks(*Grammar::json(true), trie, 20, 20, 11);
}

// Random tokens over quotes, backslashes, newlines, letters, digits, whole and split UTF-8 characters:
// long runs of one class share trie prefixes, so walks take whole subtrees in one step, and tokens
// leave the top frames at one or several places (through optional whitespace).
std::shared_ptr<const TokenTrie> random_vocab(uint64_t seed) {
    const std::vector<std::string> units = {"a",
                                            "b",
                                            "z",
                                            "1",
                                            "0",
                                            "\"",
                                            "\\",
                                            " ",
                                            "\n",
                                            ",",
                                            ".",
                                            "[",
                                            "]",
                                            "\xc3\xa9",
                                            "!",
                                            "é",
                                            "\xe4\xb8\xad",
                                            "\xf0\x9f\x98\x80",
                                            "\xc3",
                                            "\xa9",
                                            "\t"};
    std::mt19937_64 rng(seed);
    std::vector<std::string> pieces = {"<eos>"};
    for (int i = 0; i < 900; ++i) {
        std::string p;
        const int len = 1 + int(rng() % 9);
        // Most tokens are letters; the rest draw from every unit.
        for (int k = 0; k < len; ++k) p += rng() % 3 ? units[rng() % 3] : units[rng() % units.size()];
        pieces.push_back(p);
    }
    std::sort(pieces.begin() + 1, pieces.end());
    pieces.erase(std::unique(pieces.begin() + 1, pieces.end()), pieces.end());
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    return std::make_shared<const TokenTrie>(pieces, eog, control);
}

TEST(GrammarMatcher, SubtreesTakenWholeMatchTheReference) {
    const auto trie = random_vocab(17);
    for (const char* gbnf : {
             R"(root ::= "\"" [^"\\\x00-\x1F]{0,12} "\"" ( " "? "," " "? "\"" [a-z]{1,3} "\"" )*)",
             R"(root ::= ( [a-z] | [a-zé] [a-z0-9]{0,3} ){0,6} ws "!" ws
ws ::= [ \n]{0,3})",
             R"(root ::= x{2,5} y
x ::= [^a] | "a"
y ::= [\x00-\U0010FFFF]{0,4} ".")",
             R"(root ::= [^é"]{0,7} "\"" [^\x00-\x60]* "!")",
             R"(root ::= ( "[" item{0,4} "]" ){1,3}
item ::= [a-c]{1,5} " "?)",
             R"(root ::= ( [a-z]+ | [a-z0-9 ]{0,20} ) ( "\n" [ab]* )? ".")",
         }) {
        SCOPED_TRACE(gbnf);
        auto g = Grammar::parse(gbnf);
        const auto texts = check_walks(*g, trie, 16, 24, 23);
        EXPECT_EQ(texts.size(), 16u);
    }
    check_walks(*Grammar::json(true), trie, 16, 24, 29);
}

// Bounded runs of a class that end by leaving the position's top frames, where more of the same class
// may follow from below (the tokens past the run are uncertain there, not rejected), or that end at a
// level holding such an exit: every string of a small alphabet up to 5 bytes, and longer letter runs.
TEST(GrammarMatcher, BoundedRunsLeavingTheFramesMatchTheReference) {
    std::vector<std::string> pieces = {"<eos>"};
    const std::string alphabet = "ab[],!.";
    std::vector<std::string> level = {""};
    for (int len = 1; len <= 5; ++len) {
        std::vector<std::string> next;
        for (const std::string& p : level)
            for (char c : alphabet) next.push_back(p + c);
        pieces.insert(pieces.end(), next.begin(), next.end());
        level = std::move(next);
    }
    // Runs of a letter outside the alphabet, so that their subtrees hold letters only.
    for (int len = 1; len <= 12; ++len) {
        pieces.push_back(std::string(size_t(len), 'z'));
        pieces.push_back("[" + std::string(size_t(len), 'z'));
        pieces.push_back("[]!" + std::string(size_t(len), 'z'));
        pieces.push_back("[a]!" + std::string(size_t(len), 'z'));
    }
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    const auto trie = std::make_shared<const TokenTrie>(pieces, eog, control);
    for (const char* gbnf : {
             R"(root ::= w [a-z] "."
w ::= v [a-z]?
v ::= u [a-z]?
u ::= "[" [a-z]{2,3})",
             R"(root ::= w [a-z]* "."
w ::= v ( [a-z]{0,2} "," )?
v ::= u "!"
u ::= "[" [a-z]{0,2} "]")",
             R"(root ::= "[" w "]" [ab]{0,9}
w ::= v [a-z]{0,2}
v ::= u ","?
u ::= [ab]{1,3})",
         }) {
        SCOPED_TRACE(gbnf);
        auto g = Grammar::parse(gbnf);
        check_walks(*g, trie, 12, 8, 31);
    }
}

// Bounded repetitions share one classification for their rungs (the tokens shorter than the rung's
// room are sorted as for the unbounded loop) and positions with the same future share theirs: runs of
// one and two-byte letters around each rung's room, with and without a closing quote or a dot inside,
// under ladders of single classes, of alternatives of several code points, nested ladders, nullable
// items (no loop), escapes, and the same bounded string in several rules.
TEST(GrammarMatcher, LadderRungsMatchTheReference) {
    std::vector<std::string> pieces = {"<eos>", "\"", "!", ">", "<", "@", ".", "|", "\\", "\\n", "\\\"", "'", "b", "ab"};
    for (int len = 1; len <= 10; ++len) {
        const std::string a(size_t(len), 'a');
        std::string e;
        for (int i = 0; i < len; ++i) e += "\xc3\xa9";
        for (const std::string& run : {a, e, a.substr(1) + "\xc3\xa9"}) {
            pieces.push_back(run);
            pieces.push_back(run + "\"");
            pieces.push_back(run + "\"!");
            pieces.push_back(run + ".");
            pieces.push_back(run + ">");
            pieces.push_back("\"" + run);
        }
        pieces.push_back(a + "\xc3");  // ends inside a code point
        pieces.push_back(a.substr(0, size_t(len) / 2) + "\\n" + a.substr(size_t(len) / 2));
    }
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    const auto trie = std::make_shared<const TokenTrie>(pieces, eog, control);
    for (const char* gbnf : {
             R"(root ::= "\"" [aé]{0,7} "\"" "!")",
             R"(root ::= "<" ( "a" "a" | "é" ){0,5} ">" [a]{0,3})",
             R"(root ::= ( [aé]{1,4} "." ){0,3} "@" [a]{2,5})",
             R"(root ::= x "|" y "|" z
x ::= "\"" [aé]{0,6} "\""
y ::= "'" [aé]{0,6} "\""
z ::= "\"" [aé]* "\"")",
             R"(root ::= ( "a"? "é"? ){0,4} "!")",
             R"(root ::= "\"" ( [^"\\] | "\\" ["n] ){0,6} "\"" "!"?)",
             R"(root ::= "\"" ( [a]{0,3} "." ){2,4} "\"")",
             R"(root ::= "<" p "|" q
p ::= "a" p | "!"
q ::= "a" q | ">")",
         }) {
        SCOPED_TRACE(gbnf);
        auto g = Grammar::parse(gbnf);
        check_walks(*g, trie, 24, 10, 37);
    }
}

// What makes the sharing above happen: the rungs of a bounded repetition name a loop of the same
// item, and the places after two bounded strings of different rules have one future.
TEST(GrammarMatcher, BoundedRepetitionsNameTheirLoop) {
    const grammar::GrammarDef d = grammar::parse_gbnf(R"G(root ::= x "|" y
x ::= "\"" [a-z]{0,6} "\""
y ::= "'" ( [a-z] ){0,6} "\""
z ::= "(" ( "a"? ){0,3} ")")G");
    std::vector<uint32_t> rungs;
    for (const auto& r : d.rules)
        if (r.loop != UINT32_MAX) {
            rungs.push_back(r.rung);
            EXPECT_EQ(d.elems[d.rules[r.loop].alts[0] + 1].op, grammar::Op::kRef);  // item, loop, end
            EXPECT_EQ(d.elems[d.rules[r.loop].alts[0] + 1].arg, r.loop);
        }
    std::sort(rungs.begin(), rungs.end());
    EXPECT_EQ(rungs, (std::vector<uint32_t>{2, 2, 3, 3, 4, 4, 5, 5, 6, 6}));  // none for z's nullable item
    auto closing_quote = [&](const std::string& rule) {  // the last element of the rule's only alternative
        for (const auto& r : d.rules)
            if (r.name == rule) {
                uint32_t p = r.alts[0];
                while (d.elems[p + 1].op != grammar::Op::kEnd) ++p;
                return p;
            }
        return UINT32_MAX;
    };
    EXPECT_EQ(d.same_as[closing_quote("x")], d.same_as[closing_quote("y")]);
    EXPECT_NE(d.same_as[closing_quote("x")], d.same_as[closing_quote("z")]);
}

// A grammar the fuzzer found: stacks grow without end through classes that hold each other, in many
// ways, so a stack's run must be bounded work. Masks over single bytes, following the first allowed
// byte, each against the reference.
TEST(GrammarMatcher, RunsStayBoundedOnGrowingStacks) {
    std::vector<std::string> pieces = {"</s>"};
    for (int b = 1; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    const auto trie = std::make_shared<const TokenTrie>(pieces, eog, control);
    auto g = Grammar::parse(R"(root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws "$$$$$$$$$$$$$:" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array  ::= "[" ws ( value  value (ws "," ws value)* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9c{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
ws     ::= [ \t\n]{0,8})");
    auto m = make_matcher(*g, trie);
    std::string text;
    for (int step = 0; step < 12; ++step) {
        const uint64_t* mask = m->mask();
        int32_t pick = -1;
        for (int32_t id = 1; id < trie->n_vocab(); ++id) {
            ASSERT_EQ(bit(mask, id), viable(*g, text + trie->piece(id))) << "byte " << id << " after '" << text << "'";
            if (pick < 0 && bit(mask, id)) pick = id;
        }
        ASSERT_GE(pick, 0);
        ASSERT_TRUE(m->accept_token(pick));
        text += trie->piece(pick);
    }
}

// Every "a" opens a frame that closes with "b" or with "c": after n of them, 2^n stacks. Past the
// matcher's bound a byte throws a clear error instead of taking ever longer, and the state stays
// where it was.
TEST(GrammarMatcher, AmbiguityPastTheBoundIsAnError) {
    const auto def = std::make_shared<const grammar::GrammarDef>(grammar::parse_gbnf(R"(root ::= x
x ::= "a" x "b" | "a" x "c" | "")"));
    Matcher m(def);
    size_t taken = 0;
    std::string error;
    for (; taken < 40; ++taken) {
        try {
            ASSERT_EQ(m.accept_bytes("a"), 1u);
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
            error = e.what();
            break;
        }
    }
    EXPECT_NE(error.find("ambiguous grammar"), std::string::npos) << error;
    ASSERT_GE(taken, 8u);
    ASSERT_LT(taken, 40u);
    EXPECT_FALSE(m.is_dead());
    EXPECT_EQ(m.accept_bytes(std::string(taken, 'b')), taken);
    EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, CompleteGrammarAllowsOnlyEnd) {
    const auto trie = small_vocab();
    auto g = Grammar::parse(R"(root ::= "ab")");
    auto m = make_matcher(*g, trie);
    EXPECT_FALSE(bit(m->mask(), 0));   // nothing yet: no end
    ASSERT_TRUE(m->accept_token(13));  // "ab"
    EXPECT_TRUE(m->is_complete());
    const uint64_t* mask = m->mask();
    for (int32_t id = 0; id < trie->n_vocab(); ++id) EXPECT_EQ(bit(mask, id), id == 0) << id;
    EXPECT_FALSE(m->accept_token(11));
    EXPECT_TRUE(m->accept_token(0));
}

TEST(GrammarMatcher, SplitUtf8AcrossTokens) {
    const auto trie = small_vocab();
    auto g = Grammar::parse(R"(root ::= "é" "中")");
    auto m = make_matcher(*g, trie);
    ASSERT_TRUE(m->accept_token(27));   // 0xC3: the first byte of é
    EXPECT_FALSE(m->accept_token(31));  // 0xAD cannot complete é
    ASSERT_TRUE(m->accept_token(28));   // 0xA9
    EXPECT_FALSE(bit(m->mask(), 29));   // é again: no
    EXPECT_TRUE(bit(m->mask(), 30));    // the first two bytes of 中
    ASSERT_TRUE(m->accept_token(32));
    EXPECT_TRUE(m->can_end());
}

TEST(GrammarMatcher, QwenVocabularyMasksEqualTheReference) {
    auto tok = Tokenizer::from_file(test::data_path("vocab-extra/qwen3-vocab-qwen2.gguf"));
    const auto trie = TokenTrie::from_tokenizer(*tok);
    ASSERT_EQ(trie->n_vocab(), 151669);
    auto g = Grammar::from_json_schema(R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"enum": ["a", "b c", "é"]}, "maxItems": 3},
        "n": {"type": "integer", "minimum": -5, "maximum": 300}},
        "required": ["name", "n"]})");
    const auto texts = check_walks(*g, trie, 2, 14, 3);
    for (const auto& t : texts) EXPECT_NE(g->match(t), 0) << t;
}
}  // namespace
}  // namespace cera

namespace cera {
namespace {

// The reference for a lazy grammar's mask after `text`: end where the whole text matches; a control
// token while the trigger has not counted; any other token where the text with it holds no counting
// trigger (trigger_at: where it starts, npos for none) or is viable from the trigger on.
std::vector<bool> lazy_reference(const Grammar& g, const TokenTrie& trie, const std::string& text,
                                 const std::function<size_t(const std::string&)>& trigger_at) {
    std::vector<bool> want(size_t(trie.n_vocab()));
    const bool seen = trigger_at(text) != std::string::npos;
    for (int32_t id = 0; id < trie.n_vocab(); ++id) {
        if (trie.is_eog(id)) {
            want[size_t(id)] = g.match(text) == -1;
        } else if (trie.is_excluded(id)) {
            want[size_t(id)] = !seen;
        } else {
            const std::string s = text + trie.piece(id);
            const size_t at = trigger_at(s);
            want[size_t(id)] = at == std::string::npos || viable(g, s.substr(at));
        }
    }
    return want;
}

// Each bit of a lazy matcher's mask after `text` against the reference `want` (the first difference
// fails); `allowed` gets the ids it allows.
void expect_reference_mask(const uint64_t* mask, const std::vector<bool>& want, const TokenTrie& trie,
                           const std::string& text, std::vector<int32_t>& allowed) {
    for (int32_t id = 0; id < trie.n_vocab(); ++id) {
        ASSERT_EQ(bit(mask, id), want[size_t(id)]) << "token '" << trie.piece(id) << "' after '" << text << "'";
        if (want[size_t(id)]) allowed.push_back(id);
    }
}

// A lazy grammar (tool calls with tool_choice "auto"): before the trigger every token is allowed but
// one that completes the trigger with bytes the grammar rejects; from the trigger on, the grammar's
// masks. Random walks check each mask against that reference.
TEST(GrammarMatcher, LazyGrammarMasksEqualTheReference) {
    // The small vocabulary and tokens that hold the whole trigger, followed well or badly.
    const auto small = small_vocab();
    std::vector<std::string> pieces;
    std::vector<bool> eog, control;
    for (int32_t id = 0; id < small->n_vocab(); ++id) {
        pieces.push_back(small->piece(id));
        eog.push_back(small->is_eog(id));
        control.push_back(small->is_excluded(id));
    }
    for (const char* extra : {"x{\"1", "{\"ab", "a{\"b\":", "{\"\":"}) {
        pieces.push_back(extra);
        eog.push_back(false);
        control.push_back(false);
    }
    const auto trie = std::make_shared<const TokenTrie>(pieces, eog, control);
    auto g = Grammar::lazy(R"(root ::= "{\"" [ab]+ "\":" " "? ( "1" | "true" ) "}")", "{\"");
    std::mt19937_64 rng(5);
    auto m = make_matcher(*g, trie);
    int triggered = 0;
    for (int w = 0; w < 200; ++w) {
        m->reset();
        std::string text;
        bool seen = false;  // the trigger is in the text
        for (int step = 0; step < 16; ++step) {
            const uint64_t* mask = m->mask();
            std::vector<int32_t> allowed;
            const std::vector<bool> want =
                lazy_reference(*g, *trie, text, [](const std::string& t) { return t.find("{\""); });
            ASSERT_NO_FATAL_FAILURE(expect_reference_mask(mask, want, *trie, text, allowed));
            if (allowed.empty()) break;
            // Lean to the braces so that walks reach the trigger.
            int32_t t = allowed[rng() % allowed.size()];
            if (!seen && rng() % 3 == 0) t = rng() % 2 ? 1 : 6;  // "{" or "{\""
            if (!bit(mask, t)) continue;
            ASSERT_TRUE(m->accept_token(t));
            if (trie->is_eog(t)) break;
            if (!trie->is_excluded(t)) text += trie->piece(t);
            if (!seen && text.find("{\"") != std::string::npos) seen = true, ++triggered;
            EXPECT_EQ(m->is_waiting(), !seen);
        }
    }
    EXPECT_GT(triggered, 50);
}

// The same lazy grammar after a thinking block (lazy_after_thinking): a trigger inside a <think> block
// at the start of the text does not count. The reference finds the trigger from the block's end; the
// vocabulary has no token that holds both a thinking tag's end and a trigger, the one place where the
// masks are coarser (they allow such a token, and accept_token refuses it).
TEST(GrammarMatcher, LazyGrammarAfterThinkingMasksEqualTheReference) {
    std::vector<std::string> pieces = {
        "<eos>", "<think>",     "</think>",      "<th",          "ink>",   "</",   "think", ">",
        "<",     "<tool_call>", "</tool_call>",  "<tool",        "_call>", "abc",  "a",     "b",
        " ",     "\n",          "x<tool_call>a", "<tool_call>1", "q",      "<ctl>"};
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    control.back() = true;
    const auto trie = std::make_shared<const TokenTrie>(pieces, eog, control);
    const std::string trigger = "<tool_call>";
    const auto lazy = Grammar::lazy(R"(root ::= "<tool_call>" [a-z]+ "</tool_call>")", trigger);
    for (const bool opened : {false, true}) {
        SCOPED_TRACE(opened ? "the prompt opened the thinking" : "the reply may open it");
        const auto g = lazy_after_thinking(*lazy, opened);
        // Where the trigger is looked for in s: after the leading block's </think>; npos while in it.
        auto region = [&](const std::string& s) -> size_t {
            const size_t b = std::min(s.find_first_not_of(" \n"), s.size());
            if (!opened && s.compare(b, 7, "<think>") != 0)
                return std::string("<think>").compare(0, s.size() - b, s, b) == 0 ? std::string::npos : 0;
            const size_t close = s.find("</think>", opened ? 0 : b + 7);
            return close == std::string::npos ? close : close + 8;
        };
        auto triggered_at = [&](const std::string& s) {
            const size_t r = region(s);
            return r == std::string::npos ? r : s.find(trigger, r);
        };
        std::mt19937_64 rng(opened ? 9 : 8);
        auto m = make_matcher(*g, trie);
        int thought = 0, triggered = 0;
        for (int w = 0; w < 300; ++w) {
            m->reset();
            std::string text;
            for (int step = 0; step < 24; ++step) {
                const uint64_t* mask = m->mask();
                std::vector<int32_t> allowed;
                const std::vector<bool> want = lazy_reference(*g, *trie, text, triggered_at);
                ASSERT_NO_FATAL_FAILURE(expect_reference_mask(mask, want, *trie, text, allowed));
                if (allowed.empty()) break;
                int32_t t = allowed[rng() % allowed.size()];
                if (rng() % 4 == 0) t = int32_t(1 + rng() % 11);  // lean to the tags and the trigger
                if (step == 0 && rng() % 2 == 0) t = 1;           // and to replies that think
                if (!bit(mask, t)) continue;
                ASSERT_TRUE(m->accept_token(t));
                if (trie->is_eog(t)) break;
                if (!trie->is_excluded(t)) text += trie->piece(t);
                EXPECT_EQ(m->is_waiting(), triggered_at(text) == std::string::npos) << text;
            }
            thought += region(text) != 0 && text.find("</think>") != std::string::npos;
            triggered += triggered_at(text) != std::string::npos;
        }
        EXPECT_GT(thought, 20);
        EXPECT_GT(triggered, 20);
    }
}

}  // namespace
}  // namespace cera
