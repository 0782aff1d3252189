// Tool-call parsing: find each format's markers, parse the calls (JSON with nlohmann, LFM2's Python
// calls with a small literal parser), and fall back to plain content when anything is malformed.
#include "chat/tool_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

namespace cera {
namespace {

using Json = nlohmann::ordered_json;

std::string trim(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return std::string(s.substr(b, e - b));
}

// Python literals and calls (LFM2): name(key=value, ...), values str/int/float/True/False/None/list/dict.
class Py {
 public:
    explicit Py(std::string_view s) : s_(s) {}

    // [call, call, ...] to the end of the text.
    std::optional<std::vector<ToolCall>> calls() {
        std::vector<ToolCall> out;
        ws();
        const bool list = eat('[');
        for (;;) {
            ws();
            if (list && eat(']')) break;
            auto c = call();
            if (!c) return std::nullopt;
            out.push_back(std::move(*c));
            ws();
            if (eat(',')) continue;
            if (list && eat(']')) break;
            if (!list) break;
            return std::nullopt;
        }
        ws();
        if (pos_ != s_.size() || out.empty()) return std::nullopt;
        return out;
    }

 private:
    void ws() {
        while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    bool eat(char c) {
        if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
        return false;
    }
    std::string ident() {
        const size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' ||
                                    s_[pos_] == '.' || s_[pos_] == '-'))
            ++pos_;
        return std::string(s_.substr(b, pos_ - b));
    }
    std::optional<ToolCall> call() {
        ToolCall c;
        c.name = ident();
        ws();
        if (c.name.empty() || !eat('(')) return std::nullopt;
        Json args = Json::object();
        ws();
        if (!eat(')')) {
            for (;;) {
                ws();
                const std::string key = ident();
                ws();
                if (key.empty() || !eat('=')) return std::nullopt;
                auto v = value(0);
                if (!v) return std::nullopt;
                args[key] = std::move(*v);
                ws();
                if (eat(',')) continue;
                if (eat(')')) break;
                return std::nullopt;
            }
        }
        c.arguments_json = args.dump();
        return c;
    }
    std::optional<Json> value(int depth) {
        if (depth > 64) return std::nullopt;
        ws();
        if (pos_ >= s_.size()) return std::nullopt;
        const char c = s_[pos_];
        if (c == '"' || c == '\'') return string(c);
        if (c == '[' || c == '(') {
            const char close = c == '[' ? ']' : ')';
            ++pos_;
            Json a = Json::array();
            for (;;) {
                ws();
                if (eat(close)) return a;
                auto v = value(depth + 1);
                if (!v) return std::nullopt;
                a.push_back(std::move(*v));
                ws();
                if (eat(',')) continue;
                if (eat(close)) return a;
                return std::nullopt;
            }
        }
        if (c == '{') {
            ++pos_;
            Json o = Json::object();
            for (;;) {
                ws();
                if (eat('}')) return o;
                auto k = value(depth + 1);
                ws();
                if (!k || !k->is_string() || !eat(':')) return std::nullopt;
                auto v = value(depth + 1);
                if (!v) return std::nullopt;
                o[k->get<std::string>()] = std::move(*v);
                ws();
                if (eat(',')) continue;
                if (eat('}')) return o;
                return std::nullopt;
            }
        }
        const size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
                                    s_[pos_] == '-' || s_[pos_] == '+'))
            ++pos_;
        const std::string word(s_.substr(b, pos_ - b));
        if (word == "True" || word == "true") return Json(true);
        if (word == "False" || word == "false") return Json(false);
        if (word == "None" || word == "null") return Json(nullptr);
        if (word.empty()) return std::nullopt;
        const Json n = Json::parse(word, nullptr, false);
        if (n.is_discarded() || !n.is_number()) return std::nullopt;
        return n;
    }
    std::optional<Json> string(char q) {
        ++pos_;
        std::string out;
        while (pos_ < s_.size() && s_[pos_] != q) {
            char c = s_[pos_++];
            if (c == '\\') {
                if (pos_ >= s_.size()) return std::nullopt;
                const char e = s_[pos_++];
                switch (e) {
                    case 'n':
                        c = '\n';
                        break;
                    case 't':
                        c = '\t';
                        break;
                    case 'r':
                        c = '\r';
                        break;
                    case '0':
                        c = '\0';
                        break;
                    default:
                        c = e;  // \\ \' \" and anything else as itself
                }
            }
            out += c;
        }
        if (!eat(q)) return std::nullopt;
        const Json j = out;
        try {
            (void)j.dump();  // invalid UTF-8 makes the call malformed
        } catch (const nlohmann::json::exception&) {
            return std::nullopt;
        }
        return j;
    }

    std::string_view s_;
    size_t pos_ = 0;
};

// One JSON call object {"name": ..., "arguments" | "parameters": {...}}.
std::optional<ToolCall> json_call(const Json& j) {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
    ToolCall c;
    c.name = j["name"].get<std::string>();
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    if (!j.contains(key)) {
        c.arguments_json = "{}";
    } else if (j[key].is_object()) {
        c.arguments_json = j[key].dump();
    } else if (j[key].is_string()) {  // arguments written as a JSON string
        const Json a = Json::parse(j[key].get<std::string>(), nullptr, false);
        if (a.is_discarded() || !a.is_object()) return std::nullopt;
        c.arguments_json = a.dump();
    } else {
        return std::nullopt;
    }
    if (j.contains("id") && j["id"].is_string()) c.id = j["id"].get<std::string>();
    return c;
}

