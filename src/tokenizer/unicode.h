// Unicode helpers for the tokenizers: UTF-8 decoding and encoding, per-codepoint category flags
// (from utf8proc, computed once into a flat table), case folding, NFC, and the GPT-2 byte<->unicode map.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cera::unicode {

inline constexpr uint32_t kReplacement = 0xFFFD;  // U+FFFD, what an invalid byte decodes to
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Category flags of a codepoint. A codepoint with no flag is unassigned (general category Cn).
enum CpFlag : uint8_t {
    kLetter = 1 << 0,       // L*
    kNumber = 1 << 1,       // N*
    kPunctuation = 1 << 2,  // P*
    kSymbol = 1 << 3,       // S*
    kMark = 1 << 4,         // M*
    kSeparator = 1 << 5,    // Z*
    kControl = 1 << 6,      // Cc, Cf, Cs, Co
    kWhitespace = 1 << 7,   // the White_Space property: Z* plus U+0009..U+000D and U+0085
};

// Flags of one codepoint; 0 for unassigned codepoints and for values above U+10FFFF.
uint8_t cp_flags(uint32_t cp);
inline bool is_letter(uint32_t cp) { return cp_flags(cp) & kLetter; }
inline bool is_number(uint32_t cp) { return cp_flags(cp) & kNumber; }
inline bool is_whitespace(uint32_t cp) { return cp_flags(cp) & kWhitespace; }

// Simple lowercase mapping (one codepoint to one codepoint).
uint32_t to_lower(uint32_t cp);

// Byte length of the UTF-8 sequence that starts with `lead` (1 for continuation or invalid bytes).
inline size_t utf8_len(uint8_t lead) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[lead >> 4];
}

// Appends the UTF-8 encoding of cp (cp <= U+10FFFF; larger values encode U+FFFD).
void append_utf8(std::string& out, uint32_t cp);
std::string to_utf8(uint32_t cp);

// Decodes UTF-8 the way llama.cpp does: a lead byte followed by the right number of continuation
// bytes is one codepoint (no overlong or surrogate check); any other byte becomes U+FFFD and
// decoding resumes at the next byte. Values above U+10FFFF also become U+FFFD.
// Returns true when re-encoding the codepoints gives back exactly `text`.
bool decode_utf8(std::string_view text, std::vector<uint32_t>& cps);
std::vector<uint32_t> decode_utf8(std::string_view text);
// (Strict UTF-8 validation is core/utf8.h, shared with the GGUF reader.)

// Canonical composition (NFC) of valid UTF-8 text. Invalid input is returned unchanged.
std::string nfc(std::string_view text);

// GPT-2 byte-level encoding: every byte maps to one printable codepoint (given as UTF-8, 1 or 2 bytes).
std::string_view byte_to_unicode(uint8_t byte);
// The byte a GPT-2 codepoint stands for, or -1 when cp is not one of the 256.
int unicode_to_byte(uint32_t cp);

}  // namespace cera::unicode
