// One converter per architecture family; each reads config.json into Conversion::dims and the
// `<arch>.*` keys, refuses what the GGUF form cannot hold, and places the tensors from its tables.
#pragma once
#include <filesystem>

#include "convert/conversion.h"

namespace cera::convert {

// dense.cpp: the Llama-style dense transformers.
void convert_llama(Conversion& c);    // llama, mistral -> llama
void convert_qwen2(Conversion& c);    // qwen2 -> qwen2
void convert_qwen3(Conversion& c);    // qwen3 -> qwen3
void convert_granite(Conversion& c);  // granite -> granite

// lfm2.cpp: the LFM2 hybrid short-conv + attention stack.
void convert_lfm2(Conversion& c);     // lfm2 -> lfm2
void convert_lfm2moe(Conversion& c);  // lfm2_moe -> lfm2moe

// lfm2vl.cpp: LFM2-VL (lfm2_vl), two files. The text model: convert_lfm2 over text_config, its
// tensors under model.language_model.; the vision tower and projector: an mmproj file (clip).
HfConfig lfm2vl_text_config(const HfConfig& cfg);  // text_config, refused unless an LFM2
void convert_lfm2vl_mmproj(Conversion& c, const std::filesystem::path& hf_dir);
void leave_lfm2vl_vision(Conversion& c);  // the text file's conversion: the vision tensors are the mmproj's

}  // namespace cera::convert
