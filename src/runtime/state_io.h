// Saved session states: the byte format shared by Session::save_state / load_state and the
// prefix cache, a 64-bit checksum, the model fingerprint, and atomic file writes.
//
// Layout (little-endian): StateHeader, then tokens i32[n_tokens], logits f32[n_vocab] (when
// has_logits), then the model state bytes (ModelState::save_state: KV rows, conv states).
// The header carries a checksum of itself and of the payload, so a torn or corrupt file is
// rejected, never loaded.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cera/engine.h"

namespace cera {

namespace gguf {
class File;
}

// xxHash64-style hash of a byte range (4 lanes, multiply-rotate rounds, avalanche). Thread-safe.
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0);

// Identity of a GGUF model: its size, header (metadata and tensor table) and samples of every
// tensor's data. Equal files give equal fingerprints. Thread-safe.
uint64_t model_fingerprint(const gguf::File& file);

// What a saved state must match to load.
struct StateIdentity {
    uint64_t fingerprint = 0;  // model_fingerprint()
    uint32_t kv_type = 0;      // kv_state_code() of the key and value types

    int32_t n_vocab = 0;
};

// The KV cache types of a state in one number: the KvCacheType when keys and values have the same (so
// 0 = F32, 1 = F16, as before separate types), else 256 + 16 k + v. kv_state_name() spells it.
uint32_t kv_state_code(KvCacheType k, KvCacheType v);
std::string kv_state_name(uint32_t code);

// The contents of a session: its tokens (the first n_evaluated are in the model state), the
// logits after the last evaluated token, and the model state bytes.
struct SessionSnapshot {
    std::vector<int32_t> tokens;
    int32_t n_evaluated = 0;
    std::vector<float> logits;         // [n_vocab], or empty when there are none
    std::vector<uint8_t> model_state;  // ModelState::save_state()
};

// Serializes a snapshot with its identity into `out` (replaced). Thread-safe.
void encode_state(const StateIdentity& id, const SessionSnapshot& snap, std::vector<uint8_t>& out);
// Checks and parses a saved state. Throws kInvalidFile for bad magic/version, a torn or corrupt
// payload (checksum), or a state made by another model or with another KV type, with a message
// naming the mismatch. Thread-safe.
SessionSnapshot decode_state(std::span<const uint8_t> bytes, const StateIdentity& expect);

// Writes `bytes` to `path` atomically: a temp file next to it (fsync'd when durable), then a rename,
// so readers see the old file or the whole new one. Throws kIo (the temp file is removed).
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, bool durable = true);
// Reads a whole file. Throws kIo.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace cera
