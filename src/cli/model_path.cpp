// The bundled default model lookup shared by `cera run`, `cera chat` and `cera embed`.
#include "cli/model_path.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "cera/error.h"

namespace cera::cli {

namespace fs = std::filesystem;

std::string find_default_model() {
    constexpr const char* kDefaultModel = "tiny-lfm2-Q8_0.gguf";
    std::vector<fs::path> dirs;
    if (const char* env = std::getenv("CERA_MODEL_DIR"); env && *env) dirs.emplace_back(env);
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        dirs.push_back(exe.parent_path() / ".." / ".." / "models");
        dirs.push_back(exe.parent_path() / ".." / "share" / "cera" / "models");
    }
    std::string tried;
    for (const auto& d : dirs) {
        const fs::path p = d / kDefaultModel;
        if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
        tried += (tried.empty() ? "" : ", ") + d.lexically_normal().string();
    }
    throw Error(ErrorCode::kIo, std::string("no model given (-m FILE) and the default model ") + kDefaultModel +
                                    " was not found (looked in: " + (tried.empty() ? "nowhere" : tried) +
                                    "; set CERA_MODEL_DIR)");
}

}  // namespace cera::cli
