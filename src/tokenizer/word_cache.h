// Per-thread cache of word -> token ids for the encoders: text repeats words, and a word's ids depend
// only on the vocabulary. Each vocabulary has a serial number; a thread's cache belongs to one
// vocabulary at a time and is cleared when another one is used, or when it grows too large.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cera::detail {

class WordCache {
   public:
    static constexpr size_t kMaxWords = 1 << 16;
    static constexpr size_t kMaxWordBytes = 64;  // longer words are not cached

    // The calling thread's cache, emptied unless it already belongs to vocabulary `serial`.
    static WordCache& for_vocab(uint64_t serial) {
        thread_local WordCache cache;
        if (cache.serial_ != serial) {
            cache.clear();
            cache.serial_ = serial;
        }
        return cache;
    }

    // Appends the cached ids of `word` to `out`; false when absent.
    bool get(std::string_view word, std::vector<int32_t>& out) const {
        auto it = map_.find(word);
        if (it == map_.end()) return false;
        out.insert(out.end(), pool_.begin() + it->second.first, pool_.begin() + it->second.first + it->second.second);
        return true;
    }

    void put(std::string_view word, const int32_t* ids, size_t n) {
        if (word.size() > kMaxWordBytes) return;
        if (map_.size() >= kMaxWords) clear();
        map_.emplace(std::string(word), std::pair<uint32_t, uint32_t>(uint32_t(pool_.size()), uint32_t(n)));
        pool_.insert(pool_.end(), ids, ids + n);
    }

   private:
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    void clear() {
        map_.clear();
        pool_.clear();
    }

    uint64_t serial_ = 0;
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, Hash, std::equal_to<>> map_;
    std::vector<int32_t> pool_;
};

}  // namespace cera::detail
