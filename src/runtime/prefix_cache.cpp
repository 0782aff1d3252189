// Prefix cache: a warm LRU map of encoded states and a cold directory of the same blobs.
#include "runtime/prefix_cache.h"

#include <sys/stat.h>
#include <utime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace cera {
namespace {

namespace fs = std::filesystem;
constexpr const char* kEntrySuffix = ".cstate";
constexpr int64_t kStaleTempSeconds = 600;  // temp files older than this belong to dead writers

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

// "<n_tokens>-<key>.cstate" -> (n_tokens, key); false for any other name.
bool parse_entry_name(const std::string& name, size_t& n_tokens, uint64_t& key) {
    const size_t suffix = std::strlen(kEntrySuffix);
    if (name.size() <= suffix || name.compare(name.size() - suffix, suffix, kEntrySuffix) != 0) return false;
    const size_t dash = name.find('-');
    if (dash == std::string::npos || dash == 0 || name.size() - suffix - dash - 1 != 16) return false;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(name.c_str(), &end, 10);
    if (end != name.c_str() + dash) return false;
    const std::string hex = name.substr(dash + 1, 16);
    const unsigned long long k = std::strtoull(hex.c_str(), &end, 16);
    if (end != hex.c_str() + 16) return false;
    n_tokens = size_t(n);
    key = uint64_t(k);
    return true;
}

size_t snapshot_bytes_hint(const SessionSnapshot& s) {
    return s.tokens.size() * 4 + s.logits.size() * 4 + s.model_state.size() + 128;
}

}  // namespace

PrefixCache::PrefixCache(const PrefixCacheConfig& config, const StateIdentity& identity)
    : config_(config), identity_(identity) {
    if (config_.max_disk_bytes == 0) config_.max_disk_bytes = PrefixCacheConfig::kDefaultDiskBytes;
    const uint64_t parts[2] = {identity.fingerprint, uint64_t(identity.kv_type)};
    ns_ = hash64(parts, sizeof parts, hash64(config_.device.data(), config_.device.size()));
    if (!config_.dir.empty()) {
        const fs::path dir = fs::path(config_.dir) / (config_.device + "-" + kv_state_name(identity.kv_type) + "-" +
                                                      hex16(ns_));
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec || !fs::is_directory(dir))
            throw_error(ErrorCode::kIo, "prefix cache: cannot create %s: %s", dir.c_str(), ec.message().c_str());
        ns_dir_ = dir.string();
    }
}

uint64_t PrefixCache::key_of(std::span<const int32_t> tokens) const {
    return hash64(tokens.data(), tokens.size() * sizeof(int32_t), ns_);
}

std::string PrefixCache::entry_file(std::span<const int32_t> tokens) const {
    if (ns_dir_.empty()) return "";
    return ns_dir_ + "/" + std::to_string(tokens.size()) + "-" + hex16(key_of(tokens)) + kEntrySuffix;
}

bool PrefixCache::matches(const SessionSnapshot& s, std::span<const int32_t> tokens) const {
    return s.tokens.size() <= tokens.size() && size_t(s.n_evaluated) == s.tokens.size() &&
           std::equal(s.tokens.begin(), s.tokens.end(), tokens.begin());
}

std::vector<PrefixCache::DiskEntry> PrefixCache::scan_disk() {
    std::vector<DiskEntry> out;
    if (ns_dir_.empty()) return out;
    std::error_code ec;
    for (fs::directory_iterator it(ns_dir_, ec), end; !ec && it != end; it.increment(ec)) {
        DiskEntry e;
        if (parse_entry_name(it->path().filename().string(), e.n_tokens, e.key)) {
            e.path = it->path().string();
            out.push_back(std::move(e));
        }
    }
    return out;
}

