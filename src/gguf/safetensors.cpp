#include "gguf/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/fp16.h"

namespace cera {

using nlohmann::json;

int64_t StTensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

void StTensor::to_f32(float* out) const {
    const size_t n = size_t(n_elements());
    if (dtype == "F32") {
        std::memcpy(out, data, n * 4);
        return;
    }
    if (dtype == "F64") {  // float64 checkpoints and adapters (references made in double precision)
        for (size_t i = 0; i < n; ++i) {
            double d;
            std::memcpy(&d, data + 8 * i, 8);
            out[i] = float(d);
        }
        return;
    }
    const bool f16 = dtype == "F16";
    for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
}

SafeTensors::SafeTensors(const std::string& path) : path_(path) { add_file(path); }

SafeTensors::SafeTensors(const std::vector<std::string>& shards, std::string name) : path_(std::move(name)) {
    maps_.reserve(shards.size());
    for (const std::string& s : shards) add_file(s);
}

const std::string& SafeTensors::file_of(const std::string& name) const {
    auto it = shard_of_.find(name);
    CERA_CHECK(it != shard_of_.end(), "no tensor '%s'", name.c_str());
    return maps_[it->second].path();
}

void SafeTensors::add_file(const std::string& path) {
    maps_.emplace_back(path);
    const size_t shard = maps_.size() - 1;
    const uint8_t* p = maps_.back().data();
    const size_t size = maps_.back().size();
    if (size < 8) throw_error(ErrorCode::kInvalidFile, "%s: too small for a safetensors file", path.c_str());
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | p[i];
    if (header_len > size - 8)
        throw_error(ErrorCode::kInvalidFile, "%s: header length %llu exceeds the file size %zu", path.c_str(),
                    (unsigned long long)header_len, size);
    json header;
    try {
        header = json::parse(p + 8, p + 8 + header_len);
    } catch (const json::exception& e) {
        throw_error(ErrorCode::kInvalidFile, "%s: header is not JSON: %s", path.c_str(), e.what());
    }
    if (!header.is_object()) throw_error(ErrorCode::kInvalidFile, "%s: header is not a JSON object", path.c_str());
    const uint8_t* base = p + 8 + header_len;
    const size_t data_size = size - 8 - header_len;
    for (const auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        StTensor t;
        try {
            t.dtype = info.at("dtype").get<std::string>();
            t.shape = info.at("shape").get<std::vector<int64_t>>();
            const auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
            if (off.size() != 2 || off[0] > off[1] || off[1] > data_size)
                throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' has data offsets outside the file", path.c_str(),
                            name.c_str());
            t.data = base + off[0];
            t.n_bytes = size_t(off[1] - off[0]);
        } catch (const json::exception& e) {
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s': %s", path.c_str(), name.c_str(), e.what());
        }
        size_t elem = 0;
        if (t.dtype == "F64")
            elem = 8;
        else if (t.dtype == "F32")
            elem = 4;
        else if (t.dtype == "F16" || t.dtype == "BF16")
            elem = 2;
        else
            throw_error(ErrorCode::kUnsupported, "%s: tensor '%s' has dtype %s (supported: F64, F32, F16, BF16)",
                        path.c_str(), name.c_str(), t.dtype.c_str());
        for (int64_t d : t.shape)
            if (d < 0)
                throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' has a negative dimension", path.c_str(),
                            name.c_str());
        if (size_t(t.n_elements()) * elem != t.n_bytes)
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' holds %zu bytes, its shape needs %zu", path.c_str(),
                        name.c_str(), t.n_bytes, size_t(t.n_elements()) * elem);
        if (tensors_.count(name))
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' is also in %s", path.c_str(), name.c_str(),
                        file_of(name).c_str());
        tensors_.emplace(name, std::move(t));
        shard_of_.emplace(name, shard);
    }
}

const StTensor* SafeTensors::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s.push_back('x');
        s.append(std::to_string(shape[i]));
    }
    return s;
}

}  // namespace cera
