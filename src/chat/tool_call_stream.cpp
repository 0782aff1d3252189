// Streamed tool calls: at each piece the text from the first call's marker on is scanned again (it is
// short) into calls whose names and complete arguments are known; what is new since the last piece is
// sent. Arguments are split at their top-level commas (outside strings and brackets) and each complete
// argument is written compactly, so the fragments join into the compact object of the final parse.
#include "chat/tool_call_stream.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "chat/tool_grammar.h"

namespace cera {
namespace {

using Json = nlohmann::ordered_json;

bool space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && space(s[i])) ++i;
    return i;
}

std::string_view trim(std::string_view s) {
    size_t b = skip_ws(s, 0), e = s.size();
    while (e > b && space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

// The members of a bracketed list from `i` (just after the opener) to `close`: the complete ones, the
// unfinished last one, and where the list ends (npos while it is open).
struct Members {
    std::vector<std::string_view> done;
    std::string_view partial;
    size_t end = std::string_view::npos;
};
Members members(std::string_view s, size_t i, char close, bool python) {
    Members m;
    size_t b = i;
    int depth = 0;
    char quote = 0;
    for (; i < s.size(); ++i) {
        const char c = s[i];
        if (quote) {
            if (c == '\\')
                ++i;
            else if (c == quote)
                quote = 0;
        } else if (c == '"' || (python && c == '\'')) {
            quote = c;
        } else if (c == '[' || c == '{' || c == '(') {
            ++depth;
        } else if ((c == ']' || c == '}' || c == ')') && depth > 0) {
            --depth;
        } else if (depth == 0 && (c == ',' || c == close)) {
            const std::string_view t = trim(s.substr(b, i - b));
            if (!t.empty()) m.done.push_back(t);
            b = i + 1;
            if (c == close) {
                m.end = i + 1;
                return m;
            }
        }
    }
    m.partial = trim(s.substr(b));
    return m;
}

// One call as far as the text goes.
struct CallView {
    bool named = false;
    std::string name;
    std::vector<std::string> args;  // complete arguments, compact ("key":value)
    bool args_open = false, args_closed = false;
};

// `"key":value` compact, from a JSON member or a Python keyword argument; empty if it does not parse.
std::string compact(std::string_view member, bool python) {
    if (python) {
        const ParsedToolCalls p = parse_tool_calls(
            "<|tool_call_start|>[f(" + std::string(member) + ")]<|tool_call_end|>", ToolCallFormat::kLfm2);
        if (p.calls.size() != 1 || p.calls[0].arguments_json.size() < 2) return "";
        const std::string& a = p.calls[0].arguments_json;
        return a.substr(1, a.size() - 2);
    }
    const Json j = Json::parse("{" + std::string(member) + "}", nullptr, false);
    if (j.is_discarded() || j.size() != 1) return "";
    const std::string a = j.dump();
    return a.substr(1, a.size() - 2);
}

void arguments(std::string_view s, size_t open, char close, bool python, CallView& c) {
    c.args_open = true;
    const Members m = members(s, open + 1, close, python);
    for (std::string_view x : m.done) {
        std::string one = compact(x, python);
        if (one.empty()) return;  // malformed: the final parse decides
        c.args.push_back(std::move(one));
    }
    c.args_closed = m.end != std::string_view::npos;
}

// A JSON call object at s[i] == '{': {"name": ..., "arguments" | "parameters": {...}}. Returns the
// position after it, or npos while it is open.
size_t json_call(std::string_view s, size_t i, CallView& c) {
    const Members m = members(s, i + 1, '}', false);
    auto member = [&](std::string_view x, bool complete) {
        const size_t colon = members(x, 0, ':', false).end;  // the key's end (":" outside strings)
        if (colon == std::string_view::npos) return;
        const Json key = Json::parse(trim(x.substr(0, colon - 1)), nullptr, false);
        if (!key.is_string()) return;
        const std::string_view v = trim(x.substr(colon));
        if (key == "name" && complete) {
            const Json n = Json::parse(v, nullptr, false);
            if (n.is_string()) c.named = true, c.name = n.get<std::string>();
        } else if ((key == "arguments" || key == "parameters") && !v.empty() && v[0] == '{') {
            arguments(v, 0, '}', false, c);
        }
    };
    for (std::string_view x : m.done) member(x, true);
    if (!m.partial.empty()) member(m.partial, false);
    return m.end;
}

// The calls from the first marker on, as far as they go.
std::vector<CallView> scan(std::string_view s, ToolCallFormat f) {
    std::vector<CallView> calls;
    size_t i = 0;
    auto eat = [&](std::string_view lit) {
        i = skip_ws(s, i);
        if (s.substr(i, lit.size()) != lit) return false;
        i += lit.size();
        return true;
    };
    auto more = [&](char sep) {  // after a call: a separator, or the list ends
        i = skip_ws(s, i);
        if (i < s.size() && s[i] == sep) return ++i, true;
        return false;
    };
    switch (f) {
        case ToolCallFormat::kLfm2:
            if (!eat("<|tool_call_start|>") || !eat("[")) return calls;
            for (;;) {
                i = skip_ws(s, i);
                if (i >= s.size()) return calls;
                CallView c;
                if (s[i] == '{') {
                    i = json_call(s, i, c);
                } else {
                    const size_t open = s.find('(', i);
                    if (open == std::string_view::npos) return calls;
                    c.name = std::string(trim(s.substr(i, open - i)));
                    for (char ch : c.name)  // a Python name (the parser's), or no call
                        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '-')
                            return calls;
                    c.named = !c.name.empty();
                    arguments(s, open, ')', true, c);
                    const Members m = members(s, open + 1, ')', true);
                    i = m.end;
                }
                calls.push_back(std::move(c));
                if (i == std::string_view::npos || !more(',')) return calls;
            }
        case ToolCallFormat::kHermes:
            while (eat("<tool_call>")) {
                i = skip_ws(s, i);
                if (i >= s.size() || s[i] != '{') return calls;
                CallView c;
                i = json_call(s, i, c);
                calls.push_back(std::move(c));
                if (i == std::string_view::npos || !eat("</tool_call>")) return calls;
            }
            return calls;
        case ToolCallFormat::kGranite:
        case ToolCallFormat::kLlama3: {
            const bool granite = f == ToolCallFormat::kGranite;
            if (granite && (!eat("<|tool_call|>") || !eat("["))) return calls;
            for (;;) {
                i = skip_ws(s, i);
                if (i >= s.size() || s[i] != '{') return calls;
                CallView c;
                i = json_call(s, i, c);
                calls.push_back(std::move(c));
                if (i == std::string_view::npos || !more(granite ? ',' : ';')) return calls;
            }
        }
    }
    return calls;
}

}  // namespace

