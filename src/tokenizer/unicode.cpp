// Unicode helpers: the category table is derived from utf8proc once, at first use.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "core/utf8.h"

namespace cera::unicode {
namespace {

uint8_t flags_of_category(utf8proc_category_t c) {
    switch (c) {
        case UTF8PROC_CATEGORY_LU:
        case UTF8PROC_CATEGORY_LL:
        case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_LO: return kLetter;
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ME: return kMark;
        case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_NO: return kNumber;
        case UTF8PROC_CATEGORY_PC:
        case UTF8PROC_CATEGORY_PD:
        case UTF8PROC_CATEGORY_PS:
        case UTF8PROC_CATEGORY_PE:
        case UTF8PROC_CATEGORY_PI:
        case UTF8PROC_CATEGORY_PF:
        case UTF8PROC_CATEGORY_PO: return kPunctuation;
        case UTF8PROC_CATEGORY_SM:
        case UTF8PROC_CATEGORY_SC:
        case UTF8PROC_CATEGORY_SK:
        case UTF8PROC_CATEGORY_SO: return kSymbol;
        case UTF8PROC_CATEGORY_ZS:
        case UTF8PROC_CATEGORY_ZL:
        case UTF8PROC_CATEGORY_ZP: return kSeparator | kWhitespace;
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO: return kControl;
        case UTF8PROC_CATEGORY_CN:
        default: return 0;
    }
}

struct FlagTable {
    std::unique_ptr<uint8_t[]> flags{new uint8_t[kMaxCodepoint + 1]};
    FlagTable() {
        for (uint32_t cp = 0; cp <= kMaxCodepoint; ++cp) {
            flags[cp] = flags_of_category(utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
        }
        // White_Space also holds these control characters.
        for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x85u}) flags[cp] |= kWhitespace;
    }
};

const FlagTable& flag_table() {
    static const FlagTable table;
    return table;
}

struct ByteMap {
    std::array<std::array<char, 2>, 256> utf8{};
    std::array<uint8_t, 256> len{};
    std::array<int16_t, 512> to_byte{};
    ByteMap() {
        to_byte.fill(-1);
        auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
        int next = 256;
        for (int b = 0; b < 256; ++b) {
            uint32_t cp = printable(b) ? uint32_t(b) : uint32_t(next++);
            std::string s = to_utf8(cp);
            len[b] = uint8_t(s.size());
            for (size_t i = 0; i < s.size(); ++i) utf8[b][i] = s[i];
            to_byte[cp] = int16_t(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

}  // namespace

uint8_t cp_flags(uint32_t cp) { return cp <= kMaxCodepoint ? flag_table().flags[cp] : 0; }

uint32_t to_lower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    if (cp > kMaxCodepoint) return cp;
    return uint32_t(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp > kMaxCodepoint) cp = kReplacement;
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string to_utf8(uint32_t cp) {
    std::string s;
    append_utf8(s, cp);
    return s;
}

bool decode_utf8(std::string_view text, std::vector<uint32_t>& cps) {
    cps.clear();
    cps.reserve(text.size());
    const auto* p = reinterpret_cast<const uint8_t*>(text.data());
    const size_t n = text.size();
    bool clean = true;
    size_t i = 0;
    while (i < n) {
        const uint8_t b0 = p[i];
        if (b0 < 0x80) {
            cps.push_back(b0);
            ++i;
            continue;
        }
        size_t len = 0;
        uint32_t cp = 0;
        if ((b0 & 0xE0) == 0xC0) {
            len = 2;
            cp = b0 & 0x1F;
        } else if ((b0 & 0xF0) == 0xE0) {
            len = 3;
            cp = b0 & 0x0F;
        } else if ((b0 & 0xF8) == 0xF0) {
            len = 4;
            cp = b0 & 0x07;
        }
        bool ok = len != 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; ++k) {
            if ((p[i + k] & 0xC0) != 0x80) ok = false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (!ok || cp > kMaxCodepoint) {
            cps.push_back(kReplacement);
            clean = false;
            ++i;
            continue;
        }
        // Overlong forms and surrogates decode, but do not re-encode to the same bytes.
        const size_t canonical = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (canonical != len || (cp >= 0xD800 && cp <= 0xDFFF)) clean = false;
        cps.push_back(cp);
        i += len;
    }
    return clean;
}

std::vector<uint32_t> decode_utf8(std::string_view text) {
    std::vector<uint32_t> cps;
    decode_utf8(text, cps);
    return cps;
}

namespace {

// NFC of one segment through utf8proc.
void append_nfc(std::string& out, std::string_view seg) {
    utf8proc_uint8_t* mapped = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(seg.data()),
                                static_cast<utf8proc_ssize_t>(seg.size()), &mapped,
                                utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0 || mapped == nullptr) {
        out.append(seg);
    } else {
        out.append(reinterpret_cast<const char*>(mapped), size_t(n));
    }
    std::free(mapped);
}

}  // namespace

// An ASCII character never composes with what precedes it and is its own normal form, so text is
// normalized in segments that start at an ASCII character. A segment whose characters are all
// below U+0300 (lead bytes below 0xCC) is already NFC: every composition involves a character
// from U+0300 up, and no character below U+0300 changes under NFC.
std::string nfc(std::string_view text) {
    if (!utf8::is_valid(text)) return std::string(text);
    std::string out;
    out.reserve(text.size());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        size_t j = i + 1;
        bool simple = static_cast<uint8_t>(text[i]) < 0xCC;
        while (j < n && static_cast<uint8_t>(text[j]) >= 0x80) {
            if (static_cast<uint8_t>(text[j]) >= 0xCC && (static_cast<uint8_t>(text[j]) & 0xC0) == 0xC0) simple = false;
            ++j;
        }
        if (simple) {
            out.append(text.substr(i, j - i));
        } else {
            append_nfc(out, text.substr(i, j - i));
        }
        i = j;
    }
    return out;
}

std::string_view byte_to_unicode(uint8_t byte) {
    const ByteMap& m = byte_map();
    return std::string_view(m.utf8[byte].data(), m.len[byte]);
}

int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_map().to_byte[cp] : -1; }

}  // namespace cera::unicode
