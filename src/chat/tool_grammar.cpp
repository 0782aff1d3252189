// Tool-call grammars: each tool's parameters schema becomes GBNF (chat/grammar/json_schema.h) with its
// rules renamed under a prefix of their own, and the format's markers and separators wrap the calls.
#include "chat/tool_grammar.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "chat/grammar/json_schema.h"
#include "core/check.h"

namespace cera {
namespace {

using Json = nlohmann::ordered_json;

bool valid_name(const std::string& s) {
    if (s.empty() || s.size() > 64) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
    return true;
}

bool is_identifier(const std::string& s) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    return true;
}

bool is_rule_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

// The GBNF with every rule name (definitions and references) prefixed, so that the rules of several
// schemas live in one grammar. Literals, classes, repetition counts and comments stay as they are.
std::string prefix_rules(const std::string& gbnf, const std::string& prefix) {
    std::string out;
    out.reserve(gbnf.size() * 2);
    size_t i = 0;
    const size_t n = gbnf.size();
    while (i < n) {
        const char c = gbnf[i];
        if (c == '"' || c == '[') {
            const char close = c == '"' ? '"' : ']';
            const size_t b = i++;
            while (i < n && gbnf[i] != close) i += gbnf[i] == '\\' ? 2 : 1;
            i = std::min(i + 1, n);
            out.append(gbnf, b, i - b);
        } else if (c == '{' || c == '#') {
            const char close = c == '{' ? '}' : '\n';
            const size_t e = gbnf.find(close, i);
            const size_t end = e == std::string::npos ? n : e + 1;
            out.append(gbnf, i, end - i);
            i = end;
        } else if (is_rule_char(c)) {
            const size_t b = i;
            while (i < n && is_rule_char(gbnf[i])) ++i;
            out += prefix;
            out.append(gbnf, b, i - b);
        } else {
            out += c;
            ++i;
        }
    }
    return out;
}

std::string literal(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out + "\"";
}

// Builds the grammar's text: rules added under fresh prefixes.
struct Builder {
    std::string rules;
    std::string tool;  // the tool being written, for errors

    // The rule name of a schema's root (its rules added under `prefix`).
    std::string schema(const std::string& schema_json, const std::string& prefix) {
        std::string g;
        try {
            g = grammar::json_schema_to_gbnf(schema_json);
        } catch (const Error& e) {
            throw Error(e.code(), "tool '" + tool + "' parameters: " + e.what());
        }
        rules += prefix_rules(g, prefix);
        if (rules.back() != '\n') rules += '\n';
        return prefix + "root";
    }
};

// LFM2's keyword arguments for a plain object schema, or "" when the schema is not one (the caller
// then writes the JSON form).
std::string python_arguments(Builder& b, const Json& params, const std::string& prefix) {
    static const char* const kAllowed[] = {"type",        "properties", "required", "additionalProperties",
                                           "description", "title",      "$defs",    "definitions",
                                           "$schema",     "$id",        "$comment"};
    if (!params.is_object()) return "";
    for (const auto& [k, v] : params.items()) {
        bool ok = false;
        for (const char* a : kAllowed) ok = ok || k == a;
        if (!ok) return "";
    }
    if (params.contains("type") && params["type"] != "object") return "";
    const Json props = params.value("properties", Json::object());
    if (!props.is_object()) return "";
    std::vector<std::string> names, values;
    std::vector<bool> required;
    const Json req = params.value("required", Json::array());
    if (!req.is_array()) return "";
    for (const auto& r : req)
        if (!r.is_string() || !props.contains(r.get<std::string>())) return "";
    for (const auto& [k, v] : props.items()) {
        if (!is_identifier(k)) return "";
        Json one = v;
        if (!one.is_object() && !one.is_boolean()) return "";
        // A property's schema alone still resolves the parameters' own definitions.
        if (one.is_object())
            for (const char* defs : {"$defs", "definitions"})
                if (params.contains(defs)) one[defs] = params[defs];
        names.push_back(k);
        values.push_back(b.schema(one.dump(), prefix + std::to_string(names.size()) + "-"));
        required.push_back(std::find(req.begin(), req.end(), Json(k)) != req.end());
    }
    const size_t n = names.size();
    auto item = [&](size_t j) { return literal(names[j] + "=") + " " + values[j]; };
    // after(k): the properties from k on once one is written (each with its ", ");
    // start(k): the properties from k on when none is written yet (one rule per k).
    auto after = [&](size_t k) {
        std::string s;
        for (size_t j = k; j < n; ++j) s += required[j] ? " \", \" " + item(j) : " ( \", \" " + item(j) + " )?";
        return s;
    };
    for (size_t k = n; k-- > 0;) {
        const std::string next = k + 1 < n ? prefix + "s" + std::to_string(k + 1) : "\"\"";
        const std::string body =
            required[k] ? item(k) + after(k + 1) : "( " + item(k) + after(k + 1) + " | " + next + " )";
        b.rules += prefix + "s" + std::to_string(k) + " ::= " + body + "\n";
    }
    return n == 0 ? std::string("\"\"") : prefix + "s0";
}

}  // namespace

