// JSON Schema to GBNF. Each schema node becomes a rule (named after its path); the primitives (string,
// number, ...) are shared rules emitted once. Values carry no whitespace of their own: `ws` (bounded)
// sits only between the tokens of objects and arrays, so the text ends right after the top value and
// a schema with bounded strings and arrays has a bounded output.
#include "chat/grammar/json_schema.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "chat/grammar/json_schema_merge.h"
#include "chat/grammar/json_schema_rules.h"
#include "chat/grammar/multiple_of.h"
#include "chat/grammar/number_range.h"
#include "core/check.h"

namespace cera::grammar {
namespace {

// A GBNF string literal for bytes.
std::string literal(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\')
            out += '\\', out += char(c);
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else
            out += char(c);
    }
    return out + "\"";
}

std::string sanitize(const std::string& s) {
    std::string out;
    for (char c : s) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        out += ok ? c : '-';
    }
    if (out.size() > 40) out.resize(40);
    return out.empty() ? "x" : out;
}

class Converter {
 public:
    explicit Converter(const Json& root) : root_(root) {}

    std::string run() {
        const std::string top = visit(root_, "root", "");
        std::string out = "root ::= " + top + "\n";
        for (const auto& [name, body] : rules_)
            if (name != "root") out += name + " ::= " + body + "\n";
        std::set<std::string> done;
        std::vector<std::string> todo(used_.begin(), used_.end());
        while (!todo.empty()) {
            const std::string p = todo.back();
            todo.pop_back();
            if (!done.insert(p).second) continue;
            out += p + " ::= " + kPrimitives.at(p) + "\n";
            if (auto it = kPrimitiveDeps.find(p); it != kPrimitiveDeps.end())
                todo.insert(todo.end(), it->second.begin(), it->second.end());
        }
        return out;
    }

 private:
    [[noreturn]] static void unsupported(const std::string& path, const std::string& what) {
        schema_unsupported(path, what);
    }
    [[noreturn]] static void invalid(const std::string& path, const std::string& what) { schema_invalid(path, what); }
    static int64_t count(const Json& s, const char* key, int64_t dflt, const std::string& path) {
        return schema_count(s, key, dflt, path);
    }
    Json merge(const Json& a, const Json& b, const std::string& path) {
        return merge_schemas(
            a, b, path, [this](const std::string& r, const std::string& p) -> const Json& { return resolve(r, p); },
            depth_);
    }

    std::string prim(const std::string& name) {
        used_.insert(name);
        return name;
    }

    std::string new_rule(const std::string& hint) {
        std::string name = sanitize(hint);
        if (kPrimitives.count(name) || rules_.count(name) || name == "root") {
            int& k = next_suffix_.try_emplace(name, 2).first->second;  // numbered from where the last one ended
            while (kPrimitives.count(name + "-" + std::to_string(k)) || rules_.count(name + "-" + std::to_string(k)))
                ++k;
            name += "-" + std::to_string(k++);
        }
        rules_[name] = "";
        return name;
    }

    const Json& resolve(const std::string& ref, const std::string& path) {
        if (ref == "#") return root_;
        if (ref.rfind("#/", 0) != 0) unsupported(path, "$ref '" + ref + "' (only local references '#/...')");
        const Json* node = &root_;
        size_t p = 2;
        while (p <= ref.size()) {
            const size_t slash = std::min(ref.find('/', p), ref.size());
            std::string key = ref.substr(p, slash - p);
            for (size_t i; (i = key.find("~1")) != std::string::npos;) key.replace(i, 2, "/");
            for (size_t i; (i = key.find("~0")) != std::string::npos;) key.replace(i, 2, "~");
            if (!node->is_object() || !node->contains(key)) invalid(path, "$ref '" + ref + "' points nowhere");
            node = &(*node)[key];
            p = slash + 1;
        }
        return *node;
    }

