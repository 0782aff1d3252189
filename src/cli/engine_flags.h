// The flags of the commands that load a model for inference (run, chat, embed, bench): the device,
// CPU threads, context length, KV cache type and prefix cache, each registered with one help text
// and checked in one place.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "cera/engine.h"

namespace cera::cli {

struct EngineFlags {
    std::string device = "auto";
    int threads = 0;
    int32_t n_ctx = 0;
    std::string kv_type = "f32";
    std::string cache_dir;  // --prompt-cache
    double cache_mib = 0;   // --cache-mib

    // Which flags a command takes besides -t/--threads and --device.
    enum Parts : unsigned { kCtx = 1, kKvType = 2, kPrefixCache = 4 };
    void add(CLI::App& app, unsigned parts);
    // The engine options, after checking the values: a bad one throws Error(kInvalidArgument) with a
    // one-line message naming the flag.
    EngineOptions options() const;
};

}  // namespace cera::cli
