// JSON Schema to grammar: documents the schema accepts are in the grammar's language, documents it
// rejects are not (written by hand from the schema's definition), and unsupported keywords are errors.
#include "chat/grammar/json_schema.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cera/error.h"
#include "cera/grammar.h"

namespace cera {
namespace {

struct Case {
    const char* name;
    const char* schema;
    std::vector<std::string> accept;
    std::vector<std::string> reject;
};

const std::vector<Case> kCases = {
    {"object",
     R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                   "required": ["a"]})",
     {R"({"a": 1})", R"({"a": -20, "b": "x"})", "{\n  \"a\": 0,\n  \"b\": \"\"\n}", R"({"a":1,"b":"q"})"},
     {R"({"b": "x"})", R"({"a": 1.5})", R"({"a": 1, "c": 2})", R"({"b": "x", "a": 1})", R"({"a": 01})", "{}",
      R"({"a": 1,})"}},
    {"all optional",
     R"({"properties": {"x": {"type": "boolean"}, "y": {"type": "null"}, "z": {}}})",
     {"{}", R"({"x": true})", R"({"y": null})", R"({"x": false, "y": null, "z": [1, {"k": "v"}]})", R"({"z": 3})"},
     {R"({"y": null, "x": true})", R"({, "y": null})", R"({"x": 1})"}},
    {"additional",
     R"({"type": "object", "properties": {"id": {"type": "integer"}},
                       "additionalProperties": {"type": "number"}})",
     {"{}", R"({"id": 1})", R"({"id": 1, "w": 2.5, "h": -1e3})", R"({"w": 1})", R"({"ida": 1})", R"({"i": 2})"},
     {R"({"id": 1, "id": 2})", R"({"w": "x"})", R"({"id": 1, "w": true})"}},
    {"additional true",
     R"({"additionalProperties": true})",
     {"{}", R"({"a": [true]})", R"({"a": 1, "b": {"c": null}})"},
     {"[]", R"({"a"})"}},
    {"array",
     R"({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 12},
                  "minItems": 2, "maxItems": 3})",
     {"[1, 2]", "[12,11,10]", "[ 3 , 4 ]"},
     {"[1]", "[1, 2, 3, 4]", "[0, 1]", "[13, 1]", "[1, 2,]", "[]"}},
    {"prefixItems",
     R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                        "items": {"type": "null"}, "maxItems": 4})",
     {R"(["a", true])", R"(["a", false, null])", R"(["", true, null, null])"},
     {R"(["a"])", R"([true, "a"])", R"(["a", true, 1])", R"(["a", true, null, null, null])"}},
    {"enum const",
     R"({"type": "object", "properties": {"c": {"enum": ["red", "green", 3, null, {"k": [1]}]},
                        "k": {"const": "fixed"}}, "required": ["c", "k"]})",
     {R"({"c": "red", "k": "fixed"})", R"({"c": 3, "k": "fixed"})", R"({"c": {"k":[1]}, "k": "fixed"})"},
     {R"({"c": "blue", "k": "fixed"})", R"({"c": "red", "k": "other"})"}},
    {"types", R"({"type": ["string", "null", "number"]})", {"\"x\"", "null", "-1.5e2", "0"}, {"true", "{}", "[]"}},
    {"anyOf allOf",
     R"({"anyOf": [{"type": "integer"}, {"allOf": [
          {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
          {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}]})",
     {"7", R"({"a": 1, "b": "x"})"},
     {R"({"a": 1})", R"({"b": "x"})", "\"7\""}},
    {"ref recursive",
     R"({"$defs": {"node": {"type": "object", "properties": {
          "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
          "required": ["v"]}}, "$ref": "#/$defs/node"})",
     {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"},
     {R"({"v": 1, "kids": [{}]})", R"({"kids": []})"}},
    {"definitions",
     R"({"definitions": {"p": {"type": "string", "minLength": 2, "maxLength": 3}},
                        "type": "array", "items": {"$ref": "#/definitions/p"}})",
     {"[]", R"(["ab", "abc", "\n\u00e9"])"},
     {R"(["a"])", R"(["abcd"])"}},
    {"strings",
     R"({"type": "object", "properties": {
          "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
          "dt": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
          "e": {"type": "string", "format": "email"}, "p": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
          "q": {"type": "string", "pattern": "ab+c"}}})",
     {R"({"d": "2024-02-28"})", R"({"t": "23:59:59Z"})", R"({"t": "23:59:59.123+02:00"})",
      R"({"dt": "2024-12-31T00:00:00Z"})", R"({"u": "123e4567-e89b-12d3-a456-426614174000"})",
      R"({"e": "a.b+c@example.co.uk"})", R"({"p": "AB-123"})", R"({"q": "xxabbbcyy"})", R"({"q": "abc"})"},
     {R"({"d": "2024-02-30"})", R"({"d": "2024-13-01"})", R"({"t": "24:00:00Z"})", R"({"t": "12:00:00"})",
      R"({"u": "123e4567e89b12d3a456426614174000"})", R"({"e": "a@b"})", R"({"p": "AB-12"})", R"({"p": "ab-123"})",
      R"({"q": "ac"})"}},
    {"integer ranges",
     R"({"type": "array", "items": {"type": "integer", "minimum": -15, "exclusiveMaximum": 1000}})",
     {"[-15, -9, -1, 0, 5, 10, 99, 100, 999]"},
     {"[-16]", "[1000]", "[-0]", "[007]", "[1.0]"}},
    {"nullable and annotation formats",
     R"({"type": "object", "properties": {"n": {"type": "integer", "nullable": true, "maximum": 5},
                   "s": {"type": "string", "nullable": false}, "pw": {"type": "string", "format": "password",
                   "maxLength": 4}, "b": {"type": "string", "format": "binary"}}})",
     {R"({"n": null})", R"({"n": 5})", R"({"s": "x"})", R"({"pw": "abcd"})", R"({"b": "any text"})"},
     {R"({"n": 6})", R"({"s": null})", R"({"pw": "abcde"})", R"({"b": 1})"}},
    // An object schema that lists no properties is a free-form object; one that lists properties (even
    // none) has no others unless additionalProperties says so.
    {"free-form objects",
     R"({"type": "object", "properties": {"meta": {"type": "object"}, "none": {"type": "object", "properties": {}},
         "some": {"type": "object", "minProperties": 1}}})",
     {R"({"meta": {}})", R"({"meta": {"a": 1, "b": [true, {"c": null}]}})", R"({"none": {}})",
      R"({"some": {"k": "v"}})"},
     {R"({"none": {"a": 1}})", R"({"some": {}})", R"({"meta": []})"}},
    // Keywords beside const / enum apply to their values.
    {"enum with type", R"({"type": "string", "enum": ["a", 1, "bcd"], "maxLength": 2})", {"\"a\""}, {"1", "\"bcd\""}},
    {"const with bounds", R"({"enum": [1, 5, 12.5], "minimum": 2, "exclusiveMaximum": 12.5})", {"5"}, {"1", "12.5"}},
    {"enum under anyOf", R"({"enum": [1, "a"], "anyOf": [{"type": "string"}]})", {"\"a\""}, {"1"}},
    // allOf: a property named in both branches takes both schemas, and a branch's additionalProperties
    // applies to the other branch's properties.
    {"allOf property schemas",
     R"({"allOf": [{"properties": {"x": {"type": "integer"}}}, {"properties": {"x": {"minimum": 5}}}]})",
     {R"({"x": 5})", R"({"x": 7})", "{}"},
     {R"({"x": 5.5})", R"({"x": 4})"}},
    {"allOf closed branch",
     R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": false},
                   {"properties": {"b": {"type": "integer"}}}]})",
     {R"({"a": 1})", "{}"},
     {R"({"b": 1})", R"({"a": 1, "b": 2})"}},
    {"anyOf beside properties",
     R"({"properties": {"x": {"type": "integer"}}, "anyOf": [{"properties": {"x": {"minimum": 0}}}]})",
     {R"({"x": 0})"},
     {R"({"x": 0.5})", R"({"x": -1})"}},
    {"ref with siblings",
     R"({"$defs": {"s": {"type": "string"}, "a": {"properties": {"x": {"type": "integer"}}}},
         "properties": {"p": {"allOf": [{"$ref": "#/$defs/s", "maxLength": 2}]},
                        "q": {"$ref": "#/$defs/a", "properties": {"x": {"minimum": 3}}}}})",
     {R"({"p": "ab"})", R"({"q": {"x": 3}})"},
     {R"({"p": "abc"})", R"({"q": {"x": 1}})", R"({"q": {"x": 3.5}})"}},
    {"ref with siblings, recursive",
     R"({"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n", "maxProperties": 1}}}},
         "$ref": "#/$defs/n"})",
     {"{}", R"({"c": {"c": {}}})"},
     {R"({"c": {"d": 1}})"}},
    // A surrogate pair's escapes are one character; a lone surrogate is none.
    {"surrogate pairs",
     R"({"type": "string", "minLength": 2, "maxLength": 2})",
     {R"("\ud83d\ude00x")", R"("ab")", R"("\u00e9\uFFFF")"},
     {R"("\ud83d\ude00")", R"("\ud83dx")", R"("\ude00x")"}},
    // Property names that JSON escapes: the listed spelling takes the property's schema, and is no extra key.
    {"escaped property names",
     R"({"properties": {"a\"b": {"type": "integer"}, "c\\d": {"type": "integer"}, "e\nf": {"type": "integer"}},
         "additionalProperties": {"type": "string"}})",
     {R"({"a\"b": 1})", R"({"c\\d": 2, "e\nf": 3})", R"({"a\"c": "s"})", R"({"x": "s"})"},
     {R"({"a\"b": "s"})", R"({"c\\d": "s"})", R"({"e\nf": "s"})", R"({"a"b": 1})", R"({"c\qd": "s"})",
      "{\"e\nf\": 3}"}},
    // Integer bounds past the 16 digits integers are written in.
    {"integer bounds at 16 digits",
     R"({"type": "integer", "exclusiveMaximum": 10000000000000000, "minimum": 0})",
     {"9999999999999999", "0"},
     {"10000000000000000"}},
};

