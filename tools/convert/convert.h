// `cera convert`: a Hugging Face checkpoint (model.safetensors + config.json + tokenizer.json) to
// a GGUF file with llama.cpp's architecture names, keys and tensor layout, so that llama.cpp and
// cera both run it as transformers does. What the GGUF form of an architecture cannot express is
// refused (cera::Error, kUnsupported) before anything is written.
#pragma once
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "gguf/writer.h"

namespace cera::convert {

struct ConvertOptions {
    std::filesystem::path hf_dir;
    std::string out;
    // A vision-language checkpoint's vision tower and projector go to this mmproj file (llama.cpp's
    // clip format); required for those checkpoints, refused for text-only ones.
    std::string mmproj_out;
    GgmlType type = GgmlType::kF32;  // matrices; norms, biases, routers and conv kernels stay F32
    gguf::Writer::ProgressFn on_progress;  // tensor bytes written so far and in all, after each tensor
};

// config.json model_types that convert, comma-separated (for messages and --help).
const char* supported_model_types();

struct ConvertSummary {
    size_t n_tensors = 0;         // in o.out
    size_t n_mmproj_tensors = 0;  // in o.mmproj_out
};

// Writes o.out (and o.mmproj_out); nothing is written when the checkpoint is refused.
ConvertSummary convert_hf(const ConvertOptions& o);

}  // namespace cera::convert
