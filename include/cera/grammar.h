// cera::Grammar: a constraint on generated text (structured output).
//
//   auto g = cera::Grammar::parse(R"(root ::= "yes" | "no")");         // GBNF, as llama.cpp writes it
//   auto j = cera::Grammar::from_json_schema(R"({"type": "object", "properties": {"n": {"type": "integer"}}})");
//   cera::GenerateOptions o;  o.grammar = j;                          // the output always parses
//
// Generation under a grammar masks the sampler's candidates at every step to the tokens whose bytes
// keep the text in the grammar's language, and allows end-of-generation only when the text is a
// whole match (and nothing else once nothing may follow). See docs/grammar.md for the syntax, the
// JSON Schema subset and the regular-expression subset of `pattern`.
//
// A Grammar is immutable and thread-safe; share one among sessions and requests (the per-vocabulary
// tables it builds on first use are shared too).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cera {

class Grammar {
 public:
    // Parses GBNF text; `root` names the start rule. Throws cera::Error (kParse) naming the line, and
    // the rule for an undefined reference or left recursion.
    static std::shared_ptr<const Grammar> parse(std::string_view gbnf, std::string_view root = "root");
    // A grammar for JSON text that a JSON Schema (the subset in docs/grammar.md) accepts. Throws
    // cera::Error: kParse for text that is not JSON, kUnsupported for a keyword outside the subset,
    // kInvalidArgument for a schema that contradicts itself.
    static std::shared_ptr<const Grammar> from_json_schema(std::string_view schema_json);
    // JSON mode: any JSON object (any_value: any JSON value).
    static std::shared_ptr<const Grammar> json(bool any_value = false);
    // A lazy grammar: generation is free until the text contains `trigger`; from the trigger's first
    // byte on, the text must match the GBNF (which starts with the trigger). Tool calls with
    // tool_choice "auto" use it: free text, then a call that parses. Throws as parse() does, and
    // kInvalidArgument for an empty trigger.
    static std::shared_ptr<const Grammar> lazy(std::string_view gbnf, std::string_view trigger);
    // The GBNF of a JSON Schema (what from_json_schema parses).
    static std::string json_schema_to_gbnf(std::string_view schema_json);

    // The grammar as GBNF text.
    const std::string& gbnf() const;
    // A lazy grammar's trigger; empty for a grammar that applies from the first byte.
    const std::string& trigger() const;
    // Matches a whole text: -1 when it is in the language; otherwise the byte offset where matching
    // stops (text.size() when the text is a proper prefix of something in the language). A lazy
    // grammar matches the text from its trigger's first occurrence (a text without it is in).
    int64_t match(std::string_view text) const;

    struct Impl;
    const Impl& impl() const { return *impl_; }
    explicit Grammar(std::unique_ptr<Impl> impl);
    ~Grammar();

 private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace cera