TEST(JsonSchema, AcceptsWhatTheSchemaAccepts) {
    for (const Case& c : kCases) {
        SCOPED_TRACE(c.name);
        std::shared_ptr<const Grammar> g;
        ASSERT_NO_THROW(g = Grammar::from_json_schema(c.schema)) << Grammar::json_schema_to_gbnf(c.schema);
        for (const auto& s : c.accept) EXPECT_EQ(g->match(s), -1) << "should accept: " << s << "\n" << g->gbnf();
        for (const auto& s : c.reject) EXPECT_NE(g->match(s), -1) << "should reject: " << s << "\n" << g->gbnf();
    }
}

TEST(JsonSchema, IntegerRangesAreExact) {
    for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 0}, {-3, 3}, {7, 123}, {-250, -13}, {95, 1005}, {1, 9}}) {
        const std::string schema =
            R"({"type": "integer", "minimum": )" + std::to_string(lo) + R"(, "maximum": )" + std::to_string(hi) + "}";
        auto g = Grammar::from_json_schema(schema);
        for (int v = lo - 30; v <= hi + 30; ++v)
            EXPECT_EQ(g->match(std::to_string(v)) == -1, v >= lo && v <= hi) << schema << " " << v;
    }
}

// Bounds of many digits, one-sided or wide (up to the 16 digits integers reach): the grammar stays small
// (each digit level recurses on one side) and the edges are exact.
TEST(JsonSchema, WideIntegerRangesStaySmall) {
    struct Case {
        const char* bounds;
        std::vector<std::string> accept, reject;
    };
    const std::vector<Case> cases = {
        {R"("minimum": 149)", {"149", "150", "999", "1000", "9999999999999999"}, {"148", "0", "-149", "14"}},
        {R"("minimum": 1000000007, "maximum": 8999999993)",
         {"1000000007", "1000000010", "5555555555", "8999999993", "8999999989"},
         {"1000000006", "8999999994", "999999999", "9000000000"}},
        {R"("maximum": -1000)", {"-1000", "-1001", "-123456789012"}, {"-999", "0", "1000"}},
        {R"("minimum": 0, "maximum": 999999999999999)", {"0", "7", "999999999999999", "100000000000000"},
         {"1000000000000000", "-1", "01"}},
    };
    for (const Case& c : cases) {
        const std::string schema = std::string(R"({"type": "integer", )") + c.bounds + "}";
        const std::string gbnf = Grammar::json_schema_to_gbnf(schema);
        EXPECT_LT(gbnf.size(), 20000u) << schema;
        auto g = Grammar::from_json_schema(schema);
        for (const auto& v : c.accept) EXPECT_EQ(g->match(v), -1) << schema << " should accept " << v;
        for (const auto& v : c.reject) EXPECT_NE(g->match(v), -1) << schema << " should reject " << v;
    }
}