std::optional<PrefixCache::Hit> PrefixCache::lookup(std::span<const int32_t> tokens, size_t min_len) {
    // Warm tier: try each cached length, longest first.
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<size_t> lengths;
        for (const auto& [n, count] : warm_lengths_)
            if (count > 0 && n > min_len && n <= tokens.size()) lengths.push_back(n);
        std::sort(lengths.rbegin(), lengths.rend());
        for (size_t n : lengths) {
            const auto it = warm_.find(key_of(tokens.first(n)));
            if (it == warm_.end() || it->second.n_tokens != n) continue;
            try {
                SessionSnapshot s = decode_state(it->second.blob, identity_);
                if (!matches(s, tokens)) continue;  // a hash collision
                lru_.splice(lru_.begin(), lru_, it->second.lru);
                ++counters_.hits_memory;
                return Hit{std::move(s), Tier::kMemory};
            } catch (const Error&) {
                continue;  // cannot happen for blobs we encoded; never load it
            }
        }
    }
    // Cold tier.
    std::vector<DiskEntry> entries = scan_disk();
    std::sort(entries.begin(), entries.end(),
              [](const DiskEntry& a, const DiskEntry& b) { return a.n_tokens > b.n_tokens; });
    for (const DiskEntry& e : entries) {
        if (e.n_tokens <= min_len || e.n_tokens > tokens.size()) continue;
        if (e.key != key_of(tokens.first(e.n_tokens))) continue;
        std::vector<uint8_t> blob;
        try {
            blob = read_file_bytes(e.path);
        } catch (const Error&) {
            continue;  // removed by another process meanwhile
        }
        SessionSnapshot s;
        try {
            s = decode_state(blob, identity_);
        } catch (const Error&) {
            std::error_code ec;
            fs::remove(e.path, ec);  // torn or corrupt: drop it
            std::lock_guard<std::mutex> lock(mu_);
            ++counters_.dropped_corrupt;
            continue;
        }
        if (!matches(s, tokens) || s.tokens.size() != e.n_tokens) continue;
        ::utime(e.path.c_str(), nullptr);  // recently used: last out of the disk bound
        std::lock_guard<std::mutex> lock(mu_);
        ++counters_.hits_disk;
        insert_warm(e.key, e.n_tokens, std::move(blob));
        return Hit{std::move(s), Tier::kDisk};
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.misses;
    return std::nullopt;
}

bool PrefixCache::contains(std::span<const int32_t> tokens) {
    const uint64_t key = key_of(tokens);
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = warm_.find(key);
        if (it != warm_.end() && it->second.n_tokens == tokens.size()) return true;
    }
    if (ns_dir_.empty()) return false;
    std::error_code ec;
    return fs::exists(entry_file(tokens), ec);
}

void PrefixCache::insert_warm(uint64_t key, size_t n_tokens, std::vector<uint8_t> blob) {
    if (config_.max_bytes == 0 || blob.size() > config_.max_bytes) return;
    if (auto it = warm_.find(key); it != warm_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        return;
    }
    while (warm_bytes_ + blob.size() > config_.max_bytes && !lru_.empty()) {
        const uint64_t victim = lru_.back();
        lru_.pop_back();
        auto it = warm_.find(victim);
        warm_bytes_ -= it->second.blob.size();
        if (--warm_lengths_[it->second.n_tokens] == 0) warm_lengths_.erase(it->second.n_tokens);
        warm_.erase(it);
        ++counters_.evictions;
    }
    lru_.push_front(key);
    warm_bytes_ += blob.size();
    ++warm_lengths_[n_tokens];
    warm_.emplace(key, Entry{std::move(blob), n_tokens, lru_.begin()});
}

void PrefixCache::store(const SessionSnapshot& snapshot) {
    CERA_CHECK(size_t(snapshot.n_evaluated) == snapshot.tokens.size());
    if (snapshot.tokens.empty()) return;
    const bool want_warm = config_.max_bytes > 0 && snapshot_bytes_hint(snapshot) <= config_.max_bytes;
    if (!want_warm && ns_dir_.empty()) return;
    if (contains(snapshot.tokens)) return;
    std::vector<uint8_t> blob;
    encode_state(identity_, snapshot, blob);
    const uint64_t key = key_of(snapshot.tokens);
    if (!ns_dir_.empty()) {
        try {
            write_file_atomic(entry_file(snapshot.tokens), blob, /*durable=*/false);
            enforce_disk_bound();
        } catch (const Error&) {
            // a full or read-only disk only loses the cold tier
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.stores;
    insert_warm(key, snapshot.tokens.size(), std::move(blob));
}

void PrefixCache::enforce_disk_bound() {
    struct File {
        std::string path;
        uint64_t bytes;
        int64_t mtime;
    };
    std::vector<File> files;
    uint64_t total = 0;
    const int64_t now = int64_t(::time(nullptr));
    std::error_code ec;
    for (fs::directory_iterator it(ns_dir_, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        struct stat st {};
        if (::stat(it->path().c_str(), &st) != 0) continue;
        size_t n;
        uint64_t key;
        if (parse_entry_name(name, n, key)) {
            files.push_back({it->path().string(), uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
            total += uint64_t(st.st_size);
        } else if (name.find(".tmp.") != std::string::npos && now - int64_t(st.st_mtime) > kStaleTempSeconds) {
            std::error_code rm;
            fs::remove(it->path(), rm);  // a writer that died before its rename
        }
    }
    if (total <= config_.max_disk_bytes) return;
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime < b.mtime; });
    for (const File& f : files) {
        if (total <= config_.max_disk_bytes) break;
        std::error_code rm;
        if (fs::remove(f.path, rm)) {
            total -= f.bytes;
            std::lock_guard<std::mutex> lock(mu_);
            ++counters_.disk_evictions;
        }
    }
}

PrefixCacheCounters PrefixCache::counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    PrefixCacheCounters c = counters_;
    c.memory_entries = warm_.size();
    c.memory_bytes = warm_bytes_;
    return c;
}

}  // namespace cera
