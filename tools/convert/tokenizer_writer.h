// The tokenizer of a Hugging Face checkpoint (tokenizer.json + tokenizer_config.json) written as
// GGUF tokenizer.* keys, or refused where no GGUF tokenizer reproduces it.
#pragma once
#include <cstdint>
#include <filesystem>

#include "convert/hf_config.h"
#include "gguf/writer.h"

namespace cera::convert {

// n_vocab: config.json's vocab_size; ids beyond the tokenizer's become padding tokens.
void write_tokenizer(const std::filesystem::path& dir, const HfConfig& config, int64_t n_vocab, gguf::Writer& w);

}  // namespace cera::convert
