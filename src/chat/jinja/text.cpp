#include "chat/jinja/text.h"

#include <utf8proc.h>

#include <cstdarg>
#include <cstdio>

#include "chat/jinja/error.h"
#include "tokenizer/unicode.h"

namespace cera::jinja {

void eval_fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    throw EvalError(buf);
}

std::vector<char32_t> utf8_decode(std::string_view s) {
    std::vector<char32_t> out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
        if (n <= 0) {
            out.push_back(static_cast<unsigned char>(s[i]));
            ++i;
        } else {
            out.push_back(static_cast<char32_t>(cp));
            i += static_cast<size_t>(n);
        }
    }
    return out;
}

size_t utf8_length(std::string_view s) { return utf8_decode(s).size(); }

bool is_py_space(char32_t cp) {
    switch (cp) {
        case ' ': case '\t': case '\n': case '\r': case 0x0B: case 0x0C: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
        case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
            return true;
        default: return cp >= 0x2000 && cp <= 0x200A;
    }
}

namespace {

// Code points with their byte offsets, so results can be cut from the original bytes.
struct Decoded {
    std::vector<char32_t> cps;
    std::vector<size_t> offsets;  // n + 1 entries
};

Decoded decode_with_offsets(std::string_view s) {
    Decoded d;
    size_t i = 0;
    while (i < s.size()) {
        d.offsets.push_back(i);
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
        if (n <= 0) {
            d.cps.push_back(0xFFFFFFFF);  // never whitespace, never equal to a real code point
            ++i;
        } else {
            d.cps.push_back(static_cast<char32_t>(cp));
            i += static_cast<size_t>(n);
        }
    }
    d.offsets.push_back(s.size());
    return d;
}

bool in_chars(char32_t cp, const std::vector<char32_t>* chars) {
    if (!chars) return is_py_space(cp);
    for (char32_t c : *chars)
        if (c == cp) return true;
    return false;
}

template <typename F>
std::string map_case(std::string_view s, F f) {
    std::string out;
    out.reserve(s.size());
    Decoded d = decode_with_offsets(s);
    for (size_t i = 0; i < d.cps.size(); ++i) {
        if (d.cps[i] == 0xFFFFFFFF) {
            out.append(s.substr(d.offsets[i], d.offsets[i + 1] - d.offsets[i]));
        } else {
            unicode::append_utf8(out, uint32_t(f(static_cast<utf8proc_int32_t>(d.cps[i]), i, d.cps)));
        }
    }
    return out;
}

bool is_cased_letter(char32_t cp) {
    if (cp == 0xFFFFFFFF) return false;
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars) {
    Decoded d = decode_with_offsets(s);
    std::vector<char32_t> set;
    if (chars) set = utf8_decode(*chars);
    const std::vector<char32_t>* cs = chars ? &set : nullptr;
    size_t b = 0, e = d.cps.size();
    if (left)
        while (b < e && in_chars(d.cps[b], cs)) ++b;
    if (right)
        while (e > b && in_chars(d.cps[e - 1], cs)) --e;
    return std::string(s.substr(d.offsets[b], d.offsets[e] - d.offsets[b]));
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
    std::vector<std::string> out;
    if (sep) {
        if (sep->empty()) eval_fail("split(): empty separator");
        size_t pos = 0;
        while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
            size_t f = s.find(*sep, pos);
            if (f == std::string_view::npos) break;
            out.emplace_back(s.substr(pos, f - pos));
            pos = f + sep->size();
        }
        out.emplace_back(s.substr(pos));
        return out;
    }
    Decoded d = decode_with_offsets(s);
    size_t i = 0, n = d.cps.size();
    while (true) {
        while (i < n && is_py_space(d.cps[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
            size_t e = n;
            while (e > i && is_py_space(d.cps[e - 1])) --e;
            out.emplace_back(s.substr(d.offsets[i], d.offsets[e] - d.offsets[i]));
            break;
        }
        size_t j = i;
        while (j < n && !is_py_space(d.cps[j])) ++j;
        out.emplace_back(s.substr(d.offsets[i], d.offsets[j] - d.offsets[i]));
        i = j;
    }
    return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
    std::vector<std::string> out;
    size_t start = 0, i = 0;
    auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
    while (i < s.size()) {
        const unsigned c = byte(i);
        size_t n = 0;  // bytes of the line boundary at i
        if (c == '\r')
            n = byte(i + 1) == '\n' ? 2 : 1;
        else if (c == '\n' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E))
            n = 1;
        else if (c == 0xC2 && byte(i + 1) == 0x85)
            n = 2;  // U+0085
        else if (c == 0xE2 && byte(i + 1) == 0x80 && (byte(i + 2) == 0xA8 || byte(i + 2) == 0xA9))
            n = 3;  // U+2028/9
        if (n == 0) {
            ++i;
            continue;
        }
        out.emplace_back(s.substr(start, i + (keepends ? n : 0) - start));
        i += n;
        start = i;
    }
    if (start < s.size()) out.emplace_back(s.substr(start));
    return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
    if (maxsplit < 0) return py_split(s, sep, maxsplit);
    if (!sep) {  // whitespace runs from the right, at most maxsplit of them
        Decoded d = decode_with_offsets(s);
        std::vector<std::string> rev;
        size_t e = d.cps.size();
        while (true) {
            while (e > 0 && is_py_space(d.cps[e - 1])) --e;
            if (e == 0) break;
            if (static_cast<int64_t>(rev.size()) >= maxsplit) {  // the rest, its leading whitespace kept
                rev.emplace_back(s.substr(0, d.offsets[e]));
                break;
            }
            size_t b = e;
            while (b > 0 && !is_py_space(d.cps[b - 1])) --b;
            rev.emplace_back(s.substr(d.offsets[b], d.offsets[e] - d.offsets[b]));
            e = b;
        }
        return std::vector<std::string>(rev.rbegin(), rev.rend());
    }
    if (sep->empty()) eval_fail("rsplit(): empty separator");
    std::vector<std::string> rev;
    size_t end = s.size();
    while (static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < sep->size()) break;
        size_t f = s.rfind(*sep, end - sep->size());
        if (f == std::string_view::npos) break;
        rev.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
        end = f;
    }
    rev.emplace_back(s.substr(0, end));
    return std::vector<std::string>(rev.rbegin(), rev.rend());
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
    std::string out;
    if (from.empty()) {
        // Python inserts `to` between every code point (and at both ends).
        Decoded d = decode_with_offsets(s);
        int64_t done = 0;
        for (size_t i = 0; i <= d.cps.size(); ++i) {
            if (count < 0 || done < count) {
                out.append(to);
                ++done;
            }
            if (i < d.cps.size()) out.append(s.substr(d.offsets[i], d.offsets[i + 1] - d.offsets[i]));
        }
        return out;
    }
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        size_t f = s.find(from, pos);
        if (f == std::string_view::npos) break;
        out.append(s.substr(pos, f - pos));
        out.append(to);
        pos = f + from.size();
        ++done;
    }
    out.append(s.substr(pos));
    return out;
}

