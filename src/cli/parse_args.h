// Parsing a subcommand's flags with CLI11, the same way for every command.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace cera::cli {

// Parses `args` into `app`, then runs `validate` (which may throw CLI::ParseError for a bad
// combination of flags). Returns -1 to go on; otherwise the exit code to return: 0 after
// printing --help, 2 after one stderr line "cera COMMAND: error: ... (see `cera COMMAND --help`)".
int parse_args(CLI::App& app, const std::vector<std::string>& args, const char* command,
               const std::function<void()>& validate = {});

}  // namespace cera::cli
