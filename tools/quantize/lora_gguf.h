// `cera convert --peft DIR -m BASE.gguf -o OUT.gguf`: a PEFT LoRA adapter (adapter_config.json +
// adapter_model.safetensors) to llama.cpp's GGUF LoRA format, as its convert_lora_to_gguf.py writes it:
// general.architecture of the base, general.type "adapter", adapter.type "lora", general.name, one
// adapter.lora.alpha, and per adapted weight W the F32 tensors "W.lora_a" {in, r} and "W.lora_b"
// {r, out}, in the order of the adapter's module names. The base model gives the architecture, the
// weight names and shapes the adapter is checked against, and the head counts of the q/k row order.
#pragma once
#include <cstddef>
#include <string>

namespace cera::quantize {

struct PeftConvertOptions {
    std::string peft_dir;
    std::string base;    // the base model's GGUF file
    std::string output;  // written to output.tmp and renamed
};

// Returns the number of adapted weights. Throws cera::Error: what reading the adapter throws (kIo,
// kInvalidFile for an adapter of another model, kUnsupported for DoRA, biases, experts ...), and
// kUnsupported when its modules need different alpha / r factors (one adapter.lora.alpha holds one).
size_t convert_peft_lora(const PeftConvertOptions& o);

}  // namespace cera::quantize