std::string py_upper(std::string_view s) {
    return map_case(s, [](utf8proc_int32_t c, size_t, const std::vector<char32_t>&) { return utf8proc_toupper(c); });
}

std::string py_lower(std::string_view s) {
    return map_case(s, [](utf8proc_int32_t c, size_t, const std::vector<char32_t>&) { return utf8proc_tolower(c); });
}

std::string py_title(std::string_view s) {
    // Python: a cased letter following an uncased character starts a word.
    return map_case(s, [](utf8proc_int32_t c, size_t i, const std::vector<char32_t>& cps) {
        bool prev_cased = i > 0 && is_cased_letter(cps[i - 1]);
        return prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
    });
}

std::string py_capitalize(std::string_view s) {
    return map_case(s, [](utf8proc_int32_t c, size_t i, const std::vector<char32_t>&) {
        return i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c);
    });
}

bool py_printable(char32_t cp) {
    if (cp == ' ') return true;
    switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO:
        case UTF8PROC_CATEGORY_CN:
        case UTF8PROC_CATEGORY_ZL:
        case UTF8PROC_CATEGORY_ZP:
        case UTF8PROC_CATEGORY_ZS:
            return false;
        default:
            return true;
    }
}

std::string py_repr_string(std::string_view s) {
    bool has_single = s.find('\'') != std::string_view::npos;
    bool has_double = s.find('"') != std::string_view::npos;
    char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    const Decoded d = decode_with_offsets(s);
    for (size_t i = 0; i < d.cps.size(); ++i) {
        const char32_t cp = d.cps[i];
        char buf[16];
        if (cp == static_cast<char32_t>(quote) || cp == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(cp));
        } else if (cp == '\n') {
            out += "\\n";
        } else if (cp == '\r') {
            out += "\\r";
        } else if (cp == '\t') {
            out += "\\t";
        } else if (cp == 0xFFFFFFFF || py_printable(cp)) {  // (a byte outside UTF-8 stays as it is)
            out.append(s.substr(d.offsets[i], d.offsets[i + 1] - d.offsets[i]));
        } else {
            // Python's repr: \xhh below 0x100, \uhhhh below 0x10000, else \Uhhhhhhhh.
            std::snprintf(buf, sizeof(buf),
                          cp < 0x100     ? "\\x%02x"
                          : cp < 0x10000 ? "\\u%04x"
                                         : "\\U%08x",
                          static_cast<unsigned>(cp));
            out += buf;
        }
    }
    out.push_back(quote);
    return out;
}

std::string utf8_slice(std::string_view s, const std::vector<int64_t>& indices) {
    Decoded d = decode_with_offsets(s);
    std::string out;
    for (int64_t i : indices) {
        size_t k = static_cast<size_t>(i);
        out.append(s.substr(d.offsets[k], d.offsets[k + 1] - d.offsets[k]));
    }
    return out;
}

}  // namespace cera::jinja
