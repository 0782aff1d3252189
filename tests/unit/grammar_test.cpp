// GBNF parsing and whole-text matching: a suite of grammars, each accepting and rejecting strings as
// its definition says; parse errors name the line and the rule.
#include "cera/grammar.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cera/error.h"

namespace cera {
namespace {

struct Case {
    const char* name;
    const char* gbnf;
    std::vector<std::string> accept;
    std::vector<std::string> reject;
};

const char* kJson = R"G(
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::=
  "{" ws (
            string ws ":" ws value
    (ws "," ws string ws ":" ws value)*
  )? ws "}"
array  ::= "[" ws ( value (ws "," ws value)* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*   # whitespace
)G";

const std::vector<Case> kSuite = {
    {"json",
     kJson,
     {R"({"a": [1, 2.5, -3e10, true, null], "b": {"c": "d\n\u00e9"}})", "[]", "{}", "\"x\"", "0", "-0.5E+3",
      "[ {\"k\" : \"v\"} , [ ] ]", "\"caf\xc3\xa9\""},
     {"{", "[1,]", "01", "{\"a\" 1}", "\"\\x\"", "tru", "[1 2]", "{'a': 1}", "\"a\nb\"", "1.", ".5"}},
    {"arithmetic",
     R"G(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")" | "-" factor
num ::= [0-9]+
)G",
     {"1+2*3", "(1+2)*3", "-(4/2)", "((((7))))", "10-2-3", "--1"},
     {"1+", "(1+2", "1+*2", "", "()", "1 + 2", "a"}},
    {"lists",
     R"G(
root ::= item{1,3} ("; " item){0,2}
item ::= "- " [a-z]+ "\n"
)G",
     {"- a\n", "- a\n- bc\n- d\n", "- a\n; - b\n", "- a\n- b\n; - c\n; - d\n"},
     {"", "- A\n", "- a\n- b\n- c\n- d\n", "- a\n; - b\n; - c\n; - d\n", "- a"}},
    {"c-like",
     R"G(
root ::= stmt+
stmt ::= ( decl | assign | ifs | block ) ws
decl ::= "int " id ( " = " expr )? ";"
assign ::= id " = " expr ";"
ifs ::= "if (" expr ") " stmt ( "else " stmt )?
block ::= "{" ws stmt* "}"
expr ::= atom ( " " op " " atom )*
op ::= "+" | "-" | "<" | "==" | "&&"
atom ::= id | [0-9]+ | "(" expr ")"
id ::= [a-zA-Z_] [a-zA-Z0-9_]{0,30}
ws ::= [ \n]?
)G",
     {"int x = 1;", "int x;\nx = x + 1;", "if (x < 3) { y = 2; }", "if (a == b) x = 1; else { }",
      "{ int _a1 = (2 + 3); }"},
     {"int 1x;", "x = ;", "if x < 3 y = 2;", "{ int x = 1;", "int x = 1", "x == 1;"}},
    {"chess",
     R"G(
root ::= move (" " move)*
move ::= ( piece? file? rank? "x"? square promo? | "O-O-O" | "O-O" ) check?
piece ::= [KQRBN]
square ::= file rank
file ::= [a-h]
rank ::= [1-8]
promo ::= "=" [QRBN]
check ::= [+#]
)G",
     {"e4", "e4 e5 Nf3 Nc6 Bb5", "exd5", "O-O", "O-O-O+", "e8=Q#", "Nbd7", "R1a3", "Qh4xe1#"},
     {"e9", "i4", "O-O-O-O", "Pe4 ", "e8=K", "", "Nf3  Nc6"}},
    {"unicode",
     R"G(
root ::= greek " " emoji+ " " cjk{2} " " notascii " " any
greek ::= [\u0391-\u03A9\u03B1-\u03C9]+
emoji ::= [\U0001F600-\U0001F64F]
cjk ::= [一-鿿]
notascii ::= [^\x00-\x7F]
any ::= .
)G",
     {"αβγ 😀😃 中文 é x", "Ω 🙏 日本 ß 😀", "λ 😀 漢字 \xe2\x82\xac \xe2\x82\xac"},
     {"abc 😀 中文 é x", "αβ 🚀 中文 é x", "α 😀 中 é x", "α 😀 中文 e x", "α 😀 中文 é ", "α 😀 中文 é xy"}},
    {"escapes",
     R"G(
root ::= "\x41\u00e9\U0001F600\t\"\\" [\[\]\-] "\n"
)G",
     {"A\xc3\xa9\xf0\x9f\x98\x80\t\"\\[\n", "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\-\n"},
     {"A\xc3\xa9\xf0\x9f\x98\x80\t\"\\a\n", "Ae"}},
    {"repetition",
     R"G(
root ::= "a"{3} "b"{2,} "c"{0,2} ("d" | "e"){1,2}
)G",
     {"aaabbd", "aaabbbbbbcce", "aaabbcde", "aaabbed"},
     {"aabbd", "aaabd", "aaabbcccd", "aaabbddd", "aaabb"}},
};

