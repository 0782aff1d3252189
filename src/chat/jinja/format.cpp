#include "chat/jinja/format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja/error.h"
#include "chat/jinja/text.h"

namespace cera::jinja {

namespace {

constexpr int kMaxNesting = 200;  // deeper (or self-containing) containers are refused

}  // namespace

std::string format_float(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
    std::string out;
    size_t p = 0;
    if (sci[0] == '-') {
        out.push_back('-');
        p = 1;
    }
    size_t e_pos = sci.find('e');
    std::string digits;
    for (size_t i = p; i < e_pos; ++i)
        if (sci[i] != '.') digits.push_back(sci[i]);
    int exp = std::atoi(sci.c_str() + e_pos + 1);
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            size_t int_len = static_cast<size_t>(exp) + 1;
            if (digits.size() <= int_len) {
                out += digits + std::string(int_len - digits.size(), '0') + ".0";
            } else {
                out += digits.substr(0, int_len) + "." + digits.substr(int_len);
            }
        } else {
            out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return out + eb;
}

static void repr_into(std::string& out, const Value& v, bool quote_strings, int depth) {
    if (depth > kMaxNesting) eval_fail("value nested too deeply (or contains itself)");
    switch (v.kind()) {
        case ValueKind::kUndefined: out += quote_strings ? "Undefined" : ""; return;
        case ValueKind::kNone: out += "None"; return;
        case ValueKind::kBool: out += v.as_bool() ? "True" : "False"; return;
        case ValueKind::kInt: out += std::to_string(v.as_int()); return;
        case ValueKind::kFloat: out += format_float(v.as_float()); return;
        case ValueKind::kString: out += quote_strings ? py_repr_string(v.as_string()) : v.as_string(); return;
        case ValueKind::kList: {
            out.push_back('[');
            bool first = true;
            for (const Value& x : v.as_list()) {
                if (!first) out += ", ";
                first = false;
                repr_into(out, x, true, depth + 1);
            }
            out.push_back(']');
            return;
        }
        case ValueKind::kDict: {
            if (v.is_namespace()) out += "<Namespace ";
            out.push_back('{');
            bool first = true;
            for (const auto& [k, x] : v.as_dict().items) {
                if (!first) out += ", ";
                first = false;
                repr_into(out, k, true, depth + 1);
                out += ": ";
                repr_into(out, x, true, depth + 1);
            }
            out.push_back('}');
            if (v.is_namespace()) out.push_back('>');
            return;
        }
        case ValueKind::kCallable: out += "<function " + v.callable_name() + ">"; return;
    }
}

std::string to_str(const Value& v) {
    if (v.is_string()) return v.as_string();
    std::string out;
    repr_into(out, v, false, 0);
    return out;
}

std::string repr(const Value& v) {
    std::string out;
    repr_into(out, v, true, 0);
    return out;
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out.push_back('"');
    auto escape_cp = [&](unsigned cp) {
        char buf[16];
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp & 0xFFFFu);
        out += buf;
    };
    // The escapes both modes share: quote, backslash, the named controls and \uXXXX below 0x20.
    auto short_escape = [&](uint32_t c) {
        switch (c) {
            case '"': out += "\\\""; return true;
            case '\\': out += "\\\\"; return true;
            case '\n': out += "\\n"; return true;
            case '\r': out += "\\r"; return true;
            case '\t': out += "\\t"; return true;
            case '\b': out += "\\b"; return true;
            case '\f': out += "\\f"; return true;
            default:
                if (c >= 0x20) return false;
                escape_cp(c);
                return true;
        }
    };
    if (!ensure_ascii) {
        for (char ch : s)
            if (!short_escape(static_cast<unsigned char>(ch))) out.push_back(ch);
    } else {
        for (char32_t cp : utf8_decode(s)) {
            if (short_escape(cp)) continue;
            if (cp <= 0x7E) {
                out.push_back(static_cast<char>(cp));
            } else if (cp >= 0x10000) {
                const unsigned v = static_cast<unsigned>(cp) - 0x10000;
                escape_cp(0xD800 + (v >> 10));
                escape_cp(0xDC00 + (v & 0x3FF));
            } else {
                escape_cp(static_cast<unsigned>(cp));
            }
        }
    }
    out.push_back('"');
}

std::string json_key(const Value& k) {
    switch (k.kind()) {
        case ValueKind::kString: return k.as_string();
        case ValueKind::kBool: return k.as_bool() ? "true" : "false";
        case ValueKind::kInt: return std::to_string(k.as_int());
        case ValueKind::kFloat: return format_float(k.as_float());
        case ValueKind::kNone: return "null";
        default: eval_fail("tojson: keys must be str, int, float, bool or None, not %s", k.type_name());
    }
}

void json_into(std::string& out, const Value& v, const JsonOptions& o, int depth) {
    if (depth > kMaxNesting) eval_fail("tojson: value nested too deeply (or contains itself)");
    const std::string item_sep = o.custom_separators ? o.item_separator : (o.indent >= 0 ? "," : ", ");
    const std::string key_sep = o.custom_separators ? o.key_separator : ": ";
    auto newline = [&](int level) {
        if (o.indent < 0) return;
        out.push_back('\n');
        out.append(static_cast<size_t>(o.indent) * static_cast<size_t>(level), ' ');
    };
    switch (v.kind()) {
        case ValueKind::kUndefined: eval_fail("tojson: cannot serialize an undefined value");
        case ValueKind::kCallable: eval_fail("tojson: cannot serialize a callable");
        case ValueKind::kNone: out += "null"; return;
        case ValueKind::kBool: out += v.as_bool() ? "true" : "false"; return;
        case ValueKind::kInt: out += std::to_string(v.as_int()); return;
        case ValueKind::kFloat: {
            double d = v.as_float();
            if (std::isnan(d)) {
                out += "NaN";
            } else if (std::isinf(d)) {
                out += d < 0 ? "-Infinity" : "Infinity";
            } else {
                out += format_float(d);
            }
            return;
        }
        case ValueKind::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
        case ValueKind::kList: {
            const ValueList& l = v.as_list();
            if (l.empty()) {
                out += "[]";
                return;
            }
            out.push_back('[');
            for (size_t i = 0; i < l.size(); ++i) {
                if (i) out += item_sep;
                newline(depth + 1);
                json_into(out, l[i], o, depth + 1);
            }
            newline(depth);
            out.push_back(']');
            return;
        }
        case ValueKind::kDict: {
            if (v.is_namespace()) eval_fail("tojson: cannot serialize a namespace");
            std::vector<std::pair<std::string, const Value*>> items;
            for (const auto& [k, x] : v.as_dict().items) items.emplace_back(json_key(k), &x);
            if (o.sort_keys)
                std::stable_sort(items.begin(), items.end(),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
            if (items.empty()) {
                out += "{}";
                return;
            }
            out.push_back('{');
            for (size_t i = 0; i < items.size(); ++i) {
                if (i) out += item_sep;
                newline(depth + 1);
                json_string(out, items[i].first, o.ensure_ascii);
                out += key_sep;
                json_into(out, *items[i].second, o, depth + 1);
            }
            newline(depth);
            out.push_back('}');
            return;
        }
    }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
    std::string out;
    json_into(out, v, options, 0);
    return out;
}

}  // namespace cera::jinja
