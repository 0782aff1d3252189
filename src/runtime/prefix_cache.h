// Prefix cache: saved session states keyed by their exact token sequence, so that a new
// prompt sharing a prefix with an earlier one restores the state at that prefix and
// prefills only the rest. For LFM2 the conv state is part of each entry, which is why
// entries exist only at the boundaries where a state was saved (the end of a prompt and
// the n_batch-aligned chunk boundaries of its prefill).
//
// Two tiers:
//   warm: in memory, least recently used first out, bounded in bytes;
//   cold: files in <dir>/<namespace>/, bounded in bytes (oldest modification time out).
// The namespace is a hash of the model fingerprint, the device kind and the KV type: states
// of another model, device or KV type are never seen. Each file is one encode_state() blob
// (header and payload checksummed), written to a temp file and renamed into place; a file that
// fails to decode (torn, truncated, corrupt) is removed and never loaded. Leftover temp files of
// killed writers never match the entry names and are removed once stale.
// Thread-safety: every member may be called from any thread (one mutex for the warm tier; disk
// writes are atomic renames).
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/state_io.h"

namespace cera {

struct PrefixCacheConfig {
    size_t max_bytes = 0;            // warm tier bound; 0 = no memory tier
    std::string dir;                 // cold tier root; "" = no disk tier
    uint64_t max_disk_bytes = 0;     // cold tier bound; 0 = kDefaultDiskBytes
    std::string device = "cpu";      // device kind, part of the namespace
    static constexpr uint64_t kDefaultDiskBytes = uint64_t(4) << 30;
};

struct PrefixCacheCounters {
    uint64_t hits_memory = 0, hits_disk = 0, misses = 0;
    uint64_t stores = 0;           // entries added (either tier)
    uint64_t evictions = 0;        // warm entries evicted by the byte bound
    uint64_t disk_evictions = 0;   // files removed by the disk bound
    uint64_t dropped_corrupt = 0;  // files that failed to decode and were removed
    uint64_t memory_entries = 0, memory_bytes = 0;
};

class PrefixCache {
   public:
    // Creates <dir>/<namespace>/ when a disk tier is configured. Throws kIo when it cannot.
    PrefixCache(const PrefixCacheConfig& config, const StateIdentity& identity);

    enum class Tier { kMemory, kDisk };
    struct Hit {
        SessionSnapshot snapshot;  // tokens == the matched prefix, all evaluated
        Tier tier = Tier::kMemory;
    };
    // The longest entry whose tokens are a prefix of `tokens` and longer than min_len tokens,
    // warm tier first. Counts a hit or a miss.
    std::optional<Hit> lookup(std::span<const int32_t> tokens, size_t min_len);
    // Whether an entry for exactly these tokens exists (in either tier).
    bool contains(std::span<const int32_t> tokens);
    // Adds a snapshot whose tokens are all evaluated (both tiers); replaces nothing that exists.
    // Disk write failures are ignored (the cache is an optimisation).
    void store(const SessionSnapshot& snapshot);

    PrefixCacheCounters counters() const;
    // The cold tier's directory for this namespace ("" without a disk tier).
    const std::string& directory() const { return ns_dir_; }
    // The file name an entry for these tokens has in directory().
    std::string entry_file(std::span<const int32_t> tokens) const;

   private:
    struct Entry {
        std::vector<uint8_t> blob;  // encode_state()
        size_t n_tokens = 0;
        std::list<uint64_t>::iterator lru;
    };
    struct DiskEntry {
        size_t n_tokens = 0;
        uint64_t key = 0;
        std::string path;
    };

    uint64_t key_of(std::span<const int32_t> tokens) const;
    std::vector<DiskEntry> scan_disk();
    void insert_warm(uint64_t key, size_t n_tokens, std::vector<uint8_t> blob);  // holds mu_
    void enforce_disk_bound();
    bool matches(const SessionSnapshot& s, std::span<const int32_t> tokens) const;

    PrefixCacheConfig config_;
    StateIdentity identity_;
    uint64_t ns_ = 0;
    std::string ns_dir_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, Entry> warm_;
    std::list<uint64_t> lru_;  // front = most recent
    std::unordered_map<size_t, size_t> warm_lengths_;  // n_tokens -> entries of that length
    size_t warm_bytes_ = 0;
    PrefixCacheCounters counters_;
};

}  // namespace cera