ToolCallStream::ToolCallStream(ToolCallFormat format, std::string id_prefix)
    : format_(format), id_prefix_(std::move(id_prefix)), trigger_(tool_call_grammar_trigger(format)) {}

ToolStreamDelta ToolCallStream::push(std::string_view text) {
    text_ += text;
    ToolStreamDelta d;
    advance(d, false);
    sent_content_ += d.content;
    return d;
}

void ToolCallStream::advance(ToolStreamDelta& d, bool final) {
    // Llama 3 may open its calls with <|python_tag|> or with the JSON alone.
    std::vector<std::string_view> markers = {trigger_};
    if (format_ == ToolCallFormat::kLlama3) markers.push_back("<|python_tag|>");
    if (calls_at_ == std::string::npos) {
        const size_t from = content_sent_ > 16 ? content_sent_ - 16 : 0;
        for (std::string_view m : markers) calls_at_ = std::min(calls_at_, text_.find(m, from));
    }
    // Content: up to the calls, holding back a tail that may be the start of a marker, and blanks
    // (the reply's content is trimmed at both ends).
    size_t upto = calls_at_ == std::string::npos ? text_.size() : calls_at_;
    if (calls_at_ == std::string::npos && !final) {
        for (std::string_view m : markers)
            for (size_t k = std::min(m.size() - 1, text_.size()); k > 0; --k)
                if (text_.compare(text_.size() - k, k, m, 0, k) == 0) {
                    upto = std::min(upto, text_.size() - k);
                    break;
                }
    }
    if (!final || calls_at_ != std::string::npos)
        while (upto > content_sent_ && space(text_[upto - 1])) --upto;
    if (upto > content_sent_) {
        size_t b = content_sent_;
        if (b == 0) b = skip_ws(text_, 0);
        if (upto > b) d.content = text_.substr(b, upto - b);
        content_sent_ = upto;
    }
    if (calls_at_ == std::string::npos) return;
    const std::string_view calls_text = std::string_view(text_).substr(calls_at_);
    std::vector<CallView> calls =
        scan(format_ == ToolCallFormat::kLlama3 && calls_text.rfind("<|python_tag|>", 0) == 0 ? calls_text.substr(14)
                                                                                              : calls_text,
             format_);
    for (size_t i = 0; i < calls.size(); ++i) {
        const CallView& c = calls[i];
        if (!c.named) break;
        if (i == args_sent_.size()) {
            args_sent_.emplace_back();
            d.calls.push_back({i, id_prefix_ + std::to_string(i), c.name, ""});
        }
        if (!c.args_open) continue;
        std::string target = "{";
        for (size_t k = 0; k < c.args.size(); ++k) target += (k ? "," : "") + c.args[k];
        if (c.args_closed) target += "}";
        std::string& sent = args_sent_[i];
        if (target.size() > sent.size() && target.compare(0, sent.size(), sent) == 0) {
            const std::string more = target.substr(sent.size());
            if (!d.calls.empty() && d.calls.back().index == i)
                d.calls.back().arguments += more;
            else
                d.calls.push_back({i, "", "", more});
            sent = target;
        }
    }
}