TEST(Grammar, SuiteAcceptsAndRejects) {
    for (const Case& c : kSuite) {
        SCOPED_TRACE(c.name);
        auto g = Grammar::parse(c.gbnf);
        for (const auto& s : c.accept) EXPECT_EQ(g->match(s), -1) << "should accept: " << s;
        for (const auto& s : c.reject) EXPECT_NE(g->match(s), -1) << "should reject: " << s;
    }
}

TEST(Grammar, MatchReportsWhereItStops) {
    auto g = Grammar::parse(R"(root ::= "abc" [0-9]+)");
    EXPECT_EQ(g->match("abc12"), -1);
    EXPECT_EQ(g->match("abx1"), 2);
    EXPECT_EQ(g->match("abc"), 3);  // a prefix: the end is where it stops
    EXPECT_EQ(g->match("abc1x"), 4);
    // A split UTF-8 character is matched byte by byte.
    auto u = Grammar::parse(R"(root ::= [é] "x")");
    EXPECT_EQ(u->match("\xc3\xa9x"), -1);
    EXPECT_EQ(u->match("\xc3\xa8x"), 1);  // the second byte rules the character out
    EXPECT_EQ(u->match("\xc3"), 1);
    // Overlong forms, surrogates and bytes past U+10FFFF are not UTF-8: "[" written in 2, 3 and 4 bytes.
    auto b = Grammar::parse(R"(root ::= "[" | [\uD000-\uDFFF] | [\U00100000-\U0010FFFF] | .)");
    EXPECT_EQ(b->match("["), -1);
    EXPECT_EQ(b->match("\xc1\x9b"), 0);
    EXPECT_EQ(b->match("\xe0\x81\x9b"), 1);
    EXPECT_EQ(b->match("\xf0\x80\x81\x9b"), 1);
    EXPECT_EQ(b->match("\xed\xa0\x80"), 1);      // U+D800, a surrogate
    EXPECT_EQ(b->match("\xed\x9f\xbf"), -1);     // U+D7FF
    EXPECT_EQ(b->match("\xf4\x90\x80\x80"), 1);  // past U+10FFFF
    EXPECT_EQ(b->match("\xf4\x8f\xbf\xbf"), -1);
}

std::string parse_error(const std::string& gbnf) {
    try {
        Grammar::parse(gbnf);
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kParse);
        return e.what();
    }
    return "";
}

TEST(Grammar, ErrorsNameTheRuleAndLine) {
    EXPECT_EQ(parse_error("root ::= a\na ::= b"), "grammar: line 2: undefined rule 'b'");
    EXPECT_EQ(parse_error("root ::= x\nx ::= x \"a\" | \"b\""),
              "grammar: line 2: rule 'x' is left-recursive (it can reach itself without consuming input)");
    EXPECT_NE(parse_error("root ::= y\ny ::= z \"a\"\nz ::= \"\" | y").find("left-recursive"), std::string::npos);
    EXPECT_EQ(parse_error("start ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
    EXPECT_NE(parse_error("root ::= \"abc").find("line 1, column 14: unterminated string literal"), std::string::npos);
    EXPECT_NE(parse_error("root ::= [a-").find("unterminated character class"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
    EXPECT_NE(parse_error("root ::= * \"a\"").find("follows nothing"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"{3,1}").find("n < m"), std::string::npos);
    EXPECT_NE(parse_error("root ::= (\"a\"").find("expecting ')'"), std::string::npos);
    EXPECT_NE(parse_error("root := \"a\"").find("expecting '::='"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
    EXPECT_NE(parse_error("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
    EXPECT_NE(parse_error("root ::= [z-a]").find("end comes before"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"\\U00110000\"").find("beyond U+10FFFF"), std::string::npos);
    EXPECT_NE(parse_error("root ::= " + std::string(300, '(')).find("nested deeper"), std::string::npos);
}

TEST(Grammar, CommentsNewlinesAndAlternativesAcrossLines) {
    auto g = Grammar::parse("# leading comment\nroot ::= (\n  \"a\" # one\n  | \"b\" # two\n)\n\n# trailing\n");
    EXPECT_EQ(g->match("a"), -1);
    EXPECT_EQ(g->match("b"), -1);
    EXPECT_NE(g->match("ab"), -1);
    // Rule names with dashes and digits; empty alternatives.
    auto h = Grammar::parse("root ::= opt-1 \"x\"\nopt-1 ::= \"y\" | ");
    EXPECT_EQ(h->match("x"), -1);
    EXPECT_EQ(h->match("yx"), -1);
    // Named like the rules the parser makes for groups, defined after the groups.
    auto k = Grammar::parse("root ::= ( \"a\" root-1 ) ( \"b\" )* root-2\nroot-1 ::= \"c\"\nroot-2 ::= ( \"d\" )?");
    EXPECT_EQ(k->match("acbbd"), -1);
    EXPECT_EQ(k->match("ac"), -1);
    EXPECT_NE(k->match("a"), -1);
}

}  // namespace
}  // namespace cera
