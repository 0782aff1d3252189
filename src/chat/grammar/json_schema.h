// JSON Schema to GBNF, and the regular-expression subset of `pattern` (docs/grammar.md lists both).
#pragma once
#include <string>
#include <string_view>

namespace cera::grammar {

// The GBNF of a schema (JSON text). Throws cera::Error: kParse for bad JSON, kUnsupported for a keyword
// or value outside the subset, kInvalidArgument for a contradiction (a `false` schema, min > max, a
// $ref that points nowhere).
std::string json_schema_to_gbnf(std::string_view schema_json);

// JSON mode: any JSON object, or any JSON value.
std::string json_gbnf(bool any_value);

// A GBNF expression for the body of a JSON string (between the quotes) whose decoded text the
// regular expression matches in full (`^`/`$` at the ends are accepted; a pattern without them is
// searched, as JSON Schema does: any text may come before and after). Only characters that a JSON
// string holds unescaped are generated, except '"' and '\' written as \" and \\. Throws kUnsupported
// for constructs outside the subset (back-references, look-around, ...), kParse for a bad pattern.
std::string regex_to_gbnf(std::string_view pattern);

}  // namespace cera::grammar
