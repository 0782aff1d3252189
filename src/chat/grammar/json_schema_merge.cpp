#include "chat/grammar/json_schema_merge.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace cera::grammar {

bool is_annotation(const std::string& keyword) {
    // Annotations of JSON Schema and of OpenAPI (whose "x-" extensions are annotations too).
    static const std::set<std::string> kAnnotations = {
        "title",    "description",   "$schema",      "$id",      "$comment",         "$anchor",        "default",
        "examples", "example",       "deprecated",   "readOnly", "writeOnly",        "$defs",          "definitions",
        "strict",   "discriminator", "externalDocs", "xml",      "contentMediaType", "contentEncoding"};
    return kAnnotations.count(keyword) > 0 || keyword.rfind("x-", 0) == 0;
}

void schema_unsupported(const std::string& path, const std::string& what) {
    throw_error(ErrorCode::kUnsupported, "JSON Schema at '%s': %s is not supported", path.empty() ? "/" : path.c_str(),
                what.c_str());
}

void schema_invalid(const std::string& path, const std::string& what) {
    throw_error(ErrorCode::kInvalidArgument, "JSON Schema at '%s': %s", path.empty() ? "/" : path.c_str(),
                what.c_str());
}

int64_t schema_count(const Json& s, const char* key, int64_t dflt, const std::string& path) {
    if (!s.contains(key)) return dflt;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
        schema_invalid(path, std::string(key) + " must be a non-negative integer");
    if (s[key].get<int64_t>() > 10000) schema_unsupported(path, std::string(key) + " above 10000");
    return s[key].get<int64_t>();
}

namespace {

int64_t code_points(const std::string& s) {
    return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

}  // namespace

// The values of const / enum that also meet the keywords beside them: type, numeric bounds,
// multipleOf, string lengths. Other keywords beside const / enum are refused, not ignored.
std::vector<Json> enum_values(const Json& s, const std::string& path) {
    std::vector<Json> values;
    if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) schema_invalid(path, "enum must be a non-empty array");
        for (const auto& v : s["enum"])
            if (!s.contains("const") || v == s["const"]) values.push_back(v);
    } else {
        values.push_back(s["const"]);
    }
    static const std::set<std::string> checked = {
        "const",      "enum",      "type",     "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf", "minLength", "maxLength"};
    for (const auto& [k, v] : s.items())
        if (!checked.count(k) && !is_annotation(k)) schema_unsupported(path, "'" + k + "' beside enum or const");
    auto is_type = [](const Json& v, const std::string& t) {
        if (t == "integer")
            return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                             std::floor(v.get<double>()) == v.get<double>());
        return (t == "number" && v.is_number()) || (t == "string" && v.is_string()) ||
               (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
               (t == "array" && v.is_array());
    };
    auto meets = [&](const Json& v) {
        if (s.contains("type")) {
            const Json types = s["type"].is_array() ? s["type"] : Json::array({s["type"]});
            if (std::none_of(types.begin(), types.end(),
                             [&](const Json& t) { return t.is_string() && is_type(v, t.get<std::string>()); }))
                return false;
        }
        if (v.is_number()) {
            const double x = v.get<double>();
            for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
                if (!s.contains(key)) continue;
                const std::string k = key;
                const bool is_max = k.find("aximum") != std::string::npos;
                const Json& b = s[key];
                if (b.is_boolean()) continue;  // draft 4's modifier, read with its bound
                if (!b.is_number()) schema_invalid(path, k + " must be a number");
                const char* modifier = is_max ? "exclusiveMaximum" : "exclusiveMinimum";
                const bool exclusive = k.rfind("exclusive", 0) == 0 ||
                                       (s.contains(modifier) && s[modifier].is_boolean() && s[modifier].get<bool>());
                const double lim = b.get<double>();
                if (is_max ? (x > lim || (exclusive && x == lim)) : (x < lim || (exclusive && x == lim))) return false;
            }
            if (s.contains("multipleOf")) {
                if (!s["multipleOf"].is_number() || s["multipleOf"].get<double>() <= 0)
                    schema_invalid(path, "multipleOf must be a number above 0");
                const double q = x / s["multipleOf"].get<double>();
                if (std::fabs(q - std::nearbyint(q)) > 1e-9 * std::max(1.0, std::fabs(q))) return false;
            }
        }
        if (v.is_string()) {
            const int64_t n = code_points(v.get<std::string>());
            if (n < schema_count(s, "minLength", 0, path)) return false;
            if (const int64_t hi = schema_count(s, "maxLength", -1, path); hi >= 0 && n > hi) return false;
        }
        return true;
    };
    values.erase(std::remove_if(values.begin(), values.end(), [&](const Json& v) { return !meets(v); }), values.end());
    if (values.empty()) schema_invalid(path, "no value of enum / const meets the keywords beside it");
    return values;
}

