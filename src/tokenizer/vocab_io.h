// Vocabulary loaders: GGUF metadata and Hugging Face tokenizer.json.
#pragma once
#include <string>

#include "tokenizer/vocab.h"

namespace cera {
namespace gguf {
class File;
}

// Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,*_token_id,add_*}. Special ids
// given in the file must be in range; a gpt2 model must have merges. Throws cera::Error.
VocabData vocab_data_from_gguf(const gguf::File& f);

// Reads a tokenizer.json (model BPE; byte-level or Metaspace-style) and optional tokenizer_config.json
// (add_bos_token, add_eos_token, bos/eos token, chat_template). Throws cera::Error.
VocabData vocab_data_from_hf_json(const std::string& tokenizer_json_path, const std::string& config_path);

}  // namespace cera
