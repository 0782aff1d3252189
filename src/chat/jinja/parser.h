// Jinja parser: tokens -> statement tree, with Jinja's operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and `in`, + -, ~,
// * / // %, **, unary - +, then filters `|` and tests `is` on postfix expressions
// (attributes, subscripts, slices, calls).
#pragma once
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace cera::jinja {

// Parses a token stream from tokenize(); throws cera::Error (kParse) with the line and column,
// or "unsupported: ..." for Jinja features outside the subset.
Body parse(const std::vector<Token>& tokens);

}  // namespace cera::jinja
