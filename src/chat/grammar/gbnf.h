// GBNF grammars (llama.cpp's syntax) parsed into a flat rule table that the matcher walks.
//
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"     # a comment
//   ws     ::= [ \t\n]{0,4}
//
// A rule is a list of alternatives; an alternative is a run of elements in `elems` that ends with
// kEnd. An element matches one code point of a class (kChar) or a whole rule (kRef). Repetitions and
// groups become generated rules, named after the rule they appear in ("object#2", a name no rule in the
// text can have). Parsing rejects undefined rules, a missing root and left recursion (a rule that
// reaches itself without consuming input), naming the rule and its line.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cera::grammar {

// A set of code points: sorted, disjoint, non-adjacent inclusive ranges, with an ASCII bitmap for
// the common case.
struct CharClass {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    uint64_t ascii[2] = {0, 0};

    bool contains(uint32_t cp) const {
        if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
        for (const auto& r : ranges)
            if (cp < r.first)
                return false;
            else if (cp <= r.second)
                return true;
        return false;
    }
    // Whether any code point in [lo, hi] is in the class.
    bool intersects(uint32_t lo, uint32_t hi) const {
        for (const auto& r : ranges)
            if (r.first <= hi && lo <= r.second) return true;
        return false;
    }
    bool operator==(const CharClass& o) const { return ranges == o.ranges; }
};

// Builds a class from ranges in any order (negate: the complement within [0, 0x10FFFF]).
CharClass make_class(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate);

enum class Op : uint8_t { kChar, kRef, kEnd };

struct Elem {
    Op op;
    uint32_t arg;  // kChar: index into classes; kRef: rule index; kEnd: the rule it ends
};

struct Rule {
    std::string name;
    int line = 0;                // line of the definition (generated rules: of their parent)
    std::vector<uint32_t> alts;  // start position of each alternative in `elems`
    // A bounded repetition item{0,n} is a ladder of rules R_k ::= item R_(k-1) | "" (R_1 ::= item | "").
    // A rung k >= 2 whose item cannot match the empty text names `loop`, the rule  L ::= item L | ""
    // (added for it, referenced by nothing), whose first alternative has the same layout as the rung's:
    // a token of fewer than k code points cannot tell the rung from the loop, so the matcher classifies
    // tokens once for the loop and shares that across the rungs.
    uint32_t loop = UINT32_MAX;
    uint32_t rung = 0;
};

struct GrammarDef {
    std::vector<Rule> rules;
    std::vector<Elem> elems;
    std::vector<CharClass> classes;
    uint32_t root = 0;
    // Per element: the first element with the same future (what the rest of its rule matches, up to the
    // rule's end, rules compared by what they match). Such positions behave alike wherever they are,
    // so the matcher shares their token classification: every JSON string's closing quote is one.
    std::vector<uint32_t> same_as;
};

// Parses GBNF text. Throws cera::Error (kParse) with "line L, column C: ..." for bad syntax, and names
// the rule for an undefined reference, a missing root or left recursion.
GrammarDef parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace cera::grammar
