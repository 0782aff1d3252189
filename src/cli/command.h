// The `cera` command's subcommands register themselves here, one file each.
#pragma once
#include <string>
#include <vector>

namespace cera::cli {

// Runs a subcommand. args excludes "cera" and the subcommand name. Returns the exit code.
// Errors may be thrown as cera::Error; main prints them as one line and exits 1.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
    const char* name;
    const char* summary;  // one line for `cera --help`
    CommandFn run;
};

const std::vector<Command>& commands();

struct CommandRegistrar {
    explicit CommandRegistrar(Command c);
};

#define CERA_CLI_COMMAND(ident, name, summary, fn) \
    static ::cera::cli::CommandRegistrar cera_cli_registrar_##ident({name, summary, fn})

}  // namespace cera::cli
