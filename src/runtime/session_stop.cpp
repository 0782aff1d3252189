#include "runtime/session_stop.h"

#include <algorithm>

namespace cera {

StopMatcher::StopMatcher(const std::vector<std::string>& stops) {
    for (const auto& s : stops)
        if (!s.empty()) stops_.push_back(s);
    size_t longest = 0;
    for (const auto& s : stops_) longest = std::max(longest, s.size());
    held_.reserve(2 * longest + 64);
}

bool StopMatcher::feed(std::string_view text, std::string& out) {
    if (stopped_) return true;
    held_.append(text);
    // The stop string that completes first (the one that starts earliest, i.e. the longest, when
    // several end at the same byte): the same answer whatever the pieces' boundaries.
    size_t best_end = std::string::npos, best = 0;
    const std::string* which = nullptr;
    for (const auto& s : stops_) {
        const size_t p = held_.find(s);
        if (p == std::string::npos) continue;
        const size_t end = p + s.size();
        if (end < best_end || (end == best_end && p < best)) best_end = end, best = p, which = &s;
    }
    if (which) {
        out.append(held_, 0, best);
        matched_ = *which;
        stopped_ = true;
        held_.clear();
        return true;
    }
    // Hold back the longest suffix that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto& s : stops_) {
        const size_t max_k = std::min(s.size() - 1, held_.size());
        for (size_t k = max_k; k > hold; --k)
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
    }
    size_t cut = held_.size() - hold;
    while (cut > 0 && cut < held_.size() && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80) --cut;
    out.append(held_, 0, cut);
    held_.erase(0, cut);
    return false;
}

void StopMatcher::finish(std::string& out) {
    if (stopped_) return;
    out.append(held_);
    held_.clear();
}

}  // namespace cera
