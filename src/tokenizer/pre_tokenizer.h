// Pre-tokenizers: split text (as codepoints) into the words that BPE merges within.
// Each rule set reproduces the split regexes of its tokenizer (see pre_tokenizer.cpp); categories
// (\p{L}, \p{N}, \p{P}, \s) come from unicode.h.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tokenizer/vocab.h"

namespace cera {

// Splits cps into words. `ends` receives the end index (exclusive, in codepoints) of every word, in
// order; the words cover cps exactly. `scratch` is reused working memory.
void pre_tokenize(PreTokenizer p, std::span<const uint32_t> cps, std::vector<uint32_t>& ends,
                  std::vector<uint32_t>& scratch);

}  // namespace cera
