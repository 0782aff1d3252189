// The adapter readers' common result (lora.cpp reads GGUF LoRA files, lora_peft.cpp PEFT folders):
// the pairs named by the base weights they adapt, before the checks against the model.
#pragma once
#include <string>
#include <vector>

#include "models/lora.h"

namespace cera {

namespace gguf {
class File;
}

struct LoraRead {
    std::string arch;  // the architecture the adapter names ("" when it names none)
    std::vector<LoraTensor> tensors;
};

// A PEFT folder (adapter_config.json, adapter_model.safetensors) for a model of architecture `arch`:
// the Hugging Face module names become GGUF weight names; llama and granite's q and k rows are permuted
// as the converter permutes the base's (n_head / n_head_kv from `heads`); an MoE layer's per-expert
// modules (feed_forward.experts.<e>.w1/w3/w2) are stacked into one pair for the layer's expert weight, with
// zeros for the experts the adapter leaves alone (n_expert from `heads`).
struct LoraHeads {
    int64_t n_head = 0, n_head_kv = 0;
    int64_t n_expert = 0;
};
LoraRead read_peft_lora(const std::string& dir, const std::string& arch, const LoraHeads& heads);
// What read_peft_lora needs of a base model of architecture `arch`, from its GGUF file.
LoraHeads lora_heads(const gguf::File& f, const std::string& arch);

}  // namespace cera
