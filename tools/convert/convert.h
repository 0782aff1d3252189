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
    GgmlType type = GgmlType::kF32;  // matrices; norms, biases, routers and conv kernels stay F32
    gguf::Writer::ProgressFn on_progress;  // tensor bytes written so far and in all, after each tensor
};

// config.json model_types that convert, comma-separated (for messages and --help).
const char* supported_model_types();

// Writes o.out; returns the number of tensors written.
size_t convert_hf(const ConvertOptions& o);

}  // namespace cera::convert