// Numbers with bounds, against exact arithmetic: every value of a grid of hundredths from -3 to 3, written
// shortest, with a trailing zero and (when whole) without a fraction, is accepted exactly when it lies in
// range; bounds whole and fractional, inclusive and exclusive, one-sided, negative, in exponent notation.
TEST(JsonSchema, NumberRangesAreExact) {
    struct Case {
        const char* bounds;
        std::optional<int64_t> lo, hi;  // in hundredths
        bool lo_incl, hi_incl;
    };
    const std::vector<Case> cases = {
        {R"("minimum": 0, "maximum": 1)", 0, 100, true, true},
        {R"("minimum": 0.1, "maximum": 0.9)", 10, 90, true, true},
        {R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)", 0, 100, false, false},
        {R"("minimum": -1.5, "exclusiveMaximum": 2.25)", -150, 225, true, false},
        {R"("exclusiveMinimum": -2.05, "maximum": -0.5)", -205, -50, false, true},
        {R"("minimum": 0.25)", 25, std::nullopt, true, false},
        {R"("exclusiveMaximum": -1)", std::nullopt, -100, false, false},
        {R"("minimum": 1.5e-1, "maximum": 2.5E0)", 15, 250, true, true},
        {R"("minimum": -0.99, "maximum": 0.99)", -99, 99, true, true},
        {R"("minimum": 1, "maximum": 1)", 100, 100, true, true},
        {R"("minimum": 0, "exclusiveMinimum": 0.5, "maximum": 3, "exclusiveMaximum": 2.5)", 50, 250, false, false},
        {R"("minimum": 0.5, "exclusiveMinimum": true, "maximum": 2)", 50, 200, false, true},
    };
    // Draft 4's modifiers on integers too.
    auto g4 = Grammar::from_json_schema(
        R"({"type": "integer", "minimum": 3, "exclusiveMinimum": true, "maximum": 7, "exclusiveMaximum": true})");
    for (int v = 0; v <= 10; ++v) EXPECT_EQ(g4->match(std::to_string(v)) == -1, v > 3 && v < 7) << v;
    auto text = [](int64_t v, int form) {  // form 0: shortest, 1: a trailing zero, 2: no fraction (whole v)
        const int64_t a = v < 0 ? -v : v;
        std::string out = (v < 0 ? "-" : "") + std::to_string(a / 100);
        std::string frac = std::to_string(100 + a % 100).substr(1);
        while (form != 1 && !frac.empty() && frac.back() == '0') frac.pop_back();
        if (form == 1) frac += "0";
        if (!frac.empty() && form != 2) out += "." + frac;
        return out;
    };
    for (const Case& c : cases) {
        const std::string schema = std::string(R"({"type": "number", )") + c.bounds + "}";
        auto g = Grammar::from_json_schema(schema);
        EXPECT_LT(g->gbnf().size(), 20000u) << schema;
        for (int64_t v = -300; v <= 300; ++v) {
            const bool in =
                (!c.lo || (c.lo_incl ? v >= *c.lo : v > *c.lo)) && (!c.hi || (c.hi_incl ? v <= *c.hi : v < *c.hi));
            for (int form = 0; form < 3; ++form) {
                if (form == 2 && v % 100 != 0) continue;
                if (v == 0 && form == 1) continue;
                const std::string t = text(v, form);
                EXPECT_EQ(g->match(t) == -1, in) << schema << " " << t << "\n" << g->gbnf();
            }
        }
        for (const char* bad : {"01", "1.", ".5", "--1", "-0", "0.12345678901234567"})
            EXPECT_NE(g->match(bad), -1) << schema << " " << bad;
    }
    // A bound past the digits written: every number written lies below it.
    EXPECT_EQ(Grammar::from_json_schema(R"({"type": "number", "maximum": 1e300})")->match("12345.5"), -1);
}

