#include "cli/parse_args.h"

#include <cstdio>

namespace cera::cli {

int parse_args(CLI::App& app, const std::vector<std::string>& args, const char* command,
               const std::function<void()>& validate) {
    std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes the arguments in reverse
    try {
        app.parse(rev);
        if (validate) validate();
    } catch (const CLI::CallForHelp&) {
        std::printf("%s", app.help().c_str());
        return 0;
    } catch (const CLI::ParseError& e) {
        std::string msg = e.what();
        for (char& c : msg)
            if (c == '\n') c = ' ';
        std::fprintf(stderr, "cera %s: error: %s (see `cera %s --help`)\n", command, msg.c_str(), command);
        return 2;
    }
    return -1;
}

}  // namespace cera::cli
