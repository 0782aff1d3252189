// config.json of a Hugging Face checkpoint: typed reads that name the key when it is missing or
// has the wrong type, and the RoPE settings in both of the forms transformers writes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cera::convert {

class HfConfig {
 public:
    explicit HfConfig(nlohmann::json j) : j_(std::move(j)) {}
    static HfConfig read(const std::filesystem::path& path);

    // Present and not null.
    bool has(const char* key) const;
    int64_t i64(const char* key) const;  // required integer
    int64_t i64(const char* key, int64_t fallback) const;
    float f32(const char* key) const;  // required number
    float f32(const char* key, float fallback) const;
    bool flag(const char* key, bool fallback) const;
    std::string str(const char* key, const std::string& fallback) const;
    std::vector<std::string> strings(const char* key) const;
    std::vector<int64_t> ints(const char* key) const;
    const nlohmann::json& raw() const { return j_; }

 private:
    nlohmann::json j_;
};

// Throws kUnsupported "config.json: <message>": a setting the GGUF form cannot express.
[[noreturn]] void refuse(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// RoPE from config.json: transformers 5 nests it as rope_parameters {rope_theta, rope_type, ...};
// older files have rope_theta and rope_scaling {type|rope_type, factor, ...} at the top level.
struct Rope {
    float theta = 10000.0f;
    std::string type = "default";  // default | linear | llama3
    float factor = 1.0f;
    // llama3 only: the band between these wavelengths is interpolated.
    float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
    int64_t original_context = 8192;
};
Rope read_rope(const HfConfig& cfg);

// Llama 3.1's frequency-dependent scaling as per-frequency divisors (GGUF rope_freqs.weight, one per
// rotated pair).
std::vector<float> llama3_rope_factors(const Rope& r, int64_t n_rot);

}  // namespace cera::convert