// multipleOf against exact arithmetic. Integers: every integer from -300 to 300 is accepted exactly when it
// is a multiple within the bounds, and so are the multiples around 10^15. Numbers: every hundredth from -3
// to 3, written with the step's fraction digits, is accepted exactly when it is a multiple within the
// bounds; written with other fraction digits, it is refused (a number is written with exactly that many).
TEST(JsonSchema, MultipleOfIsExact) {
    struct Case {
        const char* schema;
        int64_t step;  // integers: the modulus; numbers: in hundredths
        std::optional<int64_t> lo, hi;
        bool lo_incl = true, hi_incl = true;
    };
    const std::vector<Case> ints = {
        {R"("multipleOf": 5)", 5, {}, {}},
        {R"("multipleOf": 7, "minimum": -100, "maximum": 250)", 7, -100, 250},
        {R"("multipleOf": 3, "exclusiveMinimum": 3, "exclusiveMaximum": 99)", 3, 3, 99, false, false},
        {R"("multipleOf": 12, "minimum": -300)", 12, -300, {}},
        {R"("multipleOf": 2.5, "maximum": -10)", 5, {}, -10},  // integers that are multiples of 2.5: of 5
        {R"("multipleOf": 0.5)", 1, {}, {}},
        {R"("multipleOf": 100, "minimum": 1)", 100, 1, {}},
        {R"("multipleOf": 64)", 64, {}, {}},
    };
    for (const Case& c : ints) {
        const std::string schema = std::string(R"({"type": "integer", )") + c.schema + "}";
        auto g = Grammar::from_json_schema(schema);
        EXPECT_LT(g->gbnf().size(), 60000u) << schema;
        for (int64_t v = -300; v <= 300; ++v) {
            const bool in = v % c.step == 0 && (!c.lo || (c.lo_incl ? v >= *c.lo : v > *c.lo)) &&
                            (!c.hi || (c.hi_incl ? v <= *c.hi : v < *c.hi));
            EXPECT_EQ(g->match(std::to_string(v)) == -1, in) << schema << " " << v;
        }
        if (c.hi) continue;
        const int64_t big = 999999999999999 / c.step * c.step;  // a multiple of 15 digits
        for (int64_t v = big - 2; v <= big + 2; ++v)
            EXPECT_EQ(g->match(std::to_string(v)) == -1, v % c.step == 0 && v <= 999999999999999) << schema << " " << v;
        EXPECT_NE(g->match("1" + std::string(15, '0')), -1) << schema;  // past the 15 digits written
    }
    const std::vector<Case> nums = {
        {R"("multipleOf": 0.01)", 1, {}, {}},
        {R"("multipleOf": 0.25, "minimum": -1, "maximum": 1.5)", 25, -100, 150},
        {R"("multipleOf": 0.05, "exclusiveMinimum": 0, "exclusiveMaximum": 2)", 5, 0, 200, false, false},
        {R"("multipleOf": 0.3, "minimum": -2.95, "maximum": 2.99)", 30, -295, 299},
        {R"("multipleOf": 0.5, "exclusiveMinimum": -1.25)", 50, -125, {}, false},
        {R"("multipleOf": 1.5, "maximum": 2.9)", 150, {}, 290},
        {R"("multipleOf": 2)", 200, {}, {}},
        {R"("multipleOf": 0.07, "minimum": 0)", 7, 0, {}},
    };
    for (const Case& c : nums) {
        const std::string schema = std::string(R"({"type": "number", )") + c.schema + "}";
        auto g = Grammar::from_json_schema(schema);
        EXPECT_LT(g->gbnf().size(), 60000u) << schema;
        const int frac = c.step % 100 == 0 ? 0 : c.step % 10 == 0 ? 1 : 2;
        auto text = [](int64_t v, int digits) {  // v in hundredths, written with `digits` fraction digits
            const int64_t a = v < 0 ? -v : v;
            std::string out = (v < 0 ? "-" : "") + std::to_string(a / 100);
            if (digits > 0) out += "." + std::to_string(100 + a % 100).substr(1, size_t(digits));
            return out;
        };
        for (int64_t v = -300; v <= 300; ++v) {
            const bool in = v % c.step == 0 && (!c.lo || (c.lo_incl ? v >= *c.lo : v > *c.lo)) &&
                            (!c.hi || (c.hi_incl ? v <= *c.hi : v < *c.hi));
            if (v % (frac == 0 ? 100 : frac == 1 ? 10 : 1) == 0)
                EXPECT_EQ(g->match(text(v, frac)) == -1, in) << schema << " " << text(v, frac);
            for (int other = 0; other <= 2; ++other)
                if (other != frac && v % (other == 0 ? 100 : other == 1 ? 10 : 1) == 0)
                    EXPECT_NE(g->match(text(v, other)), -1) << schema << " " << text(v, other);
        }
        EXPECT_NE(g->match(frac ? "-0." + std::string(size_t(frac), '0') : "-0"), -1) << schema;  // never -0
    }
}

