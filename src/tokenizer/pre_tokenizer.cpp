// Pre-tokenizers, written as hand-made matchers of each tokenizer's split regexes.
//
// A rule set is a list of regexes applied in turn: each one splits every current piece into its
// matches and the gaps between them (llama.cpp's unicode_regex_split). A matcher returns the length
// of the regex match anchored at `pos` inside the piece [.., end), or 0. Lookaheads and `$` see the
// piece end. Alternatives are tried in order, like ECMAScript/Oniguruma (first alternative wins).
//
// The GPT-2 and Llama 3 rules follow llama.cpp's dedicated splitters, which treat unassigned
// codepoints as matching nothing; the other regexes treat them as "not letter/number/space".
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace cera {
namespace {

using namespace unicode;

constexpr uint8_t kWLN = kWhitespace | kLetter | kNumber;

struct Ctx {
    const uint32_t* c;  // codepoints
    const uint8_t* f;   // their flags
};

using Matcher = size_t (*)(const Ctx&, size_t pos, size_t end);

inline bool is_rn(uint32_t cp) { return cp == '\r' || cp == '\n'; }

enum class Case { kSensitive, kAscii, kUnicode };

// 's|'t|'re|'ve|'m|'ll|'d
size_t contraction(const Ctx& x, size_t pos, size_t end, Case cs) {
    if (x.c[pos] != '\'' || pos + 1 >= end) return 0;
    auto low = [cs](uint32_t cp) {
        if (cs == Case::kUnicode) return to_lower(cp);
        if (cs == Case::kAscii && cp >= 'A' && cp <= 'Z') return cp + 32;
        return cp;
    };
    const uint32_t a = low(x.c[pos + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= end) return 0;
    const uint32_t b = low(x.c[pos + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

size_t run(const Ctx& x, size_t p, size_t end, uint8_t flag) {
    while (p < end && (x.f[p] & flag)) ++p;
    return p;
}

// Whitespace alternatives shared by the GPT-2 family: \s*[\r\n]+ (when with_rn), \s+(?!\S), \s+.
size_t whitespace(const Ctx& x, size_t pos, size_t end, bool with_rn) {
    size_t k = 0, last_rn = 0;
    while (pos + k < end && (x.f[pos + k] & kWhitespace)) {
        if (is_rn(x.c[pos + k])) last_rn = k + 1;
        ++k;
    }
    if (with_rn && last_rn > 0) return last_rn;
    if (k > 1 && pos + k < end) return k - 1;
    return k;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Ctx& x, size_t pos, size_t end) {
    if (size_t n = contraction(x, pos, end, Case::kSensitive)) return n;
    const bool space = x.c[pos] == ' ';
    const uint8_t f2 = space ? (pos + 1 < end ? x.f[pos + 1] : 0) : x.f[pos];
    size_t p = pos + (space ? 1 : 0);
    if (f2 & kLetter) return run(x, p, end, kLetter) - pos;
    if (f2 & kNumber) return run(x, p, end, kNumber) - pos;
    if (!(f2 & kWLN) && f2) {
        while (p < end && !(x.f[p] & kWLN) && x.f[p]) ++p;
        return p - pos;
    }
    const size_t k = whitespace(x, pos, end, false);
    return k > 0 ? k : 1;
}

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//          \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const Ctx& x, size_t pos, size_t end) {
    if (size_t n = contraction(x, pos, end, Case::kUnicode)) return n;
    const uint32_t cp = x.c[pos];
    const uint8_t f = x.f[pos];
    if (!is_rn(cp) && !(f & kNumber)) {
        if ((f & kLetter) || (pos + 1 < end && (x.f[pos + 1] & kLetter))) return run(x, pos + 1, end, kLetter) - pos;
    }
    if (f & kNumber) return std::min<size_t>(run(x, pos, end, kNumber) - pos, 3);
    const bool space = cp == ' ';
    const uint8_t f2 = space ? (pos + 1 < end ? x.f[pos + 1] : 0) : f;
    if (!(f2 & kWLN) && f) {
        size_t p = pos + (space ? 1 : 0);
        while (p < end && !(x.f[p] & kWLN) && x.f[p]) ++p;
        while (p < end && is_rn(x.c[p])) ++p;
        return p - pos;
    }
    const size_t k = whitespace(x, pos, end, true);
    return k > 0 ? k : 1;
}

// Qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//        \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_qwen2(const Ctx& x, size_t pos, size_t end) {
    if (size_t n = contraction(x, pos, end, Case::kAscii)) return n;
    const uint32_t cp = x.c[pos];
    const uint8_t f = x.f[pos];
    if (f & kLetter) return run(x, pos + 1, end, kLetter) - pos;
    if (!is_rn(cp) && !(f & (kLetter | kNumber)) && pos + 1 < end && (x.f[pos + 1] & kLetter))
        return run(x, pos + 2, end, kLetter) - pos;
    if (f & kNumber) return 1;
    size_t p = pos;
    if (cp == ' ' && pos + 1 < end && !(x.f[pos + 1] & kWLN)) p = pos + 1;
    if (!(x.f[p] & kWLN)) {
        while (p < end && !(x.f[p] & kWLN)) ++p;
        while (p < end && is_rn(x.c[p])) ++p;
        return p - pos;
    }
    return whitespace(x, pos, end, true);
}

// ---- pieces of the multi-regex rule sets ----

struct Range {
    uint32_t lo, hi;
};

template <size_t N>
bool in_ranges(const Range (&r)[N], uint32_t cp) {
    if constexpr (N > 8) {  // sorted, disjoint: binary search
        size_t lo = 0, hi = N;
        while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            if (cp < r[mid].lo) {
                hi = mid;
            } else if (cp > r[mid].hi) {
                lo = mid + 1;
            } else {
                return true;
            }
        }
        return false;
    } else {
        for (const Range& x : r) {
            if (cp >= x.lo && cp <= x.hi) return true;
        }
        return false;
    }
}

// DeepSeek LLM's letter class (sorted): [A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-Ⴥ...] as codepoints.
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// [!-/:-~！-／：-～‘-‟　-。]
constexpr Range kDeepseekPunct[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
                                    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
// [一-龥ࠀ-一가-퟿]
constexpr Range kCjk[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};

// Literal classes run on text where non-ASCII whitespace reads as U+000B (llama.cpp's wregex path).
template <size_t N>
bool in_literal_class(const Ctx& x, size_t i, const Range (&r)[N]) {
    return !(x.f[i] & kWhitespace) && in_ranges(r, x.c[i]);
}

// \s?C+ where C is a class predicate.
template <class Pred>
size_t opt_space_then_run(const Ctx& x, size_t pos, size_t end, Pred in_class) {
    size_t p = pos;
    if ((x.f[pos] & kWhitespace) && pos + 1 < end && in_class(pos + 1)) p = pos + 1;
    if (!in_class(p)) return 0;
    while (p < end && in_class(p)) ++p;
    return p - pos;
}

size_t match_rn(const Ctx& x, size_t pos, size_t) { return is_rn(x.c[pos]) ? 1 : 0; }

size_t match_number_run(const Ctx& x, size_t pos, size_t end) { return run(x, pos, end, kNumber) - pos; }

size_t match_number(const Ctx& x, size_t pos, size_t) { return (x.f[pos] & kNumber) ? 1 : 0; }

size_t match_three_digits(const Ctx& x, size_t pos, size_t end) {
    auto digit = [&](size_t i) { return i < end && x.c[i] >= '0' && x.c[i] <= '9'; };
    return digit(pos) && digit(pos + 1) && digit(pos + 2) ? 3 : 0;
}

// [\p{P}\$\+<=>\^~\|]+ and, for falcon, the same with a backtick.
template <bool kBacktick>
size_t match_punct_symbols(const Ctx& x, size_t pos, size_t end) {
    auto in_class = [&](size_t i) {
        const uint32_t c = x.c[i];
        if (c < 0x80) {
            return (x.f[i] & kPunctuation) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
                   c == '~' || c == '|' || (kBacktick && c == '`');
        }
        return (x.f[i] & kPunctuation) && !(x.f[i] & kWhitespace);
    };
    size_t p = pos;
    while (p < end && in_class(p)) ++p;
    return p - pos;
}

size_t match_ds_llm_letters(const Ctx& x, size_t pos, size_t end) {
    return opt_space_then_run(x, pos, end, [&](size_t i) { return in_literal_class(x, i, kDeepseekLetters); });
}

size_t match_ds_llm_punct(const Ctx& x, size_t pos, size_t end) {
    return opt_space_then_run(x, pos, end, [&](size_t i) { return in_literal_class(x, i, kDeepseekPunct); });
}

// \s+$
size_t match_trailing_space(const Ctx& x, size_t pos, size_t end) {
    const size_t p = run(x, pos, end, kWhitespace);
    return p > pos && p == end ? p - pos : 0;
}

size_t match_cjk(const Ctx& x, size_t pos, size_t end) {
    size_t p = pos;
    while (p < end && in_literal_class(x, p, kCjk)) ++p;
    return p - pos;
}

size_t match_space_letters(const Ctx& x, size_t pos, size_t end) {
    return opt_space_then_run(x, pos, end, [&](size_t i) { return (x.f[i] & kLetter) != 0; });
}

size_t match_space_punct(const Ctx& x, size_t pos, size_t end) {
    return opt_space_then_run(x, pos, end,
                              [&](size_t i) { return (x.f[i] & kPunctuation) && !(x.f[i] & kWhitespace); });
}

// Splits every piece of `in` (piece ends) with one regex into `out`.
void split(const Ctx& x, Matcher match, const std::vector<uint32_t>& in, std::vector<uint32_t>& out) {
    out.clear();
    size_t start = 0;
    for (uint32_t end : in) {
        size_t gap = start, p = start;
        while (p < end) {
            const size_t len = match(x, p, end);
            if (len == 0) {
                ++p;
                continue;
            }
            if (p > gap) out.push_back(uint32_t(p));
            p += len;
            out.push_back(uint32_t(p));
            gap = p;
        }
        if (gap < end) out.push_back(end);
        start = end;
    }
}

struct RuleSet {
    Matcher m[6];
    int n;
};

RuleSet rules(PreTokenizer p) {
    switch (p) {
        case PreTokenizer::kNone: return {{}, 0};
        case PreTokenizer::kGpt2: return {{match_gpt2}, 1};
        case PreTokenizer::kLlama3: return {{match_llama3}, 1};
        case PreTokenizer::kQwen2: return {{match_qwen2}, 1};
        case PreTokenizer::kDefault:
            return {{match_punct_symbols<false>, match_gpt2, match_number_run, match_three_digits}, 4};
        case PreTokenizer::kFalcon: return {{match_punct_symbols<true>, match_gpt2, match_three_digits}, 3};
        case PreTokenizer::kStarcoder: return {{match_number, match_gpt2}, 2};
        case PreTokenizer::kDeepseekLlm:
            return {{match_rn, match_ds_llm_letters, match_ds_llm_punct, match_trailing_space, match_cjk,
                     match_number_run},
                    6};
        case PreTokenizer::kDeepseekCoder:
            return {{match_rn, match_space_letters, match_space_punct, match_cjk, match_number}, 5};
    }
    return {{}, 0};
}

}  // namespace

void pre_tokenize(PreTokenizer p, std::span<const uint32_t> cps, std::vector<uint32_t>& ends,
                  std::vector<uint32_t>& scratch) {
    ends.clear();
    if (cps.empty()) return;
    const RuleSet rs = rules(p);
    ends.push_back(uint32_t(cps.size()));
    if (rs.n == 0) return;  // no splitting rules: no character classes needed
    thread_local std::vector<uint8_t> flags;
    flags.resize(cps.size());
    for (size_t i = 0; i < cps.size(); ++i) flags[i] = cp_flags(cps[i]);
    const Ctx x{cps.data(), flags.data()};
    for (int i = 0; i < rs.n; ++i) {
        split(x, rs.m[i], ends, scratch);
        ends.swap(scratch);
    }
}

}  // namespace cera
