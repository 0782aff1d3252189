#include "convert/hf_config.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>

#include "core/check.h"

namespace cera::convert {

using json = nlohmann::json;

HfConfig HfConfig::read(const std::filesystem::path& path) {
    std::ifstream f(path);
    if (!f) throw_error(ErrorCode::kIo, "cannot open %s", path.c_str());
    try {
        json j = json::parse(f);
        if (!j.is_object()) throw_error(ErrorCode::kInvalidFile, "%s: not a JSON object", path.c_str());
        return HfConfig(std::move(j));
    } catch (const json::exception& e) {
        throw_error(ErrorCode::kInvalidFile, "%s: %s", path.c_str(), e.what());
    }
}

bool HfConfig::has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
}

int64_t HfConfig::i64(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number_integer())
        throw_error(ErrorCode::kMissing, "config.json: '%s' is missing or not an integer", key);
    return it->get<int64_t>();
}

int64_t HfConfig::i64(const char* key, int64_t fallback) const { return has(key) ? i64(key) : fallback; }

float HfConfig::f32(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number())
        throw_error(ErrorCode::kMissing, "config.json: '%s' is missing or not a number", key);
    return it->get<float>();
}

float HfConfig::f32(const char* key, float fallback) const { return has(key) ? f32(key) : fallback; }

bool HfConfig::flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) throw_error(ErrorCode::kInvalidFile, "config.json: '%s' is not a boolean", key);
    return v.get<bool>();
}

std::string HfConfig::str(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) throw_error(ErrorCode::kInvalidFile, "config.json: '%s' is not a string", key);
    return v.get<std::string>();
}

std::vector<std::string> HfConfig::strings(const char* key) const {
    try {
        return j_.at(key).get<std::vector<std::string>>();
    } catch (const json::exception&) {
        throw_error(ErrorCode::kMissing, "config.json: '%s' is missing or not a list of strings", key);
    }
}

std::vector<int64_t> HfConfig::ints(const char* key) const {
    try {
        return j_.at(key).get<std::vector<int64_t>>();
    } catch (const json::exception&) {
        throw_error(ErrorCode::kMissing, "config.json: '%s' is missing or not a list of integers", key);
    }
}

void refuse(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw_error(ErrorCode::kUnsupported, "config.json: %s", buf);
}

namespace {

float number(const json& j, const char* where, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number())
        throw_error(ErrorCode::kMissing, "config.json: '%s%s' is missing or not a number", where, key);
    return it->get<float>();
}

}  // namespace

Rope read_rope(const HfConfig& cfg) {
    const json& c = cfg.raw();
    Rope r;
    json params = json::object();
    const char* where = "";
    if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
        params = c["rope_parameters"];
        where = "rope_parameters.";
        // One set of parameters per attention kind (e.g. full and sliding) has no GGUF form here.
        if (!params.contains("rope_theta") && !params.contains("rope_type"))
            refuse("rope_parameters per attention type are not supported");
    } else if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
        params = c["rope_scaling"];
        where = "rope_scaling.";
    }
    if (params.contains("rope_theta"))
        r.theta = number(params, where, "rope_theta");
    else if (c.contains("rope_theta"))
        r.theta = number(c, "", "rope_theta");
    if (!(r.theta > 0.0f)) throw_error(ErrorCode::kInvalidFile, "config.json: rope_theta %g is not positive", r.theta);
    r.type = params.value("rope_type", params.value("type", std::string("default")));
    if (r.type == "default") return r;
    r.factor = number(params, where, "factor");
    if (!(r.factor > 0.0f))
        throw_error(ErrorCode::kInvalidFile, "config.json: %sfactor %g is not positive", where, r.factor);
    if (r.type == "linear") return r;
    if (r.type == "llama3") {
        r.low_freq_factor = number(params, where, "low_freq_factor");
        r.high_freq_factor = number(params, where, "high_freq_factor");
        r.original_context = int64_t(number(params, where, "original_max_position_embeddings"));
        if (!(r.high_freq_factor > r.low_freq_factor) || r.original_context <= 0)
            throw_error(ErrorCode::kInvalidFile, "config.json: llama3 rope needs high_freq_factor > low_freq_factor");
        return r;
    }
    refuse("rope type '%s' (supported: default, linear, llama3)", r.type.c_str());
}

// Wavelengths shorter than original_context / high_freq_factor keep their frequency, longer than
// original_context / low_freq_factor are divided by `factor`, and the band between is interpolated
// smoothly in 1 / wavelength.
std::vector<float> llama3_rope_factors(const Rope& r, int64_t n_rot) {
    std::vector<float> out(size_t(n_rot / 2));
    const double low_wavelen = double(r.original_context) / r.low_freq_factor;
    const double high_wavelen = double(r.original_context) / r.high_freq_factor;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
        const double freq = std::pow(double(r.theta), -2.0 * double(i) / double(n_rot));
        const double wavelen = 2.0 * M_PI / freq;
        double f = 1.0;
        if (wavelen > low_wavelen) {
            f = r.factor;
        } else if (wavelen >= high_wavelen) {
            const double smooth =
                (double(r.original_context) / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / r.factor + smooth);
        }
        out[size_t(i)] = float(f);
    }
    return out;
}

}  // namespace cera::convert
