#include "models/loader.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "core/check.h"
#include "core/quant/quant.h"
#include "gguf/keys.h"

namespace cera {
namespace {

std::string shape_string(const int64_t* ne, size_t n) {
    std::string s = "{";
    for (size_t i = 0; i < n; ++i) {
        if (i) s += ", ";
        s += std::to_string(ne[i]);
    }
    return s + "}";
}

}  // namespace

std::string blk(int64_t il, std::string_view suffix) {
    std::string s = "blk." + std::to_string(il) + ".";
    s += suffix;
    return s;
}

std::string HParams::key(std::string_view suffix) const { return gguf::keys::arch_key(arch_, suffix); }
bool HParams::has(std::string_view suffix) const { return f_.has(key(suffix)); }

int64_t HParams::u32(std::string_view suffix) const { return f_.get_i64(key(suffix)); }
int64_t HParams::u32(std::string_view suffix, int64_t fallback) const { return f_.get_i64(key(suffix), fallback); }
float HParams::f32(std::string_view suffix) const { return f_.get_f32(key(suffix)); }
float HParams::f32(std::string_view suffix, float fallback) const { return f_.get_f32(key(suffix), fallback); }

std::vector<int64_t> HParams::per_layer(std::string_view suffix, int64_t n_layer) const {
    const std::string k = key(suffix);
    const gguf::Value* v = f_.find(k);
    if (!v) throw_error(ErrorCode::kMissing, "missing key %s", k.c_str());
    if (v->type != gguf::ValueType::kArray) return std::vector<int64_t>(size_t(n_layer), f_.get_i64(k));
    std::vector<int64_t> xs = f_.get_int_array(k);
    if (int64_t(xs.size()) != n_layer)
        throw_error(ErrorCode::kInvalidFile, "%s has %zu entries, expected %" PRId64 " (block_count)", k.c_str(),
                    xs.size(), n_layer);
    return xs;
}

void HParams::require(bool ok, std::string_view suffix, int64_t value, const char* what) const {
    if (!ok) throw_error(ErrorCode::kInvalidFile, "%s = %" PRId64 ": %s", key(suffix).c_str(), value, what);
}

Tensor WeightLoader::load(const std::string& name, std::initializer_list<int64_t> ne, bool f32_only, bool optional,
                          Split split, int parts) {
    const gguf::TensorInfo* ti = f_.find_tensor(name);
    if (!ti) {
        if (optional) return Tensor{};
        throw_error(ErrorCode::kMissing, "missing tensor %s (expected ne %s)", name.c_str(),
                    shape_string(ne.begin(), ne.size()).c_str());
    }
    // Compare ne with trailing 1s ignored on both sides.
    std::vector<int64_t> want(ne), got(ti->ne);
    while (want.size() > 1 && want.back() == 1) want.pop_back();
    while (got.size() > 1 && got.back() == 1) got.pop_back();
    if (want != got)
        throw_error(ErrorCode::kInvalidFile, "tensor %s has ne %s, expected %s", name.c_str(),
                    shape_string(ti->ne.data(), ti->ne.size()).c_str(), shape_string(want.data(), want.size()).c_str());
    if (f32_only && ti->type != GgmlType::kF32)
        throw_error(ErrorCode::kUnsupported, "tensor %s has type %s, expected F32", name.c_str(), type_name(ti->type));
    if (!f32_only && !can_dequantize(ti->type))
        throw_error(ErrorCode::kUnsupported, "tensor %s has type %s, which this build cannot compute with",
                    name.c_str(), type_name(ti->type));
    if (got.size() > 4) throw_error(ErrorCode::kInvalidFile, "tensor %s has %zu dimensions", name.c_str(), got.size());
    ++n_loaded_;
    Tensor t;
    if (split == Split::kNone || shard_.world == 1 || shard_.pipeline) {
        const std::span<const int64_t> shape(got.data(), got.size());
        t = f_.mapped() ? be_.upload_mapped_weight(ti->type, shape, ti->data)
                        : be_.upload_weight(ti->type, shape, ti->data);
    } else {
        t = load_share(name, *ti, got, split, parts);
    }
    if (!f32_only) weight_names_.emplace(t.data, name);
    bytes_done_ += ti->n_bytes;
    if (progress_) progress_(std::min(bytes_done_, bytes_total_), bytes_total_);
    return t;
}

// This rank's share of a tensor of shape ne (full, GGUF order), split along ne[0] (kCols) or ne[1]
// (kRows) of every matrix of the stack (ne[2] * ne[3] of them), the split dimension being `parts` runs.
Tensor WeightLoader::load_share(const std::string& name, const gguf::TensorInfo& ti, std::vector<int64_t> ne,
                                Split split, int parts) {
    ne.resize(4, 1);
    const TypeInfo& tt = type_info(ti.type);
    const int dim = split == Split::kCols ? 0 : 1;
    const int64_t unit = dim == 0 ? tt.block_size : 1;
    const int64_t n = ne[size_t(dim)];
    if (split == Split::kVocab) {  // one range of whole rows: a view of the file's bytes where it is mapped
        CERA_CHECK(parts == 1 && ne[2] * ne[3] == 1, "load %s: a vocabulary split of a stack", name.c_str());
        const size_t row_bytes = row_size(ti.type, ne[0]);
        const int64_t b = shard_.begin(n), e = shard_.end(n);
        const int64_t shape[2] = {ne[0], e - b};
        const uint8_t* at = static_cast<const uint8_t*>(ti.data) + row_bytes * size_t(b);
        return f_.mapped() ? be_.upload_mapped_weight(ti.type, shape, at) : be_.upload_weight(ti.type, shape, at);
    }
    if (parts < 1 || n % (int64_t(parts) * shard_.world * unit) != 0)
        throw SplitError("tensor " + name + "'s ne[" + std::to_string(dim) + "] = " + std::to_string(n) +
                         (parts > 1 ? " (" + std::to_string(parts) + " runs)" : "") + " does not divide among " +
                         std::to_string(shard_.world) + " ranks" + (unit > 1 ? " in whole blocks" : ""));
    const int64_t run = n / parts, share = run / shard_.world, at = share * shard_.rank;
    const size_t row_bytes = row_size(ti.type, ne[0]);
    const int64_t n_mats = ne[2] * ne[3];
    std::vector<int64_t> out = ne;
    out[size_t(dim)] = share * parts;
    const size_t out_row = row_size(ti.type, out[0]);
    const uint8_t* src = static_cast<const uint8_t*>(ti.data);
    std::vector<uint8_t> bytes(out_row * size_t(out[1] * n_mats));
    uint8_t* dst = bytes.data();
    for (int64_t m = 0; m < n_mats; ++m) {
        const uint8_t* mat = src + size_t(m) * row_bytes * size_t(ne[1]);
        if (dim == 1) {
            for (int p = 0; p < parts; ++p) {
                const size_t nb = row_bytes * size_t(share);
                std::memcpy(dst, mat + row_bytes * size_t(p * run + at), nb);
                dst += nb;
            }
        } else {
            for (int64_t r = 0; r < ne[1]; ++r)
                for (int p = 0; p < parts; ++p) {
                    const size_t off = row_size(ti.type, p * run + at), nb = row_size(ti.type, share);
                    std::memcpy(dst, mat + row_bytes * size_t(r) + off, nb);
                    dst += nb;
                }
        }
    }
    while (out.size() > 1 && out.back() == 1) out.pop_back();
    const Tensor t = be_.upload_weight(ti.type, std::span<const int64_t>(out.data(), out.size()), bytes.data());
    owned_.push_back(std::move(bytes));
    return t;
}

WeightLoader::WeightLoader(const gguf::File& f, Backend& be, ProgressFn progress, Shard shard)
    : f_(f), be_(be), shard_(shard), progress_(std::move(progress)) {
    for (const auto& t : f_.tensors()) bytes_total_ += t.n_bytes;
}

Tensor WeightLoader::matrix(const std::string& name, std::initializer_list<int64_t> ne, Split split, int parts) {
    const Tensor t = load(name, ne, false, false, split, parts);
    matrices_[name] = t;
    return t;
}
Tensor WeightLoader::matrix_optional(const std::string& name, std::initializer_list<int64_t> ne) {
    return load(name, ne, false, true);
}
Tensor WeightLoader::f32(const std::string& name, std::initializer_list<int64_t> ne, Split split) {
    return load(name, ne, true, false, split);
}
Tensor WeightLoader::f32_optional(const std::string& name, std::initializer_list<int64_t> ne) {
    return load(name, ne, true, true);
}

}  // namespace cera
