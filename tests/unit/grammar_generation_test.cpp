// Constrained generation end to end: fixture models sample at temperature 1 (no other filter) under
// JSON Schemas, JSON mode and GBNF grammars, many seeds, through the Batcher (several sequences per
// step) and a Session. Every finished output is checked by independent validators: nlohmann-json
// parses it, ajv (tests/node-schema, run with node when present) validates it against its schema,
// and hand-written checkers validate the GBNF outputs; an unfinished one must be a prefix of the
// language. A sequence's output does not depend on the batch: the Session gives the same text.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/grammar.h"
#include "cera/session.h"
#include "test_util.h"

namespace cera {
namespace {

const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "long tag"]}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["zip"], "additionalProperties": false}},
  "required": ["name", "age"], "additionalProperties": false})";
const char* kTree = R"({"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer", "minimum": -9, "maximum": 99},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
  "$ref": "#/$defs/node"})";
const char* kFormats = R"({"type": "object", "properties": {
    "d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
    "dt": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
    "any": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}, {"type": "boolean"}]}},
  "required": ["d", "u", "any"]})";
const char* kWeb = R"({"type": "object", "properties": {
    "ip": {"type": "string", "format": "ipv4"}, "p": {"type": "number", "minimum": 0, "maximum": 1},
    "lat": {"type": "number", "exclusiveMinimum": -90.5, "maximum": 90}, "host": {"type": "string", "format": "hostname"},
    "web": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
    "ip6": {"type": "string", "format": "ipv6"}, "wait": {"type": "string", "format": "duration"},
    "ref": {"type": "string", "format": "uri-reference"}, "ptr": {"type": "string", "format": "json-pointer"},
    "rel": {"type": "string", "format": "relative-json-pointer"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": true},
    "price": {"type": "number", "multipleOf": 0.05, "minimum": 0, "maximum": 1000},
    "n": {"type": "integer", "multipleOf": 7, "minimum": -1000000, "exclusiveMaximum": 1000000}},
  "required": ["ip", "p"], "additionalProperties": false})";
const char* kTuple =
    R"({"type": "array", "prefixItems": [{"enum": ["x", "y"]}, {"type": "integer"}, {"const": [1, "z"]}],
  "items": false})";
const char* kExtra = R"({"type": "object", "properties": {"id": {"type": "string", "maxLength": 4}},
  "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "required": ["id"],
  "minProperties": 2, "maxProperties": 4})";

// Arithmetic with + - * / and parentheses: a recursive-descent recogniser.
struct Arith {
    const std::string& s;
    size_t i = 0;
    bool num() {
        const size_t b = i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
        return i > b;
    }
    bool factor() {
        if (i < s.size() && s[i] == '(') {
            ++i;
            if (!expr() || i >= s.size() || s[i] != ')') return false;
            ++i;
            return true;
        }
        return num();
    }
    bool expr() {
        for (;;) {
            if (!factor()) return false;
            if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == '*' || s[i] == '/')) {
                ++i;
                continue;
            }
            return true;
        }
    }
    static bool check(const std::string& text) {
        Arith a{text};
        return a.expr() && a.i == text.size();
    }
};

struct GbnfCase {
    const char* name;
    const char* gbnf;
    bool (*check)(const std::string&);
};
const GbnfCase kGbnf[] = {
    {"arithmetic", "root ::= expr\nexpr ::= factor ([-+*/] factor)*\nfactor ::= [0-9]{1,4} | \"(\" expr \")\"",
     Arith::check},
    {"chess", "root ::= move (\" \" move){0,5}\nmove ::= [KQRBN]? [a-h] [1-8] | \"O-O\"",
     [](const std::string& t) {
         static const std::regex re("((K|Q|R|B|N)?[a-h][1-8]|O-O)( ((K|Q|R|B|N)?[a-h][1-8]|O-O)){0,5}");
         return std::regex_match(t, re);
     }},
    {"list", "root ::= (\"- \" [a-z]{1,8} \"\\n\"){1,4}",
     [](const std::string& t) { return std::regex_match(t, std::regex("(- [a-z]{1,8}\n){1,4}")); }},
};

struct Out {
    std::string text;
    FinishReason finish;
};

std::vector<Out> generate(const std::shared_ptr<Engine>& e, const std::shared_ptr<const Grammar>& g, int seeds,
                          int max_tokens, uint64_t seed_base) {
    auto batcher = Batcher::create(e, {.parallel = 6, .n_ctx = 512});
    const std::vector<int32_t> prompt = e->tokenize("Data: ", true, false);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int s = 0; s < seeds; ++s) {
        GenerateOptions o;
        o.max_tokens = max_tokens;
        o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed_base + uint64_t(s)};
        o.grammar = g;
        reqs.push_back(batcher->submit(prompt, o));
    }
    std::vector<Out> outs;
    for (auto& r : reqs) {
        const GenerationResult res = r->wait();
        outs.push_back({res.text, res.finish});
    }
    // The first seed again, alone in a Session: the same text.
    Session s(e);
    s.append_tokens(prompt);
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed_base};
    o.grammar = g;
    NullSink sink;
    EXPECT_EQ(s.generate(o, sink).text, outs[0].text);
    return outs;
}