const char* tool_call_grammar_trigger(ToolCallFormat format) {
    return format == ToolCallFormat::kLlama3 ? "{\"name\"" : tool_call_trigger(format);
}

std::string tool_call_gbnf(ToolCallFormat format, const std::vector<ToolDef>& tools,
                           const ToolGrammarOptions& options) {
    if (tools.empty()) throw_error(ErrorCode::kInvalidArgument, "tool calls need at least one tool");
    Builder b;
    std::string calls;
    bool named_found = false;
    for (size_t i = 0; i < tools.size(); ++i) {
        const ToolDef& t = tools[i];
        if (!valid_name(t.name))
            throw_error(ErrorCode::kInvalidArgument, "tool name '%s' is not 1 to 64 of [A-Za-z0-9_-]", t.name.c_str());
        if (options.choice == ToolChoice::kNamed && t.name != options.function) continue;
        named_found = true;
        b.tool = t.name;
        const std::string prefix = "t" + std::to_string(i) + "-";
        Json params = Json::object();
        if (!t.parameters_json.empty()) {
            params = Json::parse(t.parameters_json, nullptr, false);
            if (params.is_discarded())
                throw_error(ErrorCode::kParse, "tool '%s' parameters: not valid JSON", t.name.c_str());
        }
        std::string call;
        if (format == ToolCallFormat::kLfm2) {
            const std::string args = python_arguments(b, params, prefix + "p");
            if (!args.empty()) call = literal(t.name + "(") + " " + args + " \")\"";
        }
        if (call.empty()) {
            const std::string args = t.parameters_json.empty() ? "\"{}\"" : b.schema(params.dump(), prefix);
            const char* key = format == ToolCallFormat::kLlama3 ? "parameters" : "arguments";
            call = literal("{\"name\": \"" + t.name + "\", \"" + key + "\": ") + " " + args + " \"}\"";
        }
        calls += (calls.empty() ? "" : " | ") + call;
    }
    if (!named_found)
        throw_error(ErrorCode::kInvalidArgument, "tool_choice names '%s', which is not among the tools",
                    options.function.c_str());
    std::string root;
    const std::string more = options.parallel ? "*" : "";
    switch (format) {
        case ToolCallFormat::kLfm2:
            root = "\"<|tool_call_start|>[\" call ( \", \" call )" + more + " \"]<|tool_call_end|>\"";
            break;
        case ToolCallFormat::kHermes:
            root = "tc ( \"\\n\" tc )" + more + "\ntc ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"";
            break;
        case ToolCallFormat::kLlama3:
            root = "call ( \"; \" call )" + more;
            break;
        case ToolCallFormat::kGranite:
            root = "\"<|tool_call|>[\" call ( \", \" call )" + more + " \"]\"";
            break;
    }
    if (!options.parallel) {
        // One call: drop the repetition group entirely.
        const size_t open = root.find(" (");
        const size_t close = root.find(" )", open);
        root.erase(open, close + 2 - open);
    }
    return "root ::= " + root + "\ncall ::= " + calls + "\n" + b.rules;
}

std::shared_ptr<const Grammar> tool_call_grammar(ToolCallFormat format, const std::vector<ToolDef>& tools,
                                                 const ToolGrammarOptions& options) {
    if (options.choice == ToolChoice::kNone) return nullptr;
    const std::string gbnf = tool_call_gbnf(format, tools, options);
    if (options.choice == ToolChoice::kAuto) return Grammar::lazy(gbnf, tool_call_grammar_trigger(format));
    return Grammar::parse(gbnf);
}

}  // namespace cera
