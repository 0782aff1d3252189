// The two merge algorithms, called by Tokenizer on each plain-text fragment.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace cera::detail {

// SentencePiece-style: repeatedly merge the adjacent pair whose concatenation is the token with the
// highest score (leftmost on ties); pieces that are not tokens fall back to byte tokens.
// `text` is already escaped ('▁' for spaces, space prefix added).
void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

// BPE: pre-tokenize into words, then within each word repeatedly apply the merge of lowest rank
// (leftmost on ties). Byte-level vocabularies encode each byte as its GPT-2 character first.
void bpe_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

}  // namespace cera::detail
