// Engine internals shared by engine.cpp and session.cpp (not a public header).
#pragma once
#include <memory>

#include "cera/engine.h"
#include "models/model.h"
#include "runtime/prefix_cache.h"
#include "tokenizer/tokenizer.h"

namespace cera {

struct Engine::Impl {
    EngineOptions options;
    EngineInfo info;
    std::unique_ptr<Model> model;          // immutable after load; shared by every session
    std::unique_ptr<Tokenizer> tokenizer;  // immutable after load
    uint64_t fingerprint = 0;              // model_fingerprint() of the GGUF
    std::unique_ptr<PrefixCache> prefix_cache;  // null unless EngineOptions ask for one; thread-safe
    StateIdentity state_identity() const {
        return {fingerprint, options.kv_type == KvCacheType::kF16 ? 1u : 0u, info.n_vocab};
    }
};

// Parses "auto", "cpu", "cuda", "cuda:N". Throws kInvalidArgument on anything else.
struct DeviceChoice {
    bool automatic = false;
    DeviceKind kind = DeviceKind::kCpu;
    int gpu_index = 0;
};
DeviceChoice parse_device(const std::string& device);

}  // namespace cera
