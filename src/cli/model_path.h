// Where the `cera` subcommands find the bundled default model when no -m is given.
#pragma once
#include <string>

namespace cera::cli {

// The bundled models/tiny-lfm2-Q8_0.gguf: $CERA_MODEL_DIR, the source tree next to a build tree
// (<exe>/../../models) or an install prefix (<exe>/../share/cera/models). Throws cera::Error (kIo)
// naming the places it looked. Thread-safe.
std::string find_default_model();

}  // namespace cera::cli