std::pair<ErrorCode, std::string> error_of(const std::string& schema);

// uniqueItems over a few values, against counting: every sequence of up to four of the values (repeats
// included) is accepted exactly when its values are distinct and its length within the bounds.
TEST(JsonSchema, UniqueItemsAreExact) {
    struct Case {
        const char* schema;
        std::vector<std::string> values;
        int lo, hi;
    };
    const std::vector<Case> cases = {
        {R"("items": {"enum": ["a", "b", "c"]})", {R"("a")", R"("b")", R"("c")"}, 0, -1},
        {R"("items": {"type": "string", "enum": ["a", "b", "c", "a"]}, "minItems": 1, "maxItems": 2)",
         {R"("a")", R"("b")", R"("c")"},
         1,
         2},
        {R"("items": {"type": "boolean"}, "minItems": 2)", {"true", "false"}, 2, -1},
        {R"("items": {"enum": [1, null, {"k": [2]}]}, "maxItems": 3, "minItems": 3)",
         {"1", "null", R"({"k":[2]})"},
         3,
         3},
        {R"("items": {"const": 7})", {"7"}, 0, -1},
    };
    for (const Case& c : cases) {
        const std::string schema = std::string(R"({"type": "array", "uniqueItems": true, )") + c.schema + "}";
        auto g = Grammar::from_json_schema(schema);
        const size_t n = c.values.size();
        for (size_t len = 0; len <= 4; ++len) {
            size_t combos = 1;
            for (size_t i = 0; i < len; ++i) combos *= n;
            for (size_t code = 0; code < combos; ++code) {
                std::string text = "[";
                std::set<size_t> seen;
                bool distinct = true;
                for (size_t i = 0, x = code; i < len; ++i, x /= n) {
                    distinct = seen.insert(x % n).second && distinct;
                    text += (i ? ", " : "") + c.values[x % n];
                }
                text += "]";
                const bool in = distinct && int(len) >= c.lo && (c.hi < 0 || int(len) <= c.hi);
                EXPECT_EQ(g->match(text) == -1, in) << schema << " " << text;
            }
        }
    }
    EXPECT_EQ(Grammar::from_json_schema(R"({"type": "array", "uniqueItems": false, "items": {"type": "integer"}})")
                  ->match("[1, 1]"),
              -1);
    EXPECT_EQ(error_of(R"({"type": "array", "uniqueItems": true, "items": {"type": "string"}})").first,
              ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"uniqueItems": true, "items": {"enum": [1, 2]}, "minItems": 3})").first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"uniqueItems": true, "items": {"enum": [1,2,3,4,5,6,7,8,9,10,11,12,13]}})").first,
              ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"uniqueItems": 1, "items": {"enum": [1]}})").first, ErrorCode::kInvalidArgument);
    // Values equal as JSON are one value; the items' other keywords are refused, not dropped; the type filters.
    auto eq = Grammar::from_json_schema(
        R"({"uniqueItems": true, "items": {"enum": [1, 1.0, {"a": 1, "b": 2}, {"b": 2, "a": 1}]}})");
    EXPECT_NE(eq->match("[1, 1.0]"), -1);
    EXPECT_NE(eq->match(R"([{"a":1,"b":2}, {"b":2,"a":1}])"), -1);
    EXPECT_EQ(eq->match(R"([1, {"a":1,"b":2}])"), -1);
    EXPECT_EQ(error_of(R"({"uniqueItems": true, "items": {"enum": ["a", "b"], "not": {"const": "a"}}})").first,
              ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"uniqueItems": true, "items": {"type": "boolean", "foo": 1}})").first,
              ErrorCode::kUnsupported);
    auto typed = Grammar::from_json_schema(R"({"uniqueItems": true, "items": {"type": "string", "enum": ["a", 1]}})");
    EXPECT_EQ(typed->match(R"(["a"])"), -1);
    EXPECT_NE(typed->match("[1]"), -1);
}

