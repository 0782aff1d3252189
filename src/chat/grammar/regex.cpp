// The regular-expression subset of JSON Schema's `pattern`, translated to a GBNF expression:
// literals, escapes (\d \w \s \D \W \S \t \n \r \f \v \xNN \uNNNN and escaped punctuation), classes
// with ranges and negation, `.`, groups `( )` and `(?: )`, `|`, and the quantifiers * + ? {m} {m,}
// {m,n} (a lazy `?` after them changes nothing for generation). `^` and `$` only at the ends.
#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "chat/grammar/json_schema.h"
#include "core/check.h"

namespace cera::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// A code point as a GBNF class item.
std::string class_char(uint32_t cp) {
    char buf[16];
    if (cp == '\\' || cp == ']' || cp == '[' || cp == '^' || cp == '-' || cp == '"') {
        std::snprintf(buf, sizeof buf, "\\%c", char(cp));
    } else if (cp < 0x20 || cp == 0x7F) {
        std::snprintf(buf, sizeof buf, "\\x%02X", cp);
    } else if (cp < 0x80) {
        buf[0] = char(cp), buf[1] = 0;
    } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04X", cp);
    } else {
        std::snprintf(buf, sizeof buf, "\\U%08X", cp);
    }
    return buf;
}

// Ranges minus what a JSON string cannot hold unescaped ('"', '\', controls), as a GBNF expression;
// '"' and '\' come back as their escapes.
std::string json_class(Ranges r) {
    bool quote = false, backslash = false;
    Ranges out;
    for (auto [a, b] : r) {
        if (a <= '"' && '"' <= b) quote = true;
        if (a <= '\\' && '\\' <= b) backslash = true;
        auto add = [&](uint32_t x, uint32_t y) {
            if (x <= y) out.push_back({x, y});
        };
        // cut out [0, 0x1F], '"' and '\'
        if (b < 0x20) continue;
        a = std::max<uint32_t>(a, 0x20);
        for (uint32_t cut : {uint32_t('"'), uint32_t('\\')}) {
            if (a <= cut && cut <= b) {
                add(a, cut - 1);
                a = cut + 1;
            }
        }
        add(a, b);
    }
    std::vector<std::string> alts;
    if (!out.empty()) {
        std::string c = "[";
        for (auto [a, b] : out) c += a == b ? class_char(a) : class_char(a) + "-" + class_char(b);
        alts.push_back(c + "]");
    }
    if (quote) alts.push_back("\"\\\\\\\"\"");
    if (backslash) alts.push_back("\"\\\\\\\\\"");
    if (alts.empty()) throw_error(ErrorCode::kUnsupported, "pattern: a class with no character a JSON string can hold");
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
    return s + ")";
}