    // An expression for `s`; composite schemas get a rule named after `hint`.
    std::string visit(const Json& s, const std::string& hint, const std::string& path) {
        if (++depth_ > 200) invalid(path, "nested too deeply");
        struct Guard {
            int& d;
            ~Guard() { --d; }
        } guard{depth_};
        if (s.is_boolean()) {
            if (!s.get<bool>()) invalid(path, "the schema 'false' accepts nothing");
            return prim("value");
        }
        if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");
        for (const auto& [k, v] : s.items()) {
            static const std::set<std::string> known = {"type",
                                                        "properties",
                                                        "required",
                                                        "additionalProperties",
                                                        "items",
                                                        "prefixItems",
                                                        "minItems",
                                                        "maxItems",
                                                        "enum",
                                                        "const",
                                                        "anyOf",
                                                        "oneOf",
                                                        "allOf",
                                                        "$ref",
                                                        "minLength",
                                                        "maxLength",
                                                        "pattern",
                                                        "format",
                                                        "minimum",
                                                        "maximum",
                                                        "exclusiveMinimum",
                                                        "exclusiveMaximum",
                                                        "multipleOf",
                                                        "minProperties",
                                                        "maxProperties",
                                                        "uniqueItems",
                                                        "nullable"};
            if (!known.count(k) && !is_annotation(k)) unsupported(path, "the keyword '" + k + "'");
        }
        if (s.contains("nullable")) {  // OpenAPI's (ajv's too): true adds null to the schema's values
            if (!s["nullable"].is_boolean()) invalid(path, "nullable must be a boolean");
            Json rest = s;
            rest.erase("nullable");
            if (!s["nullable"].get<bool>()) return visit(rest, hint, path);
            return rule(hint, visit(rest, hint + "-v", path) + " | " + prim("null"));
        }
        if (s.contains("$ref")) {
            if (!s["$ref"].is_string()) invalid(path, "$ref must be a string");
            const std::string ref = s["$ref"];
            Json siblings = s;
            siblings.erase("$ref");
            for (auto it = siblings.begin(); it != siblings.end();) {
                if (is_annotation(it.key()))
                    it = siblings.erase(it);
                else
                    ++it;
            }
            // Keywords beside a $ref apply too: the pair is a rule of its own, so a recursion through it closes.
            const std::string key = siblings.empty() ? ref : ref + " & " + siblings.dump();
            auto it = refs_.find(key);
            if (it != refs_.end()) {
                if (at_start_.count(key))
                    invalid(path, "$ref '" + ref + "' comes back to itself before any '{' or '[' (a left recursion)");
                return it->second;
            }
            const std::string name = new_rule(ref == "#" ? "root-ref" : ref.substr(ref.rfind('/') + 1));
            refs_[key] = name;
            at_start_.insert(key);
            rules_[name] = siblings.empty() ? visit(resolve(ref, path + "/$ref"), name, ref.substr(1))
                                            : visit(merge(siblings, s, path), name, path);
            at_start_.erase(key);
            return name;
        }
        for (const char* key : {"anyOf", "oneOf"}) {
            if (!s.contains(key)) continue;
            const Json& list = s[key];
            if (!list.is_array() || list.empty()) invalid(path, std::string(key) + " must be a non-empty array");
            Json rest = s;
            rest.erase(key);
            std::string out;
            for (size_t i = 0; i < list.size(); ++i) {
                Json merged = rest.empty() || only_annotations(rest) ? list[i] : merge(rest, list[i], path);
                out += (i ? " | " : "") +
                       visit(merged, hint + "-" + std::to_string(i), path + "/" + key + "/" + std::to_string(i));
            }
            return rule(hint, out);
        }
        if (s.contains("allOf")) {
            if (!s["allOf"].is_array() || s["allOf"].empty()) invalid(path, "allOf must be a non-empty array");
            Json merged = s;
            merged.erase("allOf");
            for (const auto& sub : s["allOf"]) merged = merge(merged, sub, path + "/allOf");
            return visit(merged, hint, path);
        }
        if (s.contains("const") || s.contains("enum")) {
            std::string out;
            for (const auto& v : enum_values(s, path)) out += (out.empty() ? "" : " | ") + literal(v.dump());
            return rule(hint, out);
        }
        if (s.contains("type") && s["type"].is_array()) {
            std::string out;
            for (size_t i = 0; i < s["type"].size(); ++i) {
                Json one = s;
                one["type"] = s["type"][i];
                out += (i ? " | " : "") + visit(one, hint + "-" + std::to_string(i), path);
            }
            if (out.empty()) invalid(path, "an empty list of types");
            return rule(hint, out);
        }
        std::string type = s.contains("type") ? (s["type"].is_string() ? s["type"].get<std::string>() : "?") : "";
        if (type.empty()) {  // inferred from the keywords present
            if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required") ||
                s.contains("minProperties") || s.contains("maxProperties"))
                type = "object";
            else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                     s.contains("maxItems") || s.contains("uniqueItems"))
                type = "array";
            else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
                     s.contains("format"))
                type = "string";
            else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                     s.contains("exclusiveMaximum") || s.contains("multipleOf"))
                type = "number";
            else
                return prim("value");
        }
        if (type == "object" || type == "array") {  // the values inside come after a '{' or '['
            std::set<std::string> outer;
            std::swap(outer, at_start_);
            struct Restore {
                std::set<std::string>& to;
                std::set<std::string>& from;
                ~Restore() { std::swap(to, from); }
            } restore{at_start_, outer};
            return type == "object" ? object(s, hint, path) : array(s, hint, path);
        }
        if (type == "string") return string(s, hint, path);
        if (type == "integer") return integer(s, hint, path);
        if (type == "number") return number(s, hint, path);
        if (type == "boolean") return prim("boolean");
        if (type == "null") return prim("null");
        invalid(path, "unknown type " + s["type"].dump());
    }

    std::string rule(const std::string& hint, const std::string& body) {
        const std::string name = new_rule(hint);
        rules_[name] = body;
        return name;
    }

    static std::string repeat(const std::string& item, int64_t lo, int64_t hi) {
        if (hi < 0)
            return lo == 0   ? "(" + item + ")*"
                   : lo == 1 ? "(" + item + ")+"
                             : "(" + item + "){" + std::to_string(lo) + ",}";
        if (lo == hi) return lo == 0 ? "\"\"" : "(" + item + "){" + std::to_string(lo) + "}";
        return "(" + item + "){" + std::to_string(lo) + "," + std::to_string(hi) + "}";
    }

    std::string string(const Json& s, const std::string& hint, const std::string& path) {
        if (s.contains("format")) {
            const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
            const StringFormat* fmt = nullptr;
            for (const StringFormat& k : kFormats)
                if (f == k.name) fmt = &k;
            if (!fmt)
                unsupported(path, "format '" + f +
                                      "' (supported: date, time, date-time, duration, uuid, email, uri, uri-reference, "
                                      "ipv4, ipv6, hostname, json-pointer, relative-json-pointer, password, binary)");
            if (fmt->max_len < 0) {  // an annotation: the string as it would be without it
                Json rest = s;
                rest.erase("format");
                return string(rest, hint, path);
            }
            if (s.contains("pattern")) unsupported(path, "format together with pattern");
            const int64_t lo = count(s, "minLength", 0, path), hi = count(s, "maxLength", -1, path);
            std::string name = f;
            if (lo > fmt->min_len || (hi >= 0 && hi < fmt->max_len)) {
                // The eight-group form of ipv6 alone is 15 to 39 characters long.
                if (f == "ipv6" && lo <= 15 && (hi < 0 || hi >= 39))
                    name = "ipv6-full";
                else
                    unsupported(path, "format '" + f + "' with minLength " + std::to_string(lo) + " / maxLength " +
                                          (hi < 0 ? std::string("none") : std::to_string(hi)) + " (its values are " +
                                          std::to_string(fmt->min_len) + " to " + std::to_string(fmt->max_len) +
                                          " characters long)");
            }
            const std::string body = f == "date-time" ? prim("date") + " \"T\" " + prim("time") : prim(name);
            return rule(hint, "\"\\\"\" " + body + " \"\\\"\"");
        }
        if (s.contains("pattern")) {
            if (!s["pattern"].is_string()) invalid(path, "pattern must be a string");
            if (s.contains("minLength") || s.contains("maxLength")) unsupported(path, "pattern together with a length");
            return rule(hint, "\"\\\"\" (" + regex_to_gbnf(s["pattern"].get<std::string>()) + ") \"\\\"\"");
        }
        const int64_t lo = count(s, "minLength", 0, path), hi = count(s, "maxLength", -1, path);
        if (hi >= 0 && hi < lo) invalid(path, "maxLength < minLength");
        if (lo == 0 && hi < 0) return prim("string");
        return rule(hint, "\"\\\"\" " + repeat(prim("char"), lo, hi) + " \"\\\"\"");
    }

    // Bounds make a number decimal (no exponent) within them (number_range.h); the tighter of
    // minimum / exclusiveMinimum (maximum / exclusiveMaximum) applies, as does a draft-4 boolean
    // exclusiveMinimum / exclusiveMaximum beside minimum / maximum.
    std::string number(const Json& s, const std::string& hint, const std::string& path) {
        std::optional<NumberBound> lo, hi;
        auto bound = [&](const char* key, bool is_max, bool exclusive) {
            if (!s.contains(key)) return;
            const Json& j = s[key];
            if (j.is_boolean()) return;  // draft 4's modifier, read below
            if (!j.is_number()) invalid(path, std::string(key) + " must be a number");
            const std::optional<Decimal> d = Decimal::parse(j.dump());
            if (!d) invalid(path, std::string(key) + " must be a finite number");
            const bool draft4 = !exclusive && s.contains(is_max ? "exclusiveMaximum" : "exclusiveMinimum") &&
                                s[is_max ? "exclusiveMaximum" : "exclusiveMinimum"].is_boolean() &&
                                s[is_max ? "exclusiveMaximum" : "exclusiveMinimum"].get<bool>();
            const NumberBound b{*d, !(exclusive || draft4)};
            std::optional<NumberBound>& cur = is_max ? hi : lo;
            const int c = cur ? compare(b.value, cur->value) : 0;
            if (!cur || (is_max ? c < 0 : c > 0) || (c == 0 && !b.inclusive)) cur = b;
        };
        bound("minimum", false, false);
        bound("maximum", true, false);
        bound("exclusiveMinimum", false, true);
        bound("exclusiveMaximum", true, true);
        if (s.contains("multipleOf")) return multiple(s, false, lo, hi, hint, path);
        if (!lo && !hi) return prim("number");
        const std::optional<std::string> body = number_range(lo, hi);
        if (!body) invalid(path, "no number lies between minimum and maximum");
        return rule(hint, *body);
    }

    std::string integer(const Json& s, const std::string& hint, const std::string& path) {
        constexpr int64_t kBig = 9999999999999999;  // 16 digits: the unbounded integer rule's reach
        int64_t lo = -kBig, hi = kBig;
        bool bounded = false;
        auto bound = [&](const char* key, int64_t& v, bool is_max, bool exclusive) {
            if (!s.contains(key)) return;
            const Json& j = s[key];
            if (j.is_boolean()) return;  // draft 4's modifier, read below
            if (!j.is_number()) invalid(path, std::string(key) + " must be a number");
            const char* modifier = is_max ? "exclusiveMaximum" : "exclusiveMinimum";
            if (!exclusive && s.contains(modifier) && s[modifier].is_boolean() && s[modifier].get<bool>())
                exclusive = true;
            const double d = j.get<double>();
            int64_t x;
            bool integral = false;  // the bound is itself an integer (an exclusive one then moves by one)
            if (j.is_number_integer() && std::fabs(d) <= 1e16) {
                x = j.get<int64_t>(), integral = true;
            } else if (std::fabs(d) >= 1e16) {  // (a double that far out is an integer, beyond the rule's reach)
                x = d > 0 ? kBig + 1 : -kBig - 1;
            } else {
                const double r = is_max ? std::floor(d) : std::ceil(d);
                x = int64_t(r), integral = r == d;
            }
            if (exclusive && integral) x += is_max ? -1 : 1;
            if (is_max ? x < -kBig : x > kBig)
                unsupported(path, std::string(key) + " " + j.dump() + " (integers here have at most 16 digits)");
            x = std::clamp(x, -kBig, kBig);
            v = is_max ? std::min(v, x) : std::max(v, x);
            bounded = true;
        };
        bound("minimum", lo, false, false);
        bound("maximum", hi, true, false);
        bound("exclusiveMinimum", lo, false, true);
        bound("exclusiveMaximum", hi, true, true);
        if (s.contains("multipleOf")) {
            auto as_bound = [](int64_t v) {
                return NumberBound{Decimal{v < 0, std::to_string(v < 0 ? -uint64_t(v) : uint64_t(v)), ""}, true};
            };
            return multiple(s, true, as_bound(lo), as_bound(hi), hint, path);
        }
        if (!bounded) return prim("integer");
        if (lo > hi) invalid(path, "no integer lies between minimum and maximum");
        std::vector<std::string> alts;
        if (lo < 0) alts.push_back("\"-\" (" + uint_range(uint64_t(std::max<int64_t>(-hi, 1)), uint64_t(-lo)) + ")");
        if (hi >= 0) alts.push_back(uint_range(uint64_t(std::max<int64_t>(lo, 0)), uint64_t(hi)));
        std::string out;
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return rule(hint, out);
    }

    // multipleOf on an integer or a number, within its bounds (multiple_of.h): a number's step with k
    // fraction digits makes numbers written with exactly k of them.
    std::string multiple(const Json& s, bool integer_only, const std::optional<NumberBound>& lo,
                         const std::optional<NumberBound>& hi, const std::string& hint, const std::string& path) {
        const Json& j = s["multipleOf"];
        const std::optional<Decimal> m = j.is_number() ? Decimal::parse(j.dump()) : std::nullopt;
        if (!m || m->negative || m->is_zero()) invalid(path, "multipleOf must be a number above 0");
        const std::optional<MultipleStep> step = multiple_step(*m, integer_only);
        if (!step)
            unsupported(path, "multipleOf " + j.dump() +
                                  " (at most 16 decimals, its digits without the point at most "
                                  "1000000)");
        const MultipleRange r =
            multiple_range(*step, lo, hi, [&](const std::string& body) { return rule(hint + "-m", body); });
        if (r.too_large) unsupported(path, "multipleOf " + j.dump() + ": its grammar would be too large");
        if (!r.expr) invalid(path, "no multiple of " + j.dump() + " lies between minimum and maximum");
        return rule(hint, *r.expr);
    }

    // An array with uniqueItems whose items are one of a few values (an enum, a const, booleans, null):
    // a rule per set of values written so far, each next value one not in it.
    std::string unique_array(const Json& s, int64_t lo, int64_t hi, const std::string& hint, const std::string& path) {
        if (s.contains("prefixItems")) unsupported(path, "uniqueItems with prefixItems");
        const Json items = s.contains("items") ? s["items"] : Json::object();
        if (!items.is_object()) unsupported(path, "uniqueItems on items other than an enum, a const, booleans or null");
        for (const auto& [k, v] : items.items())
            if (k != "enum" && k != "const" && k != "type" && !is_annotation(k))
                unsupported(path + "/items", "the keyword '" + k + "' beside uniqueItems");
        if (items.contains("enum") && items.contains("const")) unsupported(path + "/items", "enum and const together");
        const std::string type =
            items.contains("type") ? (items["type"].is_string() ? items["type"].get<std::string>() : "?") : "";
        auto of_type = [&](const Json& v) {
            if (type.empty()) return true;
            if (type == "integer") return v.is_number_integer() || (v.is_number_float() && v == std::floor(double(v)));
            return (type == "string" && v.is_string()) || (type == "number" && v.is_number()) ||
                   (type == "boolean" && v.is_boolean()) || (type == "null" && v.is_null()) ||
                   (type == "object" && v.is_object()) || (type == "array" && v.is_array());
        };
        // Values of the type, each once: equal as JSON (1 and 1.0, objects whatever their keys' order).
        std::vector<std::string> values;
        std::vector<nlohmann::json> seen;
        auto add = [&](const Json& v) {
            const nlohmann::json plain = nlohmann::json::parse(v.dump());
            if (!of_type(v) || std::find(seen.begin(), seen.end(), plain) != seen.end()) return;
            seen.push_back(plain);
            values.push_back(literal(v.dump()));
        };
        if (items.contains("enum") && items["enum"].is_array())
            for (const auto& v : items["enum"]) add(v);
        else if (items.contains("const"))
            add(items["const"]);
        else if (type == "boolean")
            add(true), add(false);
        else if (type == "null")
            add(nullptr);
        else
            unsupported(path, "uniqueItems on items other than an enum, a const, booleans or null");
        if (values.size() > 12) unsupported(path, "uniqueItems over more than 12 values");
        const int64_t n = int64_t(values.size());
        if (lo > n) invalid(path, "minItems exceeds the distinct values the items may take");
        const std::string ws = prim("ws"), sep = ws + " \",\" " + ws + " ";
        std::map<uint32_t, std::string> memo;
        // after(used): the values after those in `used` (a bit a value), each after a comma.
        std::function<std::string(uint32_t)> after = [&](uint32_t used) -> std::string {
            if (auto it = memo.find(used); it != memo.end()) return it->second;
            const int64_t k = std::popcount(used);
            std::string body = k >= lo ? "\"\"" : "";
            if (hi < 0 || k < hi)
                for (int64_t v = 0; v < n; ++v)
                    if (!(used >> v & 1))
                        body += (body.empty() ? "" : " | ") + sep + values[size_t(v)] + " " + after(used | 1u << v);
            return memo[used] = rule(hint + "-u" + std::to_string(used), body);
        };
        std::string first;
        if (hi != 0)
            for (int64_t v = 0; v < n; ++v)
                first += (first.empty() ? "" : " | ") + values[size_t(v)] + " " + after(1u << v);
        if (first.empty()) return rule(hint, "\"[\" " + ws + " \"]\"");
        const std::string some = "( " + first + " ) " + ws;
        return rule(hint, "\"[\" " + ws + " " + (lo == 0 ? "( " + some + " )?" : some) + " \"]\"");
    }

    std::string array(const Json& s, const std::string& hint, const std::string& path) {
        const int64_t lo = count(s, "minItems", 0, path), hi = count(s, "maxItems", -1, path);
        if (hi >= 0 && hi < lo) invalid(path, "maxItems < minItems");
        if (s.contains("uniqueItems")) {
            if (!s["uniqueItems"].is_boolean()) invalid(path, "uniqueItems must be a boolean");
            if (s["uniqueItems"].get<bool>()) return unique_array(s, lo, hi, hint, path);
        }
        std::vector<std::string> elems;  // the prefix items, each required
        if (s.contains("prefixItems")) {
            if (!s["prefixItems"].is_array()) invalid(path, "prefixItems must be an array");
            for (size_t i = 0; i < s["prefixItems"].size() && (hi < 0 || int64_t(i) < hi); ++i)
                elems.push_back(visit(s["prefixItems"][i], hint + "-" + std::to_string(i),
                                      path + "/prefixItems/" + std::to_string(i)));
        }
        std::string item;  // further items: none when items is false
        if (!s.contains("items"))
            item = elems.empty() || !s.contains("prefixItems") ? prim("value") : "";
        else if (s["items"].is_boolean() && !s["items"].get<bool>())
            item = "";
        else
            item = visit(s["items"], hint + "-item", path + "/items");
        const int64_t n = int64_t(elems.size());
        if (item.empty() && n < lo) invalid(path, "minItems exceeds the items the array may hold");
        const int64_t more_lo = std::max<int64_t>(lo - n, 0), more_hi = hi < 0 ? -1 : hi - n;
        const std::string ws = prim("ws"), sep = " " + ws + " \",\" " + ws + " ";
        std::string body;
        for (int64_t i = 0; i < n; ++i) body += (i ? sep : "") + elems[size_t(i)];
        if (!item.empty() && more_hi != 0) {
            if (n > 0) {
                body += " " + repeat(sep + item, more_lo, more_hi);
            } else {  // the first item has no comma before it
                const std::string tail =
                    repeat(sep + item, std::max<int64_t>(more_lo - 1, 0), more_hi < 0 ? -1 : more_hi - 1);
                body = more_lo > 0 ? item + " " + tail : "(" + item + " " + tail + ")?";
            }
        }
        if (body.empty()) return rule(hint, "\"[\" " + ws + " \"]\"");
        return rule(hint, "\"[\" " + ws + " " + body + " " + ws + " \"]\"");
    }

    // A JSON string that is none of `names` (the keys of additional properties): one rule per prefix of
    // the names, where the next character decides whether the key is still a prefix of one. A name's
    // character that JSON escapes (a quote, a backslash, a control character) is matched in the escaped
    // spelling that the listed property is written in, and that escape then no longer leaves the names.
    std::string other_key(const std::vector<std::string>& names, const std::string& hint, const std::string& path) {
        if (names.empty()) return prim("string");
        std::vector<std::u32string> cps;
        for (const auto& n : names) cps.push_back(decode(n));
        const std::string any = prim("char") + "* \"\\\"\"";
        std::function<std::string(const std::u32string&)> node = [&](const std::u32string& prefix) -> std::string {
            std::set<char32_t> next;
            bool is_name = false;
            for (const auto& n : cps)
                if (n.size() >= prefix.size() && n.compare(0, prefix.size(), prefix) == 0) {
                    if (n.size() == prefix.size())
                        is_name = true;
                    else
                        next.insert(n[prefix.size()]);
                }
            std::string alts, excluded = "^\"\\\\\\x00-\\x1F", short_escapes = "\"\\\\/bfnrt";
            for (char32_t c : next) {
                std::string spelled;  // a GBNF literal of the character as the key holds it
                if (c == '"' || c == '\\' || c < 0x20) {
                    const std::string e = Json(std::string(1, char(c))).dump();  // "\"\\n\"" and the like
                    if (e.size() != 4)
                        unsupported(path, "a property name holding the control character U+00" +
                                              std::string(1, "0123456789ABCDEF"[c >> 4]) + "0123456789ABCDEF"[c & 15]);
                    spelled = literal(e.substr(1, 2));
                    short_escapes.erase(short_escapes.find(e[2]), e[2] == '\\' ? 2 : 1);  // (\\ is two in a class)
                } else {
                    char buf[16];
                    std::snprintf(buf, sizeof buf, "\\U%08X", unsigned(c));
                    spelled = std::string("\"") + buf + "\"";
                    excluded += buf;
                }
                alts += (alts.empty() ? "" : " | ") + spelled + " " + node(prefix + c);
            }
            // Any other escape leaves the names behind too (a \u spelling of a name's character is not caught).
            const std::string escape = "\"\\\\\" ( [" + short_escapes + "] | \"u\" " + prim("hex") + "{4} )";
            alts += (alts.empty() ? "" : " | ") + ("( [" + excluded + "] | " + escape + " ) " + any);
            if (!is_name) alts += " | \"\\\"\"";
            return rule(hint + "-key", alts);
        };
        return "\"\\\"\" " + node(U"");
    }

    static std::u32string decode(const std::string& s) {
        std::u32string out;
        for (size_t i = 0; i < s.size();) {
            const unsigned char c = static_cast<unsigned char>(s[i]);
            const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
            char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
            for (int k = 1; k < n && i + size_t(k) < s.size(); ++k)
                cp = cp << 6 | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
            out += cp;
            i += size_t(n);
        }
        return out;
    }

    struct Item {
        std::string kv;
        bool required;
    };

    // An object with minProperties / maxProperties: a rule per (next listed property, properties written
    // so far), each listed property written or (optional ones) left out, then additional properties (when
    // allowed) up to the counts left. Counts at or above minProperties are one state when there is no
    // maxProperties.
    std::string counted_object(const Json& s, const std::vector<Item>& items, const std::string& extra,
                               const std::string& sep, const std::string& hint, const std::string& path) {
        const int64_t lo = count(s, "minProperties", 0, path), hi = count(s, "maxProperties", -1, path);
        if (hi >= 0 && hi < lo) invalid(path, "maxProperties < minProperties");
        const int64_t n_required = std::count_if(items.begin(), items.end(), [](const Item& i) { return i.required; });
        if (hi >= 0 && n_required > hi) invalid(path, "more required properties than maxProperties");
        if (extra.empty() && lo > int64_t(items.size()))
            invalid(path, "minProperties above the number of properties the schema allows");
        // Additional properties may repeat a key (their keys are only kept apart from the listed ones), so a
        // count is sure only when the required properties leave at most one of them to reach minProperties.
        if (!extra.empty() && n_required < lo - 1)
            unsupported(path, "minProperties that takes more than one additional property to reach");
        if ((int64_t(items.size()) + 1) * ((hi >= 0 ? hi : lo) + 2) > 4096)
            unsupported(path, "minProperties / maxProperties with this many properties");
        std::map<std::pair<size_t, int64_t>, std::optional<std::string>> memo;
        // state(i, c): listed properties i.. and the additional ones, after c properties; c = 0: none yet,
        // so at least one more (the empty object is the caller's).
        std::function<std::optional<std::string>(size_t, int64_t)> state =
            [&](size_t i, int64_t c) -> std::optional<std::string> {
            if (hi >= 0 && c > hi) return std::nullopt;
            const auto key = std::make_pair(i, hi >= 0 ? c : std::min(c, std::max<int64_t>(lo, 1)));
            if (auto it = memo.find(key); it != memo.end()) return it->second;
            const std::string lead = c > 0 ? sep : "";
            std::vector<std::string> alts;
            if (i == items.size()) {
                const int64_t need = std::max<int64_t>(c == 0 ? 1 : 0, lo - c), room = hi >= 0 ? hi - c : -1;
                if (need == 0) alts.push_back("\"\"");
                if (!extra.empty() && room != 0 && (room < 0 || need <= room)) {
                    const int64_t more_lo = std::max<int64_t>(need, 1), more_hi = room;
                    if (c > 0)
                        alts.push_back(repeat(sep + extra, more_lo, more_hi));
                    else
                        alts.push_back(extra + " " + repeat(sep + extra, more_lo - 1, more_hi < 0 ? -1 : more_hi - 1));
                }
            } else {
                if (auto with = state(i + 1, c + 1)) alts.push_back(lead + items[i].kv + " " + *with);
                if (!items[i].required)
                    if (auto without = state(i + 1, c)) alts.push_back(*without);
            }
            std::optional<std::string> out;
            if (!alts.empty()) {
                std::string body;
                for (size_t a = 0; a < alts.size(); ++a) body += (a ? " | " : "") + alts[a];
                out = rule(hint + "-p" + std::to_string(i) + "-" + std::to_string(key.second), body);
            }
            memo[key] = out;
            return out;
        };
        const std::string ws = prim("ws");
        const std::optional<std::string> some = state(0, 0);
        const bool empty_ok = lo == 0 && n_required == 0;
        if (!some && !empty_ok) invalid(path, "no object meets minProperties / maxProperties");
        if (!some) return "\"{\" " + ws + " \"}\"";
        if (empty_ok) return "\"{\" " + ws + " ( " + *some + " " + ws + " )? \"}\"";
        return "\"{\" " + ws + " " + *some + " " + ws + " \"}\"";
    }

    std::string object(const Json& s, const std::string& hint, const std::string& path) {
        std::vector<Item> items;
        std::vector<std::string> names;
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) invalid(path, "required must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) invalid(path, "required must list strings");
                required.insert(r.get<std::string>());
            }
        }
        const std::string ws = prim("ws");
        if (s.contains("properties")) {
            if (!s["properties"].is_object()) invalid(path, "properties must be an object");
            for (const auto& [k, v] : s["properties"].items()) {
                if (v.is_boolean() && !v.get<bool>()) {  // (allOf with a closed branch) a key that cannot appear
                    if (required.count(k)) invalid(path, "the required property '" + k + "' can hold no value");
                    names.push_back(k);  // nor as an additional property
                    continue;
                }
                const std::string value = visit(v, hint + "-" + k, path + "/properties/" + k);
                items.push_back(
                    {literal(Json(k).dump()) + " " + ws + " \":\" " + ws + " " + value, required.count(k) > 0});
                names.push_back(k);
            }
        }
        for (const auto& r : required)
            if (std::find(names.begin(), names.end(), r) == names.end())
                unsupported(path, "required property '" + r + "' without a schema in properties");
        std::string extra;
        // Without additionalProperties, an object that lists properties has no others (the narrower reading
        // llama.cpp takes too), and one that lists none is any object (a free-form object, not just {}).
        const Json open =
            s.contains("additionalProperties") ? s["additionalProperties"] : Json(!s.contains("properties"));
        if (!(open.is_boolean() && !open.get<bool>())) {
            const std::string value = visit(open, hint + "-extra", path + "/additionalProperties");
            extra = rule(hint + "-kv", other_key(names, hint, path) + " " + ws + " \":\" " + ws + " " + value);
        }
        const std::string sep = ws + " \",\" " + ws + " ";
        if (s.contains("minProperties") || s.contains("maxProperties"))
            return rule(hint, counted_object(s, items, extra, sep, hint, path));
        // rest(i): items i.. after something was written (each present one after a comma).
        auto rest = [&](size_t i) {
            std::string out;
            for (size_t j = i; j < items.size(); ++j) {
                const std::string part = sep + items[j].kv;
                out += items[j].required ? " " + part : " ( " + part + " )?";
            }
            if (!extra.empty()) out += " ( " + sep + extra + " )*";
            return out;
        };
        // first(i): items i.. with nothing written yet; optional items make alternatives.
        std::string first;
        std::vector<std::string> chain;
        bool all_optional = true;
        for (size_t i = 0; i < items.size() && all_optional; ++i) {
            chain.push_back(items[i].kv + rest(i + 1));
            if (items[i].required) all_optional = false;
        }
        if (all_optional && !extra.empty()) chain.push_back(extra + " ( " + sep + extra + " )*");
        for (size_t i = 0; i < chain.size(); ++i) first += (i ? " | " : "") + chain[i];
        std::string body;
        if (first.empty())
            body = "\"{\" " + ws + " \"}\"";
        else if (all_optional)
            body = "\"{\" " + ws + " ( ( " + first + " ) " + ws + " )? \"}\"";
        else
            body = "\"{\" " + ws + " ( " + first + " ) " + ws + " \"}\"";
        return rule(hint, body);
    }

    const Json& root_;
    std::map<std::string, std::string> rules_;
    std::map<std::string, std::string> refs_;
    std::set<std::string> at_start_;          // $refs being expanded with no '{' or '[' since: a visit back is a loop
    std::map<std::string, int> next_suffix_;  // new_rule: the next number to try after a name
    std::set<std::string> used_;
    int depth_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema_json) {
    Json schema;
    try {
        schema = Json::parse(schema_json.begin(), schema_json.end());
    } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range
        throw_error(ErrorCode::kParse, "JSON Schema: not valid JSON: %s", e.what());
    }
    return Converter(schema).run();
}

std::string json_gbnf(bool any_value) {
    std::string out = any_value ? "root ::= value\n" : "root ::= object\n";
    for (const char* p : {"value", "object", "array", "string", "char", "number", "boolean", "null", "ws"})
        out += std::string(p) + " ::= " + kPrimitives.at(p) + "\n";
    return out;
}

}  // namespace cera::grammar
