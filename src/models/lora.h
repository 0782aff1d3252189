// LoRA adapters applied at run time, unmerged: a projection y = W·x becomes
//   y = W·x + sum over the sequence's adapters of scale · (alpha / r) · B·(A·x)
// (alpha / sqrt(r) with rsLoRA). An adapter is read from a llama.cpp GGUF LoRA file or a Hugging Face
// PEFT folder, checked against one model (architecture, every target's name and shape), and kept on the
// host; its device copy lives in the model's LoraCache, uploaded on first use and evicted least recently
// used beyond a byte cap. A step hands the architecture the adapters of each group of its rows
// (Step::lora); every projection then adds its deltas through Backend::lora_segments.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"

namespace cera {

class Model;
class LoraCache;
namespace gguf {
class File;
}

// One adapted projection, on the host: a layer's matrix, or the stacked experts of an MoE layer (one
// pair per expert, all of one rank).
struct LoraTensor {
    std::string target;    // the base weight, e.g. "blk.3.attn_q.weight", "blk.1.ffn_up_exps.weight"
    int64_t r = 0;         // rank
    int64_t k = 0;         // input width (the base weight's ne[0])
    int64_t n_out = 0;     // output width (the base weight's ne[1])
    int64_t n_expert = 1;  // experts stacked (the base weight's ne[2]); 1 for a plain matrix
    float factor = 1.0f;   // alpha / r, or alpha / sqrt(r) with rsLoRA
    std::vector<float> a;  // [n_expert, r, k]
    std::vector<float> b;  // [n_expert, n_out, r]
};

// A loaded adapter: immutable, shared by whoever uses it (a sequence in flight keeps it alive).
class LoraAdapter {
 public:
    ~LoraAdapter();
    const std::string& path() const { return path_; }
    uint64_t id() const { return id_; }  // unique in the process
    const std::vector<LoraTensor>& tensors() const { return tensors_; }
    int64_t max_rank() const;
    size_t bytes() const;  // the weights' bytes as f32 (host)

 private:
    friend std::shared_ptr<LoraAdapter> load_lora(const std::string& path, const Model& model);
    std::string path_;
    uint64_t id_ = 0;
    std::vector<LoraTensor> tensors_;
    std::weak_ptr<LoraCache> cache_;  // told when the adapter goes, so that its device copy is freed
};

// Reads a GGUF LoRA file (general.type = adapter, adapter.type = lora) or a PEFT folder
// (adapter_config.json + adapter_model.safetensors) and checks it against `model`. Throws cera::Error:
// kIo, kInvalidFile, kUnsupported (a target this build cannot adapt; MoE experts on a device other than the
// CPU), and kInvalidFile
// naming the tensor and both shapes when the adapter was made for another model.
std::shared_ptr<LoraAdapter> load_lora(const std::string& path, const Model& model);

// The same reading and checks against a model's GGUF file instead of a loaded model (no backend): the pairs,
// sorted by target, that `cera convert --lora-merge` folds into the base weights.
std::vector<LoraTensor> read_lora(const std::string& path, const gguf::File& base);

// Adapters applied together, each with its own scale (empty: the base model).
struct LoraChoice {
    std::shared_ptr<const LoraAdapter> adapter;
    float scale = 1.0f;
};
using LoraSet = std::vector<LoraChoice>;
// A hash of the set (adapter ids and scales; 0 for the empty set): states computed under different sets
// never share cached prefixes.
uint64_t lora_set_key(const LoraSet& set);

// An adapter's device copy: for each adapted base weight (by its device data pointer), A and B.
struct LoraPair {
    Tensor a;   // [n_expert, r, k] in the cache's type
    Tensor bt;  // [n_expert, r, n_out] in the cache's type: B transposed (Backend::lora_segments, moe_ffn_lora)
    float factor = 1.0f;
};
struct LoraResident {
    std::unordered_map<const void*, LoraPair> by_weight;
    size_t bytes = 0;
    uint64_t last_use = 0;
};

// The device copies of a model's adapters. resident() runs under the backend's exec mutex (a step
// being set up); forget() may come from any thread.
class LoraCache {
 public:
    // cap_bytes: device bytes of adapter weights kept when not in use (0: no bound); type: how the device
    // copies store A and Bᵀ (kF16 or kF32).
    LoraCache(Backend& be, std::unordered_map<std::string, Tensor> weights, size_t cap_bytes, GgmlType type);
    ~LoraCache();
    // Starts a step: the adapters resident() returns until the next begin_step() are not evicted.
    void begin_step();
    // The device copy of `a`, uploaded now when absent (first evicting adapters unused this step, least
    // recently used first, while the cap would be exceeded).
    const LoraResident& resident(const LoraAdapter& a);
    void forget(uint64_t id);
    size_t device_bytes() const;
    size_t n_resident() const;
    // The base weight of a target name, or nullptr.
    const Tensor* weight(const std::string& name) const;

 private:
    void free_entry(LoraResident& r);
    Backend& be_;
    std::unordered_map<std::string, Tensor> weights_;  // the model's matrices by name
    size_t cap_ = 0;
    GgmlType type_ = GgmlType::kF16;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, LoraResident> resident_;
    std::vector<uint64_t> dead_;  // forgotten ids whose copies are freed at the next resident()
    size_t bytes_ = 0;
    uint64_t clock_ = 1;
};

// The adapters of one group of a step's rows.
struct LoraRows {
    const LoraResident* adapter = nullptr;
    float scale = 1.0f;          // the choice's scale (the pair's factor multiplies it)
    int64_t start = 0, n = 0;    // rows of the step
};

// A key of a step's adapter groups (which device copies, scales and rows, for all rows and for the output
// rows): single-token steps with equal keys record the same ops, so a backend may replay them (a device copy
// that goes is freed through the backend, which drops its recordings). 0 when there are no groups.
uint64_t lora_rows_key(std::span<const LoraRows> rows, std::span<const LoraRows> out_rows);

}  // namespace cera
