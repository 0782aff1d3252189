// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), shared by the
// GGUF reader (metadata keys and strings) and the tokenizer (decoding, streaming text out).
#pragma once
#include <cstddef>
#include <string_view>

namespace cera::utf8 {

// How the sequence at the start of `bytes` (non-empty) reads: `len` is the length its first byte
// announces (0: not a lead byte), `matched` how many bytes from the start fit the well-formed
// pattern (the maximal subpart, which U+FFFD replacement counts as one). The sequence is a
// character when matched == len > 0; when matched < len and matched == bytes.size() it may only
// be cut short.
struct Match {
    size_t len;
    size_t matched;
};
Match match(std::string_view bytes);

// Length of the longest prefix of `bytes` that is valid UTF-8.
size_t valid_prefix(std::string_view bytes);
inline bool is_valid(std::string_view bytes) { return valid_prefix(bytes) == bytes.size(); }

}  // namespace cera::utf8