Ranges negate(const Ranges& in) {
    Ranges sorted = in;
    std::sort(sorted.begin(), sorted.end());
    Ranges out;
    uint32_t next = 0;
    for (auto [a, b] : sorted) {
        if (a > next) out.push_back({next, a - 1});
        next = std::max(next, b + 1);
    }
    if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
    return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's \s: its WhiteSpace and LineTerminator code points.
const Ranges kSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

class Regex {
 public:
    explicit Regex(std::string_view p) : s_(p) {}

    std::string run() {
        bool head = false, tail = false;
        if (!s_.empty() && s_[0] == '^') head = true, ++pos_;
        std::string body = alternation(0);
        if (pos_ < s_.size() && s_[pos_] == '$') tail = true, ++pos_;
        if (pos_ != s_.size()) fail("unexpected '%c'", s_[pos_]);
        const std::string any = json_class({{0, 0x10FFFF}}) + "*";
        return (head ? "" : any + " ") + "(" + body + ")" + (tail ? "" : " " + any);
    }

 private:
    [[noreturn]] void fail(const char* what, char c = 0) const {
        char msg[128];
        std::snprintf(msg, sizeof msg, what, c);
        throw_error(ErrorCode::kParse, "pattern /%.*s/: %s at offset %zu", int(s_.size()), s_.data(), msg, pos_);
    }
    [[noreturn]] void unsupported(const char* what) const {
        throw_error(ErrorCode::kUnsupported, "pattern /%.*s/: %s (offset %zu) is outside the supported subset",
                    int(s_.size()), s_.data(), what, pos_);
    }
    bool more() const { return pos_ < s_.size(); }
    char peek() const { return more() ? s_[pos_] : '\0'; }

    std::string alternation(int depth) {
        if (depth > 100) fail("groups nested too deeply");
        std::string out = sequence(depth);
        while (peek() == '|') {
            ++pos_;
            out += " | " + sequence(depth);
        }
        return out;
    }

    std::string sequence(int depth) {
        std::string out;
        while (more() && peek() != '|' && peek() != ')') {
            if (peek() == '$' && pos_ + 1 == s_.size()) break;
            std::string atom = this->atom(depth);
            atom += quantifier();
            out += (out.empty() ? "" : " ") + atom;
        }
        return out.empty() ? "\"\"" : out;
    }

    std::string quantifier() {
        std::string q;
        const char c = peek();
        if (c == '*' || c == '+' || c == '?') {
            ++pos_;
            q = std::string(1, c);
        } else if (c == '{') {
            const size_t close = s_.find('}', pos_);
            if (close == std::string_view::npos) fail("unterminated '{'");
            const std::string inner(s_.substr(pos_ + 1, close - pos_ - 1));
            for (char d : inner)
                if (!(d == ',' || (d >= '0' && d <= '9'))) fail("a bad repetition");
            if (inner.empty() || inner[0] == ',') fail("a bad repetition");
            const size_t comma = inner.find(',');
            auto number = [](std::string d) {  // digits without leading zeros, compared by length then text
                d.erase(0, std::min(d.find_first_not_of('0'), d.size()));
                return std::make_pair(d.size(), d);
            };
            if (comma != std::string::npos && comma + 1 < inner.size() &&
                number(inner.substr(comma + 1)) < number(inner.substr(0, comma)))
                fail("a repetition {m,n} with n < m");
            q = "{" + inner + "}";
            pos_ = close + 1;
        } else {
            return "";
        }
        if (peek() == '?') ++pos_;  // lazy: the same set of strings
        if (peek() == '*' || peek() == '+' || peek() == '{') fail("a quantifier after a quantifier");
        return q;
    }

    uint32_t hex(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            const char c = peek();
            const int d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
            if (d < 0) fail("a bad hex escape");
            v = v * 16 + uint32_t(d);
            ++pos_;
        }
        return v;
    }

    uint32_t utf8() {
        const unsigned char c = static_cast<unsigned char>(s_[pos_]);
        const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || pos_ + size_t(n) > s_.size()) fail("invalid UTF-8");
        uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < n; ++i) cp = cp << 6 | (static_cast<unsigned char>(s_[pos_ + size_t(i)]) & 0x3F);
        pos_ += size_t(n);
        return cp;
    }

    // After a backslash: a class escape fills `set` and returns true; otherwise the code point in cp.
    bool escape(Ranges& set, uint32_t& cp) {
        if (!more()) fail("a trailing backslash");
        const char e = s_[pos_++];
        switch (e) {
            case 'd':
                set = kDigit;
                return true;
            case 'D':
                set = negate(kDigit);
                return true;
            case 'w':
                set = kWord;
                return true;
            case 'W':
                set = negate(kWord);
                return true;
            case 's':
                set = kSpace;
                return true;
            case 'S':
                set = negate(kSpace);
                return true;
            case 't':
                cp = '\t';
                return false;
            case 'n':
                cp = '\n';
                return false;
            case 'r':
                cp = '\r';
                return false;
            case 'f':
                cp = '\f';
                return false;
            case 'v':
                cp = '\v';
                return false;
            case 'x':
                cp = hex(2);
                return false;
            case 'u':
                cp = hex(4);
                return false;
            case 'b':
            case 'B':
                unsupported("a word boundary");
            default:
                if ((e >= '0' && e <= '9')) unsupported("a back-reference");
                if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) unsupported("this escape");
                cp = uint32_t(static_cast<unsigned char>(e));
                return false;
        }
    }

    std::string atom(int depth) {
        const char c = peek();
        if (c == '(') {
            ++pos_;
            if (peek() == '?') {
                if (s_.substr(pos_, 2) == "?:")
                    pos_ += 2;
                else if (s_.substr(pos_, 2) == "?<" && pos_ + 2 < s_.size() && s_[pos_ + 2] != '=' &&
                         s_[pos_ + 2] != '!')
                    pos_ = s_.find('>', pos_) == std::string_view::npos ? s_.size() : s_.find('>', pos_) + 1;
                else
                    unsupported("look-around or a group flag");
            }
            std::string inner = alternation(depth + 1);
            if (peek() != ')') fail("expecting ')'");
            ++pos_;
            return "(" + inner + ")";
        }
        if (c == '[') return char_class();
        if (c == '.') {
            ++pos_;
            // Anything but ECMAScript's line terminators: \n, \r, U+2028, U+2029.
            return json_class({{0, '\n' - 1}, {'\n' + 1, '\r' - 1}, {'\r' + 1, 0x2027}, {0x202A, 0x10FFFF}});
        }
        if (c == '*' || c == '+' || c == '?' || c == '{') fail("'%c' follows nothing", c);
        if (c == '^' || c == '$') unsupported("an anchor inside the pattern");
        Ranges set;
        uint32_t cp;
        if (c == '\\') {
            ++pos_;
            if (escape(set, cp)) return json_class(set);
        } else {
            cp = utf8();
        }
        return json_class({{cp, cp}});
    }

    std::string char_class() {
        ++pos_;
        bool neg = false;
        if (peek() == '^') neg = true, ++pos_;
        Ranges set;
        bool first = true;
        while (more() && (peek() != ']' || first)) {
            first = false;
            Ranges esc;
            uint32_t a;
            if (peek() == '\\') {
                ++pos_;
                if (escape(esc, a)) {
                    set.insert(set.end(), esc.begin(), esc.end());
                    continue;
                }
            } else {
                a = utf8();
            }
            uint32_t b = a;
            if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
                ++pos_;
                if (peek() == '\\') {
                    ++pos_;
                    if (escape(esc, b)) fail("a class escape as a range end");
                } else {
                    b = utf8();
                }
                if (b < a) fail("a range out of order");
            }
            set.push_back({a, b});
        }
        if (!more()) fail("unterminated '['");
        ++pos_;
        return json_class(neg ? negate(set) : set);
    }

    std::string_view s_;
    size_t pos_ = 0;
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern) { return Regex(pattern).run(); }

}  // namespace cera::grammar
