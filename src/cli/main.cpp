// `cera`: dispatches to the subcommands registered in this directory.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"

namespace cera::cli {

static std::vector<Command>& registry() {
    static std::vector<Command> r;
    return r;
}

const std::vector<Command>& commands() { return registry(); }

CommandRegistrar::CommandRegistrar(Command c) { registry().push_back(c); }

}  // namespace cera::cli

namespace {

void print_usage() {
    std::printf("usage: cera <command> [options]\n\ncommands:\n");
    std::vector<cera::cli::Command> cmds = cera::cli::commands();
    std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return std::strcmp(a.name, b.name) < 0; });
    for (const auto& c : cmds) std::printf("  %-12s %s\n", c.name, c.summary);
    std::printf("\nRun `cera <command> --help` for the options of a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
        print_usage();
        return argc < 2 ? 1 : 0;
    }
    const std::string name = argv[1];
    for (const auto& c : cera::cli::commands()) {
        if (name != c.name) continue;
        std::vector<std::string> args(argv + 2, argv + argc);
        try {
            return c.run(args);
        } catch (const cera::Error& e) {
            std::fprintf(stderr, "cera %s: error: %s\n", c.name, e.what());
            return 1;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "cera %s: error: out of memory\n", c.name);
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "cera %s: error: %s\n", c.name, e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "cera: error: unknown command '%s' (see `cera --help`)\n", name.c_str());
    return 2;
}
