// `cera grammar check GRAMMAR_FILE [--text T | --text-file F]`, `cera grammar check --schema SCHEMA ...`
// and `cera grammar from-schema SCHEMA`: validate grammars and schemas, match texts, print the
// grammar of a schema.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cera/grammar.h"
#include "cli/command.h"
#include "cli/grammar_flags.h"
#include "cli/parse_args.h"

namespace cera::cli {
namespace {

// The text around a byte offset, escaped for one line.
std::string around(const std::string& text, size_t at) {
    const size_t from = at > 20 ? at - 20 : 0;
    std::string out;
    for (size_t i = from; i < std::min(text.size(), at + 20); ++i) {
        if (i == at) out += "\xe2\x96\xb6";  // a marker where matching stops
        const unsigned char c = static_cast<unsigned char>(text[i]);
        if (c == '\n')
            out += "\\n";
        else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else
            out += char(c);
    }
    if (at >= text.size()) out += "\xe2\x96\xb6";
    return out;
}

int run_grammar(const std::vector<std::string>& args) {
    CLI::App app{"Grammars and JSON Schemas for structured output.", "cera grammar"};
    app.require_subcommand(1);
    std::string file, schema, text, text_file, schema_out;
    auto* check =
        app.add_subcommand("check",
                           "validate a GBNF grammar (exit 0, or 2 with the error); with --text or --text-file, "
                           "say whether the whole text is in its language (exit 0 if it is, 1 if not)");
    check->add_option("GRAMMAR_FILE", file, "GBNF grammar file");
    check->add_option("--schema", schema, "a JSON Schema (its text or a file) in place of the grammar file");
    auto* t = check->add_option("--text", text, "the text to match");
    auto* tf = check->add_option("--text-file", text_file, "a file whose bytes are the text to match");
    t->excludes(tf);
    auto* from = app.add_subcommand("from-schema", "print the GBNF grammar of a JSON Schema");
    from->add_option("SCHEMA", schema_out, "a JSON Schema: its text (starting with '{') or a file holding it")
        ->required();
    auto validate = [&] {
        if (check->parsed() && file.empty() == schema.empty())
            throw CLI::ValidationError("give a GRAMMAR_FILE or --schema SCHEMA (one of them)");
    };
    if (int rc = parse_args(app, args, "grammar", validate); rc >= 0) return rc;

    if (from->parsed()) {
        std::fputs(Grammar::json_schema_to_gbnf(json_object_arg(schema_out)).c_str(), stdout);
        return 0;
    }
    std::shared_ptr<const Grammar> g;
    try {
        g = schema.empty() ? Grammar::parse(read_file_text(file)) : Grammar::from_json_schema(json_object_arg(schema));
    } catch (const Error& e) {
        std::fprintf(stderr, "cera grammar: error: %s\n", e.what());
        return 2;
    }
    if (t->count() == 0 && tf->count() == 0) {
        std::printf("valid\n");
        return 0;
    }
    if (!text_file.empty()) text = read_file_text(text_file);
    const int64_t stop = g->match(text);
    if (stop < 0) {
        std::printf("match\n");
        return 0;
    }
    if (size_t(stop) == text.size())
        std::printf("no match: the text ends at byte %lld before the grammar is complete: %s\n", (long long)stop,
                    around(text, size_t(stop)).c_str());
    else
        std::printf("no match: matching stops at byte %lld: %s\n", (long long)stop, around(text, size_t(stop)).c_str());
    return 1;
}

}  // namespace

CERA_CLI_COMMAND(grammar, "grammar", "check grammars and JSON Schemas, match texts, convert schemas", run_grammar);

}  // namespace cera::cli
