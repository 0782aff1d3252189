// The flags of every command that loads a model to run it (run, chat, embed, logits, bench): the
// device, CPU threads, context length, KV cache type, prefill chunk, prefix cache and LoRA adapters, each
// registered with one help text and checked in one place.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cera/engine.h"

namespace cera::cli {

struct EngineFlags {
    std::string device = "auto";  // a command may set another default before add()
    int threads = 0;
    int tensor_parallel = 1;  // --tensor-parallel
    bool no_warmup = false;
    int32_t n_ctx = 0;
    std::string kv_type = "f32";      // --kv-type: keys and values
    std::string kv_type_k, kv_type_v; // --cache-type-k / -v ("" = --kv-type)
    int32_t n_batch = 512;            // --batch
    std::string cache_dir;            // --prompt-cache
    double cache_mib = 0;             // --cache-mib
    std::vector<std::string> lora;    // --lora PATH[:SCALE], repeatable
    double lora_cache_mib = 0;        // --lora-cache-mib
    std::string mmproj;               // --mmproj
    std::vector<std::string> images;  // --image, repeatable
    bool no_image_split = false;      // --no-image-split

    // Which flags a command takes besides -t/--threads and --device.
    enum Parts : unsigned { kCtx = 1, kKvType = 2, kPrefixCache = 4, kBatch = 8, kLora = 16, kVision = 32 };
    void add(CLI::App& app, unsigned parts);
    // --no-image-split alone (a command that takes --mmproj without the kVision part).
    void add_image_split(CLI::App& app);
    // The engine options, after checking the values: a bad one throws Error(kInvalidArgument) with a
    // one-line message naming the flag. A bad --device is reported the same way when the model loads.
    EngineOptions options() const;
};

// "PATH[:SCALE]" -> the adapter and its scale (1 without one). A suffix after the last ':' that is not a
// number belongs to the path. Throws Error(kInvalidArgument) for a scale that is not finite.
LoraOptions parse_lora_flag(const std::string& text);

}  // namespace cera::cli
