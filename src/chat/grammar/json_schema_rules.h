// The JSON Schema converter's shared GBNF rules (json_schema.cpp): the primitives it emits when a schema
// uses them, what each refers to, and the string formats with the lengths of the values they write.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cera::grammar {

// Shared primitives: their GBNF bodies, emitted when used.
extern const std::map<std::string, std::string> kPrimitives;
// What each primitive refers to.
extern const std::map<std::string, std::vector<std::string>> kPrimitiveDeps;

// The string formats, with the shortest and longest value their rules write (in characters, all ASCII):
// minLength / maxLength beside a format hold when they admit all of that range. max_len < 0: an
// annotation (password, binary) that validators accept any string for, a plain string.
struct StringFormat {
    const char* name;
    int64_t min_len, max_len;
};
extern const std::vector<StringFormat> kFormats;

}  // namespace cera::grammar
