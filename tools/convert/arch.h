// One converter per architecture family; each reads config.json into Conversion::dims and the
// `<arch>.*` keys, refuses what the GGUF form cannot hold, and places the tensors from its tables.
#pragma once
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

}  // namespace cera::convert