bool only_annotations(const Json& s) {
    for (const auto& [k, v] : s.items())
        if (!is_annotation(k)) return false;
    return true;
}

// A value must satisfy both a and b (allOf, or anyOf / oneOf branches with keywords beside them): the
// union of required; a property named by both takes both schemas, one named by one side takes the
// other side's additionalProperties too (false: it cannot appear); additionalProperties of both; the
// other keywords of both (equal where both have one). A $ref in b stands for its target with the
// keywords beside it.
Json merge_schemas(Json a, Json b, const std::string& path, const Resolver& resolve, int& depth) {
    if (++depth > 200) schema_invalid(path, "nested too deeply");
    struct Guard {
        int& d;
        ~Guard() { --d; }
    } guard{depth};
    if (b.is_object() && b.contains("$ref")) {
        if (!b["$ref"].is_string()) schema_invalid(path, "$ref must be a string");
        Json rest = b;
        rest.erase("$ref");
        const Json& target = resolve(b["$ref"], path);
        b = only_annotations(rest) ? target : merge_schemas(target, rest, path, resolve, depth);
    }
    if (b.is_boolean() && b.get<bool>()) return a;
    if (!b.is_object()) schema_invalid(path, "allOf holds a schema that is not an object");
    if (a.is_boolean()) {  // (a $ref's target)
        if (!a.get<bool>()) return a;
        a = Json::object();
    }
    if (!a.is_object()) schema_invalid(path, "a schema must be an object or a boolean");
    auto both = [](const Json& x, const Json& y) {  // a schema for values that satisfy x and y
        if (x == y || (y.is_boolean() && y.get<bool>())) return x;
        if (x.is_boolean() && x.get<bool>()) return y;
        if ((x.is_boolean() && !x.get<bool>()) || (y.is_boolean() && !y.get<bool>())) return Json(false);
        return Json{{"allOf", Json::array({x, y})}};
    };
    const Json no_props = Json::object();
    const Json& pa = a.contains("properties") ? a["properties"] : no_props;
    const Json& pb = b.contains("properties") ? b["properties"] : no_props;
    if (!pa.is_object() || !pb.is_object()) schema_invalid(path, "properties must be an object");
    const Json extra_a = a.contains("additionalProperties") ? a["additionalProperties"] : Json(true);
    const Json extra_b = b.contains("additionalProperties") ? b["additionalProperties"] : Json(true);
    if (a.contains("properties") || b.contains("properties")) {
        Json props = Json::object();
        for (const auto& [k, v] : pa.items()) props[k] = both(v, pb.contains(k) ? pb[k] : extra_b);
        for (const auto& [k, v] : pb.items())
            if (!pa.contains(k)) props[k] = both(extra_a, v);
        a["properties"] = props;
    }
    if (a.contains("additionalProperties") || b.contains("additionalProperties"))
        a["additionalProperties"] = both(extra_a, extra_b);
    for (auto& [k, v] : b.items()) {
        if (k == "properties" || k == "additionalProperties") continue;
        if (k == "required" && a.contains(k)) {
            if (!v.is_array() || !a[k].is_array()) schema_invalid(path, "required must be an array");
            for (auto& r : v)
                if (std::find(a[k].begin(), a[k].end(), r) == a[k].end()) a[k].push_back(r);
        } else if (a.contains(k) && a[k] != v && !is_annotation(k)) {
            schema_unsupported(path, "allOf with different values of '" + k + "'");
        } else {
            a[k] = v;
        }
    }
    return a;
}

}  // namespace cera::grammar
