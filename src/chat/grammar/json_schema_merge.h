// JSON Schema keywords that combine or restrict values before the converter writes a grammar
// (json_schema.cpp): allOf-style merging of two schemas, the values of enum / const that the keywords
// beside them allow, and the converter's errors.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace cera::grammar {

using Json = nlohmann::ordered_json;

// Whether a keyword says nothing about the values (title, description, examples, "x-" extensions, ...).
bool is_annotation(const std::string& keyword);
bool only_annotations(const Json& s);

// The converter's errors, naming the schema path ("" is the root).
[[noreturn]] void schema_unsupported(const std::string& path, const std::string& what);
[[noreturn]] void schema_invalid(const std::string& path, const std::string& what);
// A non-negative count keyword (minLength, maxItems, ...) or dflt when absent; at most 10000.
int64_t schema_count(const Json& s, const char* key, int64_t dflt, const std::string& path);

// The schema a local $ref points to.
using Resolver = std::function<const Json&(const std::string& ref, const std::string& path)>;
// A schema for the values that satisfy both a and b (depth: the converter's nesting guard).
Json merge_schemas(Json a, Json b, const std::string& path, const Resolver& resolve, int& depth);
// The values of s's const / enum that meet the keywords beside them (refusing keywords it cannot check).
std::vector<Json> enum_values(const Json& s, const std::string& path);

}  // namespace cera::grammar
