#include "chat/jinja/lexer.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "chat/jinja/text.h"
#include "core/check.h"
#include "tokenizer/unicode.h"

namespace cera::jinja {

namespace {

constexpr size_t kMaxSource = 4u << 20;  // a chat template over 4 MiB is refused

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
   public:
    Lexer(std::string src, const LexOptions& options) : src_(std::move(src)), options_(options) {}

    std::vector<Token> run() {
        while (pos_ < src_.size()) {
            size_t open = find_tag_open(pos_);
            size_t text_end = open == std::string::npos ? src_.size() : open;
            if (text_end > pos_ || open == std::string::npos) emit_text(pos_, text_end, open);
            if (open == std::string::npos) break;
            lex_tag(open);
        }
        Token end;
        end.kind = TokenKind::kEnd;
        set_pos(end, src_.size());
        tokens_.push_back(end);
        return std::move(tokens_);
    }

   private:
    std::string src_;
    LexOptions options_;
    size_t pos_ = 0;
    std::vector<Token> tokens_;
    size_t line_cache_pos_ = 0;
    int line_cache_line_ = 1;
    size_t line_cache_line_start_ = 0;

    [[noreturn]] void fail(size_t at, const char* what) {
        int line = 0, col = 0;
        line_col(at, line, col);
        throw_error(ErrorCode::kParse, "chat template: line %d, column %d: %s", line, col, what);
    }

    void line_col(size_t at, int& line, int& col) {
        if (at < line_cache_pos_) {
            line_cache_pos_ = 0;
            line_cache_line_ = 1;
            line_cache_line_start_ = 0;
        }
        for (size_t i = line_cache_pos_; i < at && i < src_.size(); ++i) {
            if (src_[i] == '\n') {
                ++line_cache_line_;
                line_cache_line_start_ = i + 1;
            }
        }
        line_cache_pos_ = at;
        line = line_cache_line_;
        col = static_cast<int>(at - line_cache_line_start_) + 1;
    }

    void set_pos(Token& t, size_t at) { line_col(at, t.line, t.column); }

    size_t find_tag_open(size_t from) const {
        size_t i = from;
        while ((i = src_.find('{', i)) != std::string::npos) {
            if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
            ++i;
        }
        return std::string::npos;
    }

    // Emits src_[begin, end) as text, applying left-side whitespace control of the tag at `open` (npos: none).
    void emit_text(size_t begin, size_t end, size_t open) {
        std::string text = src_.substr(begin, end - begin);
        if (open != std::string::npos) {
            char kind = src_[open + 1];
            char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
            if (mod == '-') {
                size_t e = text.size();
                while (e > 0 && is_ws(text[e - 1])) --e;
                text.resize(e);
            } else if (mod != '+' && options_.lstrip_blocks && (kind == '%' || kind == '#')) {
                size_t nl = text.rfind('\n');
                size_t line_start = nl == std::string::npos ? 0 : nl + 1;
                bool line_starting = nl != std::string::npos || begin == 0 || src_[begin - 1] == '\n';
                bool only_blank = true;
                for (size_t i = line_start; i < text.size(); ++i)
                    if (text[i] != ' ' && text[i] != '\t') only_blank = false;
                if (line_starting && only_blank) text.resize(line_start);
            }
        }
        if (text.empty()) return;
        Token t;
        t.kind = TokenKind::kText;
        t.text = std::move(text);
        set_pos(t, begin);
        tokens_.push_back(std::move(t));
    }

    // Consumes the right side of a tag ending at `close` (index just past "}}", "%}" or "#}").
    // `minus`/`plus` say whether the closing delimiter carried '-' / '+'.
    void finish_tag(size_t close, char kind, bool minus, bool plus) {
        pos_ = close;
        if (minus) {
            while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
        } else if (!plus && options_.trim_blocks && (kind == '%' || kind == '#')) {
            if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
        }
    }

    void lex_tag(size_t open) {
        char kind = src_[open + 1];
        size_t p = open + 2;
        if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
        if (kind == '#') {
            size_t c = src_.find("#}", p);
            if (c == std::string::npos) fail(open, "unterminated comment '{#'");
            bool minus = c > p && src_[c - 1] == '-';
            bool plus = c > p && src_[c - 1] == '+';
            finish_tag(c + 2, kind, minus, plus);
            return;
        }
        Token t;
        t.kind = kind == '{' ? TokenKind::kExprOpen : TokenKind::kBlockOpen;
        set_pos(t, open);
        size_t first_token = tokens_.size();
        tokens_.push_back(t);
        int depth = 0;
        while (true) {
            while (p < src_.size() && is_ws(src_[p])) ++p;
            if (p >= src_.size()) fail(open, kind == '{' ? "unterminated '{{'" : "unterminated '{%'");
            // The closing delimiter, unless inside brackets.
            const char* close = kind == '{' ? "}}" : "%}";
            if (depth == 0) {
                bool has_mod = (src_[p] == '-' || src_[p] == '+') && src_.compare(p + 1, 2, close) == 0;
                if (has_mod || src_.compare(p, 2, close) == 0) {
                    Token c;
                    c.kind = kind == '{' ? TokenKind::kExprClose : TokenKind::kBlockClose;
                    set_pos(c, p);
                    tokens_.push_back(c);
                    bool minus = has_mod && src_[p] == '-';
                    bool plus = has_mod && src_[p] == '+';
                    finish_tag(p + (has_mod ? 3 : 2), kind, minus, plus);
                    if (kind == '%' && tokens_.size() == first_token + 3 &&
                        tokens_[first_token + 1].kind == TokenKind::kName && tokens_[first_token + 1].text == "raw") {
                        lex_raw(first_token);
                    }
                    return;
                }
            }
            p = lex_token(p, depth);
        }
    }

