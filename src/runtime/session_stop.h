// StopMatcher: releases streamed text only when it is final with respect to a set of
// stop strings. Text that could be the beginning of a stop string is held back until
// it is not; when a stop string appears, the text before it is released and nothing
// after it ever is. Generation stops at the first stop string to complete: with stops
// {"c", "bca"} the text "bca" stops at "c", releasing "b". Internal to the runtime (used by Session).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cera {

class StopMatcher {
   public:
    // Empty strings are ignored.
    explicit StopMatcher(const std::vector<std::string>& stops);

    // Adds text and appends to `out` what is now final. Returns true when a stop string has
    // completed: `out` then ends just before it, and later calls release nothing.
    bool feed(std::string_view text, std::string& out);
    // End of the stream: releases what is held back (unless a stop string matched).
    void finish(std::string& out);
    // The last text (a detokenizer's flush), then the end: returns whether a stop string completed.
    bool end(std::string_view tail, std::string& out) {
        if (!feed(tail, out)) finish(out);
        return stopped_;
    }

    bool stopped() const { return stopped_; }
    const std::string& matched() const { return matched_; }  // the stop string that matched
    size_t held() const { return held_.size(); }              // bytes held back now

   private:
    std::vector<std::string> stops_;
    std::string held_;
    std::string matched_;
    bool stopped_ = false;
};

}  // namespace cera