ToolStreamDelta ToolCallStream::finish() {
    ToolStreamDelta d;
    advance(d, true);
    result_ = parse_tool_calls(text_, format_);
    for (size_t i = 0; i < result_.calls.size(); ++i) result_.calls[i].id = id_prefix_ + std::to_string(i);
    if (result_.calls.empty()) {
        // Not calls after all: the rest of the text is content (what the stream has not sent yet).
        if (content_sent_ < text_.size()) {
            size_t b = content_sent_ == 0 ? skip_ws(text_, 0) : content_sent_;
            d.content += text_.substr(b);
        }
        content_sent_ = text_.size();
        return d;
    }
    // Text after the calls (LFM2 often writes a sentence there) is content too: what the whole parse
    // holds beyond what has streamed.
    sent_content_ += d.content;
    if (result_.content.size() > sent_content_.size() &&
        result_.content.compare(0, sent_content_.size(), sent_content_) == 0)
        d.content += result_.content.substr(sent_content_.size());
    for (size_t i = 0; i < result_.calls.size(); ++i) {
        const ToolCall& c = result_.calls[i];
        if (i == args_sent_.size()) {
            args_sent_.emplace_back();
            d.calls.push_back({i, c.id, c.name, ""});
        }
        std::string& sent = args_sent_[i];
        if (c.arguments_json.size() > sent.size() && c.arguments_json.compare(0, sent.size(), sent) == 0) {
            const std::string more = c.arguments_json.substr(sent.size());
            if (!d.calls.empty() && d.calls.back().index == i)
                d.calls.back().arguments += more;
            else
                d.calls.push_back({i, "", "", more});
            sent = c.arguments_json;
        }
    }
    return d;
}

}  // namespace cera