// minProperties / maxProperties against counting: every object of the listed properties a, b, c (a subset,
// in order) followed by 0-3 additional ones is accepted exactly when it has the required ones and a count
// within the bounds.
TEST(JsonSchema, PropertyCountsAreExact) {
    struct Case {
        const char* schema;
        int lo, hi;    // hi -1: none
        int required;  // a bit a listed property
        bool extra;
    };
    const std::vector<Case> cases = {
        {R"("minProperties": 1)", 1, -1, 0, false},
        {R"("maxProperties": 1)", 0, 1, 0, false},
        {R"("minProperties": 2, "maxProperties": 2)", 2, 2, 0, false},
        {R"("minProperties": 2, "required": ["a"])", 2, -1, 1, false},
        {R"("minProperties": 3, "required": ["a", "c"], "additionalProperties": {"type": "integer"})", 3, -1, 5, true},
        {R"("minProperties": 1, "maxProperties": 3, "additionalProperties": true)", 1, 3, 0, true},
        {R"("maxProperties": 2, "required": ["a"], "additionalProperties": {"type": "integer"})", 0, 2, 1, true},
        {R"("minProperties": 0)", 0, -1, 0, false},
    };
    for (const Case& c : cases) {
        const std::string schema = std::string(R"({"type": "object", "properties": {"a": {"type": "integer"},
            "b": {"type": "integer"}, "c": {"type": "integer"}}, )") +
                                   c.schema + "}";
        auto g = Grammar::from_json_schema(schema);
        for (int mask = 0; mask < 8; ++mask)
            for (int extra = 0; extra <= 3; ++extra) {
                std::string text = "{";
                int n = 0;
                for (int p = 0; p < 3; ++p)
                    if (mask >> p & 1) text += std::string(n++ ? ", " : "") + "\"" + char('a' + p) + "\": 1";
                for (int e = 0; e < extra; ++e) text += std::string(n++ ? ", " : "") + "\"" + char('x' + e) + "\": 2";
                text += "}";
                const bool in = (mask & c.required) == c.required && (extra == 0 || c.extra) && n >= c.lo &&
                                (c.hi < 0 || n <= c.hi);
                EXPECT_EQ(g->match(text) == -1, in) << schema << " " << text;
            }
    }
    EXPECT_EQ(error_of(R"({"type": "object", "minProperties": 3, "maxProperties": 2})").first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"properties": {"a": {}}, "required": ["a"], "maxProperties": 0})").first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"properties": {"a": {}}, "minProperties": 2})").first, ErrorCode::kInvalidArgument);
    // Two additional properties could share a key: a count that needs them is refused.
    EXPECT_EQ(error_of(R"({"minProperties": 2, "additionalProperties": true})").first, ErrorCode::kUnsupported);
    EXPECT_NE(Grammar::from_json_schema(R"({"minProperties": 1, "additionalProperties": true})")->match("{}"), -1);
    EXPECT_EQ(Grammar::from_json_schema(R"({"minProperties": 1, "additionalProperties": true})")->match(R"({"k": []})"),
              -1);
}

