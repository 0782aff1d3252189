// The server's counters and latency histograms, rendered for GET /metrics in the Prometheus text
// format (version 0.0.4) together with the batcher's gauges. Every member is thread-safe: the HTTP
// threads count requests, the batcher's thread (through the request sinks) observes token times.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "cera/batcher.h"

namespace cera {

// A cumulative histogram of durations in seconds over fixed bucket bounds.
class Histogram {
 public:
    static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.25,
                                                       0.5,   0.75, 1.0,   2.5,  5.0,   10.0, 30.0};
    void observe(double seconds);
    // `name`_bucket{le=...}, `name`_sum and `name`_count lines.
    std::string render(const std::string& name) const;

 private:
    mutable std::mutex mu_;
    std::array<uint64_t, kBounds.size()> buckets_{};  // observations <= kBounds[i] (not cumulative)
    uint64_t count_ = 0;
    double sum_ = 0.0;
};

class Metrics {
 public:
    // A finished request: its endpoint ("chat", "completion", "embedding", ...) and HTTP status (499: the
    // client went away mid-stream).
    void request(const std::string& endpoint, int status);
    // Tokens of a finished request: its prompt (cached: the part taken from the prefix cache) and generated.
    void tokens(int64_t prompt, int64_t cached, int64_t generated);
    // Tokens of a finished embeddings request (apart: they never meet the prefix cache).
    void embedded(int64_t tokens);
    Histogram time_to_first_token, inter_token;

    // The whole exposition: these counters and histograms and the batcher's state.
    std::string render(const BatcherStats& stats) const;

 private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0, embedded_tokens_ = 0;
};

}  // namespace cera
