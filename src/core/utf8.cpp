#include "core/utf8.h"

#include <cstdint>

namespace cera::utf8 {

Match match(std::string_view bytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    const uint8_t b0 = p[0];
    if (b0 < 0x80) return {1, 1};
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;  // no overlong 4-byte forms
        if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return {0, 0};
    }
    size_t k = 1;
    while (k < len && k < bytes.size()) {
        const uint8_t b = p[k];
        if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
        ++k;
    }
    return {len, k};
}

size_t valid_prefix(std::string_view bytes) {
    size_t i = 0;
    while (i < bytes.size()) {
        const Match m = match(bytes.substr(i));
        if (m.len == 0 || m.matched != m.len) return i;
        i += m.len;
    }
    return bytes.size();
}

}  // namespace cera::utf8