// The formats beyond date/time/uuid/email: values accepted and refused, and the longest value of each
// rule has the length the converter assumes when it weighs minLength / maxLength beside a format.
TEST(JsonSchema, UriIpHostnameDurationFormats) {
    auto str = [](const char* format, const std::string& extra = "") {
        return Grammar::from_json_schema(std::string(R"({"type": "string", "format": ")") + format + "\"" + extra +
                                         "}");
    };
    auto q = [](const std::string& v) { return "\"" + v + "\""; };
    auto uri = str("uri"), ip = str("ipv4"), host = str("hostname");
    for (const char* v :
         {"https://example.com", "http://a.b.c:8080/x/y%20z?q=1&r=%2F#frag", "mailto:someone@example.org",
          "urn:isbn:0451450523", "file://localhost/etc/fstab", "s3://bucket/key/"})
        EXPECT_EQ(uri->match(q(v)), -1) << v;
    for (const char* v : {"example.com", "http://", "1http://a", "http://a b", "http://a/%zz", "a:", "http://a#b#c"})
        EXPECT_NE(uri->match(q(v)), -1) << v;
    for (const char* v : {"0.0.0.0", "192.168.1.255", "255.255.255.255", "10.0.0.1"})
        EXPECT_EQ(ip->match(q(v)), -1) << v;
    for (const char* v : {"256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-1"})
        EXPECT_NE(ip->match(q(v)), -1) << v;
    for (const char* v : {"localhost", "api.eu.example.com", "a-b.c0", "x"}) EXPECT_EQ(host->match(q(v)), -1) << v;
    for (const char* v : {"-a.com", "a-.com", "a..b", "a_b.com", ".a"}) EXPECT_NE(host->match(q(v)), -1) << v;
    auto ip6 = str("ipv6"), dur = str("duration");
    for (const char* v : {"2001:db8:0:0:0:ff00:42:8329", "0:0:0:0:0:0:0:1", "FFFF:a:b:c:d:e:f:0", "::", "::1", "1::",
                          "2001:db8::ff00:42:8329", "fe80::1:2", "1::8", "1:2:3:4:5:6::8", "1::3:4:5:6:7:8",
                          "::ffff:192.0.2.128", "64:ff9b::10.0.0.1", "1:2:3:4:5:6:1.2.3.4", "::1.2.3.4"})
        EXPECT_EQ(ip6->match(q(v)), -1) << v;
    for (const char* v : {"1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", "g:0:0:0:0:0:0:0", "12345:0:0:0:0:0:0:0", ":::",
                          "1::2::3", ":1:2:3:4:5:6:7", "1:2:3:4:5:6:7:", "1:2:3:4:5:6:7::8", "1:2:3:4:5:6:7:1.2.3.4",
                          "::1.2.3", "::256.1.1.1", "1.2.3.4::", ":", "1:::2"})
        EXPECT_NE(ip6->match(q(v)), -1) << v;
    for (const char* v : {"P1W", "PT36H", "P1Y2M3DT4H5M6S", "P3D", "PT0S", "P1M", "PT1M"})
        EXPECT_EQ(dur->match(q(v)), -1) << v;
    for (const char* v : {"P", "PT", "P1DT", "P1.5D", "1D", "P1D2Y", "P1W2D"}) EXPECT_NE(dur->match(q(v)), -1) << v;
    auto ref = str("uri-reference"), ptr = str("json-pointer"), rel = str("relative-json-pointer");
    for (const char* v : {"", "https://example.com/a?b#c", "//cdn.example.org/x.js", "/abs/path", "rel/path?q=1",
                          "../up", "?only", "#frag", "a%20b/c:d", "mailto:x@y.z"})
        EXPECT_EQ(ref->match(q(v)), -1) << v;
    for (const char* v : {"a b", "/x/%zz", "#a#b", ":nope", "http://a b"}) EXPECT_NE(ref->match(q(v)), -1) << v;
    for (const char* v : {"", "/", "/a/b", "/a~0b/c~1d", "/0/items/", "//"}) EXPECT_EQ(ptr->match(q(v)), -1) << v;
    for (const char* v : {"a", "/a~", "/a~2", "/a~b", "x/y"}) EXPECT_NE(ptr->match(q(v)), -1) << v;
    for (const char* v : {"0", "1#", "0/a", "12/a/b", "3#"}) EXPECT_EQ(rel->match(q(v)), -1) << v;
    for (const char* v : {"", "01", "-1", "#", "1a", "1##"}) EXPECT_NE(rel->match(q(v)), -1) << v;

    const std::string label(40, 'a'), pct32 = [] {
        std::string p;
        for (int i = 0; i < 32; ++i) p += "%2F";
        return p;
    }();
    std::string longest_host = label;
    for (int i = 0; i < 4; ++i) longest_host += "." + label;
    std::string longest_uri = "a" + std::string(15, 'b') + "://" + longest_host + ":65535";
    for (int i = 0; i < 6; ++i) longest_uri += "/" + pct32;
    longest_uri += "?" + pct32 + pct32 + pct32 + pct32 + "#" + pct32 + pct32;
    const std::string longest_email = std::string(32, 'e') + "." + std::string(32, 'e') + "." + std::string(32, 'e') +
                                      "." + std::string(32, 'e') + "@" + std::string(22, 'd') + "." +
                                      std::string(22, 'd') + "." + std::string(22, 'd') + "." + std::string(22, 'd');
    std::string longest_pointer;
    for (int i = 0; i < 8; ++i) {
        longest_pointer += "/";
        for (int j = 0; j < 32; ++j) longest_pointer += "~0";
    }
    const std::vector<std::tuple<const char*, std::string, std::string>> extremes = {
        {"uri", "a:b", longest_uri},
        {"uri-reference", "", longest_uri},
        {"json-pointer", "", longest_pointer},
        {"relative-json-pointer", "0", "9999" + longest_pointer},
        {"hostname", "x", longest_host},
        {"ipv4", "0.0.0.0", "255.255.255.255"},
        {"ipv6", "::", "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"},
        {"duration", "P0D", "P999999999Y999999999M999999999DT999999999H999999999M999999999S"},
        {"email", "a@b.c", longest_email},
        {"time", "00:00:00Z", "23:59:59.999999+23:59"},
        {"date-time", "2024-01-01T00:00:00Z", "2024-12-31T23:59:59.999999-23:59"},
        {"date", "2024-02-28", "2024-02-28"},
        {"uuid", std::string(8, 'a') + "-0000-0000-0000-" + std::string(12, 'b'),
         std::string(8, 'a') + "-0000-0000-0000-" + std::string(12, 'b')},
    };
    for (const auto& [format, shortest, longest] : extremes) {
        SCOPED_TRACE(format);
        EXPECT_EQ(str(format)->match(q(shortest)), -1) << shortest;
        EXPECT_EQ(str(format)->match(q(longest)), -1) << longest;
        EXPECT_NE(str(format)->match(q(longest + "0")), -1);
        // Lengths that admit the whole range are accepted; one character less at either end is not.
        const std::string ok = R"(, "minLength": )" + std::to_string(shortest.size()) + R"(, "maxLength": )" +
                               std::to_string(longest.size());
        EXPECT_NO_THROW(str(format, ok));
        if (std::string(format) == "ipv6") continue;  // its eight-group form meets such lengths (below)
        EXPECT_EQ(error_of(std::string(R"({"type": "string", "format": ")") + format + R"(", "maxLength": )" +
                           std::to_string(longest.size() - 1) + "}")
                      .first,
                  ErrorCode::kUnsupported);
        EXPECT_EQ(error_of(std::string(R"({"type": "string", "format": ")") + format + R"(", "minLength": )" +
                           std::to_string(shortest.size() + 1) + "}")
                      .first,
                  ErrorCode::kUnsupported);
    }
    // Lengths that leave out ipv6's short forms take the eight-group form.
    auto ip6_full = str("ipv6", R"(, "minLength": 7, "maxLength": 40)");
    EXPECT_EQ(ip6_full->match(q("2001:db8:0:0:0:ff00:42:8329")), -1);
    EXPECT_NE(ip6_full->match(q("::1")), -1);
    EXPECT_EQ(error_of(R"({"type": "string", "format": "ipv6", "minLength": 16})").first, ErrorCode::kUnsupported);
    // pydantic's HttpUrl.
    EXPECT_EQ(str("uri", R"(, "minLength": 1, "maxLength": 2083)")->match(q("https://x.org/a")), -1);
}

TEST(JsonSchema, JsonModeAndBoundedWhitespace) {
    auto obj = Grammar::json();
    EXPECT_EQ(obj->match(R"({"a": [1, "b", null, {"c": false}]})"), -1);
    EXPECT_NE(obj->match("[1]"), -1);  // an object by default
    EXPECT_EQ(Grammar::json(true)->match("[1]"), -1);
    EXPECT_NE(obj->match("{" + std::string(40, ' ') + "}"), -1);  // whitespace runs are bounded
    EXPECT_NE(obj->match(" {}"), -1);
}

std::pair<ErrorCode, std::string> error_of(const std::string& schema) {
    try {
        Grammar::from_json_schema(schema);
    } catch (const Error& e) {
        return {e.code(), e.what()};
    }
    return {ErrorCode::kIo, "no error"};
}

TEST(JsonSchema, ClearErrors) {
    auto [c1, m1] = error_of(R"({"type": "object", "patternProperties": {"^a": {}}})");
    EXPECT_EQ(c1, ErrorCode::kUnsupported);
    EXPECT_EQ(m1, "JSON Schema at '/': the keyword 'patternProperties' is not supported");
    auto [c2, m2] = error_of(R"({"properties": {"a": {"type": "array", "contains": {"const": 1}}}})");
    EXPECT_EQ(m2, "JSON Schema at '/properties/a': the keyword 'contains' is not supported");
    EXPECT_EQ(error_of(R"({"type": "string", "format": "uri-template"})").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"type": "number", "multipleOf": 0})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "integer", "multipleOf": -2})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "integer", "multipleOf": "2"})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "number", "multipleOf": 1e-20})").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"type": "integer", "multipleOf": 12345678})").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"type": "integer", "multipleOf": 999983})").first, ErrorCode::kUnsupported);  // prime
    EXPECT_EQ(error_of(R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})").first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "number", "minimum": 2, "exclusiveMaximum": 2})").first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"J({"type": "string", "pattern": "(a)\\1"})J").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"J({"type": "string", "pattern": "(?=a)"})J").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"$ref": "#/$defs/missing"})").first, ErrorCode::kInvalidArgument);
    // A $ref that reaches itself before any '{' or '[' has no grammar (a left recursion); through an
    // object or an array it is an ordinary recursive schema.
    auto [c3, m3] = error_of(R"({"$defs": {"n": {"type": "object"}}, "$ref": "#"})");
    EXPECT_EQ(c3, ErrorCode::kInvalidArgument);
    EXPECT_EQ(m3, "JSON Schema at '/': $ref '#' comes back to itself before any '{' or '[' (a left recursion)");
    EXPECT_EQ(error_of(R"({"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}],
                           "$defs": {"a": {"allOf": [{"$ref": "#"}]}}})")
                  .first,
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "array", "items": {"$ref": "#"}, "maxItems": 2})").second, "no error");
    EXPECT_EQ(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "array", "minItems": 3, "maxItems": 2})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of("false").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of("{\"type\": ").first, ErrorCode::kParse);
    EXPECT_EQ(error_of(R"({"type": "bogus"})").first, ErrorCode::kInvalidArgument);
    // OpenAPI's annotations ("x-" extensions, discriminator, example) say nothing about the values.
    EXPECT_EQ(error_of(R"({"type": "object", "x-order": 1, "discriminator": {"propertyName": "k"},
                           "properties": {"k": {"type": "string", "example": "a", "x-go-name": "K"}}})")
                  .second,
              "no error");
    // Keywords beside enum / const that the converter cannot check are refused, not ignored.
    EXPECT_EQ(error_of(R"({"enum": ["a", "b"], "pattern": "^a$"})").second,
              "JSON Schema at '/': 'pattern' beside enum or const is not supported");
    EXPECT_EQ(error_of(R"({"type": "integer", "enum": ["a", 1.5]})").first, ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_of(R"({"type": "integer", "minimum": 10000000000000000})").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"type": "integer", "maximum": -1e17})").first, ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"properties": {"a\u0001": {}}, "additionalProperties": true})").first,
              ErrorCode::kUnsupported);
    EXPECT_EQ(error_of(R"({"type": "string", "pattern": "^x{3,2}$"})").first, ErrorCode::kParse);
    EXPECT_EQ(error_of(R"({"allOf": [{"properties": {"a": {}}, "required": ["a"]},
                                     {"properties": {"b": {}}, "additionalProperties": false}]})")
                  .first,
              ErrorCode::kInvalidArgument);
}

