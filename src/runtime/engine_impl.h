// Engine internals shared by engine.cpp and session.cpp, and the device-resolving model loader that
// the CLI's `logits` tool shares with Engine::load (not a public header).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cera/engine.h"
#include "chat/grammar/token_trie.h"
#include "models/lora.h"
#include "models/model.h"
#include "runtime/prefix_cache.h"
#include "tokenizer/tokenizer.h"
#include "vision/encoder.h"

namespace cera {

// An image as a session queues it: the tokens that stand for it and the embeddings of its image tokens.
struct EncodedImage {
    uint64_t hash = 0;         // of the decoded pixels and their size
    std::vector<int32_t> ids;  // <|image_start|> ... <|image_end|>
    std::vector<float> rows;   // f32 [image tokens, n_embd], in the order the image tokens come in ids
    int32_t image_token = -1;  // the id of <image>
};
// An image file's bytes -> its EncodedImage (runtime/image_input.cpp). Throws cera::Error for a bad image
// or a vocabulary without <image>.
EncodedImage encode_image(const vision::VisionEncoder& enc, const Tokenizer& tok, int64_t n_embd,
                          std::span<const uint8_t> file_bytes);
// An image file's bytes, refused (kInvalidArgument) past vision::DecodeLimits' size cap before reading.
std::vector<uint8_t> read_image_file(const std::string& path);
// The embedding runs of an image whose tokens start at index `begin` of a request's tokens.
std::vector<EmbdRun> image_runs(const EncodedImage& img, int64_t begin, int64_t n_embd);

struct Engine::Impl {
    EngineOptions options;
    EngineInfo info;
    std::unique_ptr<Model> model;               // immutable after load; shared by every session
    std::unique_ptr<Tokenizer> tokenizer;       // immutable after load
    uint64_t fingerprint = 0;                   // model_fingerprint() of the GGUF
    std::unique_ptr<PrefixCache> prefix_cache;  // null unless EngineOptions ask for one; thread-safe
    // The vision projector (EngineOptions::mmproj), or null. Declared after `model`: it goes first.
    std::unique_ptr<vision::VisionEncoder> vision;
    // Decodes, preprocesses and encodes an image file's bytes (runtime/image_input.cpp); the latest
    // few results are kept by content hash, so that a repeated image is not encoded again. Thread-safe.
    std::shared_ptr<const EncodedImage> encode_image(std::span<const uint8_t> file_bytes);
    std::mutex image_mu;
    std::vector<std::shared_ptr<const EncodedImage>> image_cache;  // most recent last
    // The vocabulary's token trie for grammars, built on first use (token_trie() is thread-safe).
    std::once_flag trie_once;
    std::shared_ptr<const grammar::TokenTrie> trie;
    const std::shared_ptr<const grammar::TokenTrie>& token_trie() {
        std::call_once(trie_once, [&] { trie = grammar::TokenTrie::from_tokenizer(*tokenizer); });
        return trie;
    }
    StateIdentity state_identity() const {
        return {fingerprint, kv_state_code(options.kv_type_k, options.kv_type_v), info.n_vocab};
    }

    // LoRA: the default adapters (EngineOptions::lora) and the named ones, guarded by lora_mu.
    struct NamedAdapter {
        std::shared_ptr<const LoraAdapter> adapter;
        std::string path;
        float scale = 1.0f;
    };
    LoraSet default_lora;  // fixed at load
    mutable std::mutex lora_mu;
    std::map<std::string, NamedAdapter> adapters;
    // The adapters GenerateOptions::adapter names: "" the defaults, "base" none, else a named one
    // (kMissing when absent). The set holds the adapters alive while it is used.
    LoraSet resolve_lora(const std::string& name) const;
    void warm_up();  // EngineOptions::warmup
};

// Parses "auto", "cpu", "cuda", "cuda:N", or a list "cuda:N,cuda:M,..." of a tensor-parallel model's
// ranks' devices. Throws kInvalidArgument on anything else.
struct DeviceChoice {
    bool automatic = false;
    DeviceKind kind = DeviceKind::kCpu;
    int gpu_index = 0;
    std::vector<int> gpu_ranks;  // a list's devices, in rank order (empty for one device)
};
DeviceChoice parse_device(const std::string& device);

// Checks the options, resolves the device ("auto": a usable CUDA GPU, else the CPU) and loads the
// model there. Engine::load uses it, and so do the tools that run the model itself (`cera logits`).
// Throws cera::Error (kInvalidArgument for bad options, kDevice, and whatever load_model throws).
std::unique_ptr<Model> load_engine_model(const std::string& path, const EngineOptions& options);

}  // namespace cera