    // After `{% raw %}`: everything up to `{% endraw %}` is text.
    void lex_raw(size_t first_token) {
        tokens_.resize(first_token);  // the raw tag itself produces nothing
        size_t search = pos_;
        while (true) {
            size_t open = src_.find("{%", search);
            if (open == std::string::npos) fail(pos_, "unterminated '{% raw %}' (missing '{% endraw %}')");
            size_t p = open + 2;
            if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
            while (p < src_.size() && is_ws(src_[p])) ++p;
            if (src_.compare(p, 6, "endraw") != 0 || (p + 6 < src_.size() && is_name_char(src_[p + 6]))) {
                search = open + 2;
                continue;
            }
            p += 6;
            while (p < src_.size() && is_ws(src_[p])) ++p;
            bool has_mod = p < src_.size() && (src_[p] == '-' || src_[p] == '+');
            size_t q = has_mod ? p + 1 : p;
            if (src_.compare(q, 2, "%}") != 0) fail(p, "expected '%}' after 'endraw'");
            emit_text(pos_, open, open);
            finish_tag(q + 2, '%', has_mod && src_[p] == '-', has_mod && src_[p] == '+');
            return;
        }
    }

    size_t lex_token(size_t p, int& depth) {
        Token t;
        set_pos(t, p);
        char c = src_[p];
        if (is_name_start(c)) {
            size_t e = p;
            while (e < src_.size() && is_name_char(src_[e])) ++e;
            t.kind = TokenKind::kName;
            t.text = src_.substr(p, e - p);
            tokens_.push_back(std::move(t));
            return e;
        }
        if (is_digit(c)) return lex_number(p, t);
        if (c == '\'' || c == '"') return lex_string(p, t);
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        for (const char* op : kOps) {
            size_t n = std::strlen(op);
            if (src_.compare(p, n, op) == 0) {
                if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
                if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
                    if (depth == 0) fail(p, "unbalanced closing bracket");
                    --depth;
                }
                t.kind = TokenKind::kOperator;
                t.text = op;
                tokens_.push_back(std::move(t));
                return p + n;
            }
        }
        char msg[64];
        std::snprintf(msg, sizeof(msg), "unexpected character '%c'", c);
        fail(p, msg);
    }

    size_t lex_number(size_t p, Token& t) {
        size_t e = p;
        std::string digits;
        bool is_float = false;
        auto take_digits = [&]() {
            while (e < src_.size() && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && is_digit(src_[e + 1])))) {
                if (src_[e] != '_') digits.push_back(src_[e]);
                ++e;
            }
        };
        take_digits();
        if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
            is_float = true;
            digits.push_back('.');
            ++e;
            take_digits();
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
            size_t q = e + 1;
            if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
            if (q < src_.size() && is_digit(src_[q])) {
                is_float = true;
                digits.push_back('e');
                digits.append(src_, e + 1, q - e - 1);
                e = q;
                take_digits();
            }
        }
        if (is_float) {
            t.kind = TokenKind::kFloat;
            t.float_value = std::strtod(digits.c_str(), nullptr);
        } else {
            t.kind = TokenKind::kInt;
            errno = 0;
            t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
            if (errno == ERANGE) fail(p, "integer literal out of range");
        }
        t.text = digits;
        tokens_.push_back(std::move(t));
        return e;
    }

    static int hex_value(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    size_t lex_string(size_t p, Token& t) {
        char quote = src_[p];
        size_t i = p + 1;
        std::string out;
        while (true) {
            if (i >= src_.size()) fail(p, "unterminated string literal");
            char c = src_[i];
            if (c == quote) break;
            if (c != '\\') {
                out.push_back(c);
                ++i;
                continue;
            }
            if (i + 1 >= src_.size()) fail(p, "unterminated string literal");
            char e = src_[i + 1];
            i += 2;
            switch (e) {
                case 'n': out.push_back('\n'); break;
                case 't': out.push_back('\t'); break;
                case 'r': out.push_back('\r'); break;
                case 'b': out.push_back('\b'); break;
                case 'f': out.push_back('\f'); break;
                case 'v': out.push_back('\v'); break;
                case 'a': out.push_back('\a'); break;
                case '0': out.push_back('\0'); break;
                case '\\': out.push_back('\\'); break;
                case '\'': out.push_back('\''); break;
                case '"': out.push_back('"'); break;
                case '\n': break;  // line continuation
                case 'x':
                case 'u':
                case 'U': {
                    int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                    uint32_t cp = 0;
                    for (int k = 0; k < n; ++k) {
                        int h = i < src_.size() ? hex_value(src_[i]) : -1;
                        if (h < 0) fail(i, "bad \\x, \\u or \\U escape in string literal");
                        cp = cp * 16 + static_cast<uint32_t>(h);
                        ++i;
                    }
                    if (cp > 0x10FFFF) fail(i, "escape beyond U+10FFFF in string literal");
                    unicode::append_utf8(out, static_cast<char32_t>(cp));
                    break;
                }
                default:
                    out.push_back('\\');
                    out.push_back(e);
            }
        }
        t.kind = TokenKind::kString;
        t.text = std::move(out);
        tokens_.push_back(std::move(t));
        return i + 1;
    }
};

// Jinja's source normalisation: newlines become "\n" and one trailing newline is dropped.
std::string normalise_source(std::string_view source) {
    std::string out;
    out.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] == '\r') {
            out.push_back('\n');
            if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        } else {
            out.push_back(source[i]);
        }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
    if (source.size() > kMaxSource) throw_error(ErrorCode::kParse, "chat template: larger than 4 MiB");
    Lexer lexer(normalise_source(source), options);
    return lexer.run();
}

}  // namespace cera::jinja
