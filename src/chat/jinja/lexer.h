// Jinja lexer: splits a template into text and the tokens of `{{ ... }}` and
// `{% ... %}` tags, dropping `{# ... #}` comments and applying whitespace
// control (`{%-`, `-%}`, `{{-`, `-}}`, `{%+`, `+%}`) and the trim_blocks /
// lstrip_blocks options. Like Jinja, one trailing newline of the template is
// dropped and "\r\n" / "\r" line endings become "\n". `{% raw %}` bodies come
// out as text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cera::jinja {

enum class TokenKind {
    kText,        // literal template text
    kExprOpen,    // {{
    kExprClose,   // }}
    kBlockOpen,   // {%
    kBlockClose,  // %}
    kName,        // identifier or keyword
    kString,      // string literal, unescaped
    kInt,
    kFloat,
    kOperator,    // punctuation: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
    kEnd,         // end of template
};

struct Token {
    TokenKind kind = TokenKind::kEnd;
    std::string text;  // text, name, string value or operator
    int64_t int_value = 0;
    double float_value = 0;
    int line = 1;
    int column = 1;
};

struct LexOptions {
    bool trim_blocks = true;    // drop the first newline after a block or comment tag
    bool lstrip_blocks = true;  // drop spaces and tabs before a block or comment tag that starts a line
};

// Tokenizes `source`; throws cera::Error (kParse) naming the line and column of bad input.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

}  // namespace cera::jinja
