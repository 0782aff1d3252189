// Reading an architecture's hyperparameters and weights from a GGUF, with the
// checks that turn a bad file into a clear error naming the key or tensor and
// the expected vs actual value.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "gguf/gguf.h"
#include "models/shard.h"

namespace cera {

// Keys under "<arch>.": hp.u32("embedding_length") reads "lfm2.embedding_length".
class HParams {
 public:
    HParams(const gguf::File& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
    const std::string& arch() const { return arch_; }
    const gguf::File& file() const { return f_; }
    std::string key(std::string_view suffix) const;
    bool has(std::string_view suffix) const;

    // Required (kMissing names the key when absent) and defaulted forms.
    int64_t u32(std::string_view suffix) const;
    int64_t u32(std::string_view suffix, int64_t fallback) const;
    float f32(std::string_view suffix) const;
    float f32(std::string_view suffix, float fallback) const;
    // A per-layer value: a scalar broadcast to every layer, or an array of exactly n_layer entries
    // (kInvalidFile naming the key and both lengths otherwise).
    std::vector<int64_t> per_layer(std::string_view suffix, int64_t n_layer) const;

    // Throws kInvalidFile "<key> = <value>: <what>" unless ok.
    void require(bool ok, std::string_view suffix, int64_t value, const char* what) const;

 private:
    const gguf::File& f_;
    std::string arch_;
};

// Looks up tensors by name, checks their shape (ne, GGUF order) and type, and makes them resident
// on the backend.
class WeightLoader {
 public:
    using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;
    WeightLoader(const gguf::File& f, Backend& be, ProgressFn progress = {}, Shard shard = {});
    const Shard& shard() const { return shard_; }

    // Any weight type the backend's matmul accepts (F32, F16, BF16, quantized). ne is the whole tensor's
    // shape; with a split, this rank's share of it is loaded (parts: the split dimension is `parts`
    // equal runs, each divided alike, as in_proj's B, C and X rows are). A split that does not divide
    // evenly (in whole blocks for ne[0]) throws kUnsupported naming the tensor.
    Tensor matrix(const std::string& name, std::initializer_list<int64_t> ne, Split split = Split::kNone,
                  int parts = 1);
    Tensor matrix_optional(const std::string& name, std::initializer_list<int64_t> ne);
    // F32 vectors and small tensors (norms, biases, conv kernels, rope factors); a bias splits as kCols.
    Tensor f32(const std::string& name, std::initializer_list<int64_t> ne, Split split = Split::kNone);
    Tensor f32_optional(const std::string& name, std::initializer_list<int64_t> ne);

    bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }
    // The number of tensors fetched so far (to report unused tensors if wanted).
    size_t n_loaded() const { return n_loaded_; }
    // The matrices fetched so far, by name (what a LoRA adapter may name as its target).
    const std::unordered_map<std::string, Tensor>& matrices() const { return matrices_; }
    // Every weight matrix fetched so far (optional ones too), by device pointer.
    const std::unordered_map<const void*, std::string>& weight_names() const { return weight_names_; }
    // The host copies of split weights that are not one range of the file's bytes; the backend may
    // keep views into them, so they must outlive it.
    std::vector<std::vector<uint8_t>> take_owned() { return std::move(owned_); }

 private:
    Tensor load(const std::string& name, std::initializer_list<int64_t> ne, bool f32_only, bool optional,
                Split split = Split::kNone, int parts = 1);
    Tensor load_share(const std::string& name, const gguf::TensorInfo& ti, std::vector<int64_t> ne, Split split,
                      int parts);
    const gguf::File& f_;
    Backend& be_;
    Shard shard_;
    std::vector<std::vector<uint8_t>> owned_;
    size_t n_loaded_ = 0;
    ProgressFn progress_;
    uint64_t bytes_done_ = 0, bytes_total_ = 0;
    std::unordered_map<std::string, Tensor> matrices_;
    std::unordered_map<const void*, std::string> weight_names_;
};

// "blk.<il>.<suffix>", e.g. blk(3, "attn_q.weight").
std::string blk(int64_t il, std::string_view suffix);

}  // namespace cera
