// The structured-output flags of `cera run` and `cera chat`: --grammar, --grammar-file, --json,
// --json-schema (at most one of them).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cera/grammar.h"

namespace cera::cli {

struct GrammarFlags {
    std::string grammar, grammar_file, json_schema;  // json_schema: its text or a file's path (json_object_arg)
    bool json = false;

    void add(CLI::App& app);
    // The grammar the flags ask for, or null. Throws cera::Error for an unreadable file or a grammar or
    // schema that does not parse.
    std::shared_ptr<const Grammar> build() const;
};

// A whole file as bytes. Throws cera::Error (kIo).
std::string read_file_text(const std::string& path);

// A JSON object given on the command line (a JSON Schema, bench-serve's --extra-body): the argument
// itself when it starts with '{' (after whitespace), as llama.cpp's --json-schema takes it, else the
// text of the file it names.
std::string json_object_arg(const std::string& arg);

}  // namespace cera::cli
