// UTF-8 string helpers with Python's str semantics: whitespace, strip, split,
// case mapping (via utf8proc), repr quoting.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cera::jinja {

// Decodes UTF-8 into code points; an invalid byte becomes one code point of its own value.
std::vector<char32_t> utf8_decode(std::string_view s);
// Appends the UTF-8 encoding of `cp` to `out`.
// Number of code points (Python len()).
size_t utf8_length(std::string_view s);
// Python's str.isspace() for one code point.
bool is_py_space(char32_t cp);
// Python's str.isprintable() of one code point (what repr() leaves unescaped).
bool py_printable(char32_t cp);

// str.strip/lstrip/rstrip: `chars` empty means whitespace.
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars);
// str.split(sep=None, maxsplit): whitespace split when `sep` is null.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.rsplit(sep, maxsplit).
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.replace(old, new, count) (count < 0: all).
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
// Python repr() of a string: quoted and escaped.
std::string py_repr_string(std::string_view s);
// Python's str.splitlines(keepends): lines end at \n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029.
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// Code point slice [start, stop) with step, indices already normalised by the caller.
std::string utf8_slice(std::string_view s, const std::vector<int64_t>& indices);

}  // namespace cera::jinja