bool finished(const Out& o) { return o.finish == FinishReason::kEos || o.finish == FinishReason::kStop; }

// seeds per JSON case and per GBNF case, for each of the two models.
void run_suite(int json_seeds, int gbnf_seeds, uint64_t seed_base) {
    const std::vector<std::string> models = {test::source_path("models/tiny-lfm2-Q8_0.gguf"),
                                             test::data_path("fixtures/tiny-qwen3/model.gguf")};
    const std::vector<std::pair<std::string, const char*>> schemas = {
        {"json-mode", nullptr}, {"person", kPerson}, {"tree", kTree}, {"formats", kFormats},
        {"tuple", kTuple},      {"extra", kExtra},   {"web", kWeb}};
    nlohmann::json cases = nlohmann::json::array();
    int total = 0, complete = 0;
    for (const auto& path : models) {
        auto e = Engine::load(path, {.device = "cpu", .threads = 1, .n_ctx = 512});
        for (const auto& [name, schema] : schemas) {
            SCOPED_TRACE(path + " " + name);
            auto g = schema ? Grammar::from_json_schema(schema) : Grammar::json();
            nlohmann::json c = {{"name", name},
                                {"schema", schema ? nlohmann::json::parse(schema) : nullptr},
                                {"outputs", nlohmann::json::array()}};
            for (const Out& o : generate(e, g, json_seeds, 200, seed_base)) {
                ++total;
                if (!finished(o)) {  // cut by max_tokens: a prefix of the language
                    EXPECT_EQ(g->match(o.text), int64_t(o.text.size())) << o.text;
                    continue;
                }
                ++complete;
                EXPECT_TRUE(nlohmann::json::accept(o.text)) << o.text;
                if (!schema) {
                    EXPECT_TRUE(nlohmann::json::parse(o.text).is_object()) << o.text;
                }
                c["outputs"].push_back(o.text);
            }
            cases.push_back(c);
        }
        for (const GbnfCase& gc : kGbnf) {
            SCOPED_TRACE(path + " " + gc.name);
            auto g = Grammar::parse(gc.gbnf);
            for (const Out& o : generate(e, g, gbnf_seeds, 120, seed_base)) {
                ++total;
                if (!finished(o)) continue;
                ++complete;
                EXPECT_TRUE(gc.check(o.text)) << gc.name << ": " << o.text;
                EXPECT_EQ(g->match(o.text), -1) << o.text;
            }
        }
    }
    std::printf("%d constrained generations, %d finished\n", total, complete);
    EXPECT_GT(complete, total / 2);

    // ajv, when node and the modules of tests/node-schema are there.
    const std::string dir = test::source_path("tests/node-schema");
    if (std::system("node --version >/dev/null 2>&1") != 0 || !std::filesystem::exists(dir + "/node_modules/ajv")) {
        std::printf("ajv check skipped: node or %s/node_modules is absent (scripts/bootstrap installs them)\n",
                    dir.c_str());
        return;
    }
    const std::string file = (std::filesystem::temp_directory_path() / "cera_grammar_cases.json").string();
    std::ofstream(file) << cases.dump();
    const auto r = test::run_shell("node " + test::shell_quote(dir + "/validate.js") + " " + test::shell_quote(file));
    std::printf("%s", r.out.c_str());
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    std::filesystem::remove(file);
}

TEST(GrammarGeneration, OutputsAlwaysParse) { run_suite(24, 16, 1000); }

// A lazy grammar (tool_choice "auto"): free text until the trigger, then the grammar to its end. The
// model writes " the" often; after it the grammar wants a space, a short word and a full stop (so a
// token such as " them" may not complete the trigger).
TEST(GrammarGeneration, LazyGrammarConstrainsFromTheTrigger) {
    auto e =
        Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1, .n_ctx = 512});
    auto g = Grammar::lazy(R"(root ::= " the " [a-z]{1,6} ".")", " the");
    const std::regex tail(" the [a-z]{1,6}\\.");
    int triggered = 0;
    for (const Out& o : generate(e, g, 16, 200, 300)) {
        const size_t at = o.text.find(" the");
        if (at == std::string::npos) {  // free text throughout: it ends as the model ends it, or at the limit
            EXPECT_TRUE(o.finish == FinishReason::kEos || o.finish == FinishReason::kLength) << o.text;
            continue;
        }
        ++triggered;
        EXPECT_EQ(o.finish, FinishReason::kStop) << o.text;  // the grammar is complete: generation ends
        EXPECT_TRUE(std::regex_match(o.text.substr(at), tail)) << o.text;
        EXPECT_EQ(g->match(o.text), -1) << o.text;
    }
    EXPECT_GE(triggered, 8);
}

// The bar's 2,000+ generations (about 2,900, with different seeds): --gtest_also_run_disabled_tests.
TEST(GrammarGeneration, DISABLED_ManySeeds) { run_suite(180, 120, 50000); }

}  // namespace
}  // namespace cera
