// `cera convert --lora-merge`: folds LoRA adapters into a copy of their base model, W' = W + Σ s·B·A for
// every adapted weight (s = scale × alpha / r, or alpha / √r with rsLoRA), so that a runtime with no
// adapter support runs the fine-tuned model. Adapted weights keep their type (quantized ones are
// dequantized, summed in f32 and quantized again with the reference quantizer); every other tensor and
// every metadata key is copied as it is.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "gguf/writer.h"

namespace cera::quantize {

struct LoraMergeInput {
    std::string path;  // a GGUF LoRA file or a PEFT folder
    float scale = 1.0f;
};

struct LoraMergeOptions {
    std::string base;    // the base model's GGUF file
    std::string output;  // written to output.tmp and renamed, so a failure leaves no partial file
    std::vector<LoraMergeInput> adapters;
    int n_threads = 0;  // 0: all cores; the bytes do not depend on it
    gguf::Writer::ProgressFn on_progress;  // tensor bytes written so far and in all, after each tensor
};

struct LoraMergeSummary {
    size_t n_tensors = 0;  // tensors written
    size_t n_merged = 0;   // of which adapted
};

// Throws cera::Error before anything is renamed into place: kIo, kInvalidFile (an adapter made for another
// model, naming the tensor and both shapes), kUnsupported (an adapted weight of a type cera cannot
// quantize, a target cera cannot adapt), kInvalidArgument (no adapters).
LoraMergeSummary merge_lora(const LoraMergeOptions& o);

}  // namespace cera::quantize
