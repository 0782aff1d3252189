#include "cli/grammar_flags.h"

#include <fstream>
#include <sstream>

#include "cera/error.h"

namespace cera::cli {

std::string read_file_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorCode::kIo, "cannot read '" + path + "'");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string json_object_arg(const std::string& arg) {
    const size_t first = arg.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && arg[first] == '{') return arg;
    return read_file_text(arg);
}

void GrammarFlags::add(CLI::App& app) {
    auto* g = app.add_option("--grammar", grammar, "constrain the output to a GBNF grammar (the text)");
    auto* gf = app.add_option("--grammar-file", grammar_file, "constrain the output to the GBNF grammar in FILE");
    auto* j = app.add_flag("--json", json, "constrain the output to a JSON object");
    auto* js = app.add_option("--json-schema", json_schema,
                              "constrain the output to JSON that a JSON Schema accepts: the schema's text "
                              "(starting with '{') or a file holding it");
    g->excludes(gf)->excludes(j)->excludes(js);
    gf->excludes(j)->excludes(js);
    j->excludes(js);
}

std::shared_ptr<const Grammar> GrammarFlags::build() const {
    if (!grammar.empty()) return Grammar::parse(grammar);
    if (!grammar_file.empty()) return Grammar::parse(read_file_text(grammar_file));
    if (json) return Grammar::json();
    if (!json_schema.empty()) return Grammar::from_json_schema(json_object_arg(json_schema));
    return nullptr;
}

}  // namespace cera::cli