TEST(JsonSchema, RegexSubset) {
    auto g = [](const std::string& re) { return Grammar::parse("root ::= " + grammar::regex_to_gbnf(re)); };
    EXPECT_EQ(g("^a(b|cd)*e?$")->match("abcdbe"), -1);
    EXPECT_NE(g("^a(b|cd)*e?$")->match("ac"), -1);
    EXPECT_EQ(g("^[^a-c]{2,3}$")->match("xyz"), -1);
    EXPECT_NE(g("^[^a-c]{2,3}$")->match("xaz"), -1);
    EXPECT_EQ(g("^\\w+@\\d\\.\\s?$")->match("ab_9@1. "), -1);
    EXPECT_EQ(g("^(?:x|y)+?$")->match("xyx"), -1);
    EXPECT_EQ(g("^\"q\\\\$")->match("\\\"q\\\\"), -1);  // '"' and '\' come out escaped, as JSON writes them
    EXPECT_EQ(g("mid")->match("  mid  "), -1);          // unanchored: a search
    // ECMAScript's classes: \s and \S over Unicode white space, '.' short of every line terminator.
    EXPECT_EQ(g("^\\s$")->match("\u00a0"), -1);
    EXPECT_NE(g("^\\S$")->match("\u3000"), -1);
    EXPECT_NE(g("^.$")->match("\u2028"), -1);
    EXPECT_EQ(g("^.$")->match("\u2027"), -1);
}

}  // namespace
}  // namespace cera