// A JSON call or a JSON list of calls.
bool json_calls(std::string_view text, std::vector<ToolCall>& out) {
    const Json j = Json::parse(text.begin(), text.end(), nullptr, false);
    if (j.is_discarded()) return false;
    if (j.is_array()) {
        if (j.empty()) return false;
        for (const auto& e : j) {
            auto c = json_call(e);
            if (!c) return false;
            out.push_back(std::move(*c));
        }
        return true;
    }
    auto c = json_call(j);
    if (!c) return false;
    out.push_back(std::move(*c));
    return true;
}

// Calls between `open` and `close` markers (close may be missing at the very end of the output).
ParsedToolCalls between(std::string_view text, std::string_view open, std::string_view close, bool pythonic) {
    ParsedToolCalls r;
    std::string content;
    size_t pos = 0;
    for (;;) {
        const size_t a = text.find(open, pos);
        if (a == std::string_view::npos) {
            content += text.substr(pos);
            break;
        }
        content += text.substr(pos, a - pos);
        const size_t body = a + open.size();
        size_t b = close.empty() ? std::string_view::npos : text.find(close, body);
        const std::string_view inner =
            text.substr(body, b == std::string_view::npos ? std::string_view::npos : b - body);
        const std::string t = trim(inner);
        bool ok = false;
        if (pythonic) {  // Python calls, or the JSON form a system prompt may ask for
            if (auto calls = Py(t).calls()) {
                r.calls.insert(r.calls.end(), calls->begin(), calls->end());
                ok = true;
            }
        }
        if (!ok) ok = json_calls(t, r.calls);
        if (!ok) return {std::string(text), {}};
        if (b == std::string_view::npos) break;
        pos = b + close.size();
    }
    r.content = r.calls.empty() ? std::string(text) : trim(content);
    return r;
}

}  // namespace

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kLfm2:
            return between(text, "<|tool_call_start|>", "<|tool_call_end|>", true);
        case ToolCallFormat::kHermes:
            return between(text, "<tool_call>", "</tool_call>", false);
        case ToolCallFormat::kGranite:
            return between(text, "<|tool_call|>", "", false);
        case ToolCallFormat::kLlama3: {
            std::string_view t = text;
            const size_t tag = t.find("<|python_tag|>");
            std::string before;
            if (tag != std::string_view::npos) {
                before = trim(t.substr(0, tag));
                t = t.substr(tag + 14);
            } else if (const size_t call = t.find("{\"name\""); call != std::string_view::npos) {
                before = trim(t.substr(0, call));  // text, then a call (as a lazy grammar lets the model write)
                t = t.substr(call);
            }
            const std::string body = trim(t);
            if (body.empty() || body[0] != '{') return {std::string(text), {}};
            ParsedToolCalls r;
            // Several calls are separated by ';' (a ';' inside a string is not a separator, so each
            // split is tried as a whole first).
            if (!json_calls(body, r.calls)) {
                size_t from = 0;
                while (from < body.size()) {
                    size_t semi = body.find(';', from);
                    for (;; semi = body.find(';', semi + 1)) {
                        const std::string part = trim(std::string_view(body).substr(from, semi - from));
                        std::vector<ToolCall> one;
                        if (json_calls(part, one)) {
                            r.calls.insert(r.calls.end(), one.begin(), one.end());
                            break;
                        }
                        if (semi == std::string::npos) return {std::string(text), {}};
                    }
                    if (semi == std::string::npos) break;
                    from = semi + 1;
                }
            }
            r.content = before;
            return r;
        }
    }
    return {std::string(text), {}};
}

ToolCallFormat tool_call_format_for(std::string_view architecture, std::string_view chat_template) {
    if (architecture.rfind("lfm2", 0) == 0) return ToolCallFormat::kLfm2;
    if (architecture == "granite") return ToolCallFormat::kGranite;
    if (architecture == "llama" && chat_template.find("<tool_call>") == std::string_view::npos)
        return ToolCallFormat::kLlama3;
    return ToolCallFormat::kHermes;
}

const char* tool_call_trigger(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kLfm2:
            return "<|tool_call_start|>";
        case ToolCallFormat::kHermes:
            return "<tool_call>";
        case ToolCallFormat::kLlama3:
            return "{";
        case ToolCallFormat::kGranite:
            return "<|tool_call|>";
    }
    return "";
}

std::vector<std::string> tool_call_markers(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kLfm2:
            return {"<|tool_call_start|>", "<|tool_call_end|>"};
        case ToolCallFormat::kHermes:
            return {"<tool_call>", "</tool_call>"};
        case ToolCallFormat::kLlama3:
            return {"<|python_tag|>"};
        case ToolCallFormat::kGranite:
            return {"<|tool_call|>"};
    }
    return {};
}

}  // namespace cera
