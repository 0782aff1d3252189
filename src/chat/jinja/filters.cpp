// Jinja filters (`x | name(args)`) and tests (`x is name(args)`), with the
// semantics of Jinja's builtins and of HF's `tojson` (json.dumps with
// ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "chat/jinja/builtins_util.h"
#include "chat/jinja/error.h"
#include "chat/jinja/format.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/text.h"
#include "tokenizer/unicode.h"

namespace cera::jinja {

namespace {

// Resolves "a.b.0"-style attribute paths, as Jinja's attribute= arguments do.
Value attribute_path(const Value& v, const std::string& path) {
    Value cur = v;
    size_t start = 0;
    while (start <= path.size()) {
        size_t dot = path.find('.', start);
        std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (cur.is_undefined()) return cur;
        if (numeric) {
            Value r = get_item(cur, Value(static_cast<int64_t>(std::stoll(part))));
            cur = r.is_undefined() ? get_item(cur, Value(part)) : r;
        } else {
            Value r = get_item(cur, Value(part));
            cur = r.is_undefined() ? get_attr(cur, part) : r;
        }
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return cur;
}

Value key_of(const Value& item, const Value& attribute) {
    if (attribute.is_undefined() || attribute.is_none()) return item;
    if (attribute.is_int()) return get_item(item, attribute);
    return attribute_path(item, str_arg(attribute, "attribute"));
}

CallArgs tail_args(CallArgs& a, size_t from) {
    CallArgs out;
    for (size_t i = from; i < a.positional.size(); ++i) out.positional.push_back(a.positional[i]);
    out.keyword = a.keyword;
    return out;
}

std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out.push_back(c);
        }
    }
    return out;
}

// Python int() of a string: optional sign, digits, underscores between digits, surrounding whitespace.
bool parse_int(const std::string& text, int64_t base, int64_t& out) {
    std::string s = py_strip(text, true, true, nullptr);
    if (s.empty()) return false;
    std::string clean;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
            std::isalnum(static_cast<unsigned char>(s[i + 1])))
            continue;
        clean.push_back(s[i]);
    }
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(clean.c_str(), &end, static_cast<int>(base));
    if (errno != 0 || end == clean.c_str() || *end != '\0') return false;
    out = v;
    return true;
}

// Python float() of a string: strtod's decimal forms, "inf" and "nan" (no hexadecimal, which strtod takes).
bool parse_float(const std::string& text, double& out) {
    std::string s = py_strip(text, true, true, nullptr);
    if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return false;
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return end != s.c_str() && *end == '\0';
}

// Python's round(x, ndigits) of a float: x's exact decimal value rounded at 10^-ndigits, ties to even,
// then the nearest double (glibc's printf writes a double's exact expansion).
double py_round(double x, int64_t ndigits) {
    if (!std::isfinite(x) || x == 0.0 || ndigits > 1100) return x;
    ndigits = std::max<int64_t>(ndigits, -400);
    char buf[1500];
    std::snprintf(buf, sizeof(buf), "%.1100f", std::fabs(x));
    std::string digits(buf);
    const size_t point = digits.find('.');
    digits.erase(point, 1);                         // all digits; the point stood before digits[point]
    const int64_t keep = int64_t(point) + ndigits;  // digits kept
    if (keep < 0) return std::copysign(0.0, x);
    if (keep >= int64_t(digits.size())) return x;
    const char next = digits[size_t(keep)];
    const bool rest_zero = digits.find_first_not_of('0', size_t(keep) + 1) == std::string::npos;
    const bool odd = keep > 0 && (digits[size_t(keep) - 1] - '0') % 2 == 1;
    const bool up = next > '5' || (next == '5' && (!rest_zero || odd));
    digits.resize(size_t(keep));
    if (up) {
        int64_t i = keep - 1;
        for (; i >= 0 && digits[size_t(i)] == '9'; --i) digits[size_t(i)] = '0';
        if (i >= 0)
            ++digits[size_t(i)];
        else
            digits.insert(digits.begin(), '1');  // 9.5 -> 10: one digit more
    }
    if (digits.empty()) digits = "0";
    // The kept digits count units of 10^-ndigits.
    const std::string num = digits + "e" + std::to_string(-ndigits);
    return std::copysign(std::strtod(num.c_str(), nullptr), x);
}

// round(i, ndigits) of an integer: itself, or for ndigits < 0 the nearest multiple of 10^-ndigits, ties to
// even.
int64_t py_round_int(int64_t v, int64_t ndigits) {
    if (ndigits >= 0) return v;
    if (ndigits < -18) return 0;
    int64_t m = 1;
    for (int64_t i = 0; i < -ndigits; ++i) m *= 10;
    const int64_t q = v / m, r = v % m;  // r has v's sign
    const int64_t twice = 2 * (r < 0 ? -r : r);
    int64_t rounded = q;
    if (twice > m || (twice == m && q % 2 != 0)) rounded += v < 0 ? -1 : 1;
    if (rounded > INT64_MAX / m || rounded < INT64_MIN / m) eval_fail("integer overflow in round");
    return rounded * m;
}

Value sorted_copy(Interpreter& in, ValueList items, bool reverse, bool case_sensitive, const Value& attribute) {
    in.charge(items.size() * sizeof(Value));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        int c = compare_values(key_of(x, attribute), key_of(y, attribute), case_sensitive);
        return reverse ? c > 0 : c < 0;
    });
    return Value::list(std::move(items));
}

}  // namespace

Value Interpreter::apply_filter(const std::string& name, const Value& v, CallArgs& a, int line) {
    step();
    const char* fn = name.c_str();
    if (name == "trim") {
        check_args("trim", a, 1, {"chars"});
        Value chars = arg(a, 0, "chars");
        std::string s = to_str(v);
        return Value(py_strip(s, true, true, chars.is_string() ? &chars.as_string() : nullptr));
    }
    if (name == "length" || name == "count") {
        if (v.is_string()) return Value(static_cast<int64_t>(utf8_length(v.as_string())));
        if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
        if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().items.size()));
        if (v.is_undefined()) return Value(int64_t{0});
        eval_fail("a %s has no length", v.type_name());
    }
    if (name == "tojson") {
        check_args("tojson", a, 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
        JsonOptions o;
        o.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
        Value indent = arg(a, 1, "indent", Value::none());
        if (!indent.is_none()) {
            if (indent.is_string()) eval_fail("unsupported: tojson indent given as a string");
            o.indent = static_cast<int>(std::clamp<int64_t>(int_arg(indent, "tojson indent"), 0, 64));
        }
        Value seps = arg(a, 2, "separators", Value::none());
        if (!seps.is_none()) {
            if (!seps.is_list() || seps.as_list().size() != 2) eval_fail("tojson separators must be a pair of strings");
            o.custom_separators = true;
            o.item_separator = str_arg(seps.as_list()[0], "tojson separator");
            o.key_separator = str_arg(seps.as_list()[1], "tojson separator");
        }
        o.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
        std::string s = to_json(v, o);
        charge(s.size());
        return Value(std::move(s));
    }
    if (name == "upper") return Value(py_upper(to_str(v)));
    if (name == "lower") return Value(py_lower(to_str(v)));
    if (name == "capitalize") return Value(py_capitalize(to_str(v)));
    if (name == "title") return Value(py_title(to_str(v)));
    if (name == "replace") {
        check_args("replace", a, 3, {"old", "new", "count"});
        Value count = arg(a, 2, "count", Value::none());
        std::string r = py_replace(to_str(v), str_arg(arg(a, 0, "old"), "replace old"),
                                   str_arg(arg(a, 1, "new"), "replace new"),
                                   count.is_none() ? -1 : int_arg(count, "replace count"));
        charge(r.size());
        return Value(std::move(r));
    }
    if (name == "join") {
        check_args("join", a, 2, {"d", "attribute"});
        std::string sep = to_str(arg(a, 0, "d", Value("")));
        Value attribute = arg(a, 1, "attribute");
        std::string r;
        bool first = true;
        for (const Value& x : iterate(v)) {
            if (!first) r += sep;
            first = false;
            r += to_str(key_of(x, attribute));
        }
        charge(r.size());
        return Value(std::move(r));
    }
    if (name == "default" || name == "d") {
        check_args(fn, a, 2, {"default_value", "boolean"});
        Value def = arg(a, 0, "default_value", Value(""));
        bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
        if (v.is_undefined() || (boolean && !v.truthy())) return def;
        return v;
    }
    if (name == "first" || name == "last") {
        ValueList items = iterate(v);
        if (items.empty()) return Value();
        return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
        ValueList items = iterate(v);
        charge(items.size() * sizeof(Value));
        return Value::list(std::move(items));
    }
    if (name == "string") return Value(to_str(v));
    if (name == "safe") return v;
    if (name == "escape" || name == "e" || name == "forceescape") return Value(html_escape(to_str(v)));
    if (name == "int") {
        check_args("int", a, 2, {"default", "base"});
        Value def = arg(a, 0, "default", Value(int64_t{0}));
        if (v.is_int() || v.is_bool()) return Value(v.as_int());
        if (v.is_float()) {
            double d = v.as_float();
            if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
            return Value(static_cast<int64_t>(d));
        }
        if (v.is_string()) {
            int64_t i = 0;
            if (parse_int(v.as_string(), int_arg(arg(a, 1, "base", Value(int64_t{10})), "int base"), i)) return Value(i);
            double d = 0;
            if (parse_float(v.as_string(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
                return Value(static_cast<int64_t>(d));
        }
        return def;
    }
    if (name == "float") {
        Value def = arg(a, 0, "default", Value(0.0));
        if (v.is_number()) return Value(v.as_float());
        double d = 0;
        if (v.is_string() && parse_float(v.as_string(), d)) return Value(d);
        return def;
    }
    if (name == "abs") {
        if (v.is_float()) return Value(std::fabs(v.as_float()));
        if (v.is_int() || v.is_bool()) {
            if (v.as_int() == INT64_MIN) eval_fail("integer overflow in abs");
            return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
        }
        eval_fail("abs of a %s", v.type_name());
    }
    if (name == "round") {
        check_args("round", a, 2, {"precision", "method"});
        int64_t precision = int_arg(arg(a, 0, "precision", Value(int64_t{0})), "round precision");
        std::string method = to_str(arg(a, 1, "method", Value("common")));
        if (!v.is_number()) eval_fail("round of a %s", v.type_name());
        if (method == "common")  // Python's round()
            return v.is_float() ? Value(py_round(v.as_float(), precision)) : Value(py_round_int(v.as_int(), precision));
        if (method != "ceil" && method != "floor") eval_fail("round method must be 'common', 'ceil' or 'floor'");
        // Jinja: math.ceil / math.floor of value * 10**precision, divided by it again (a float).
        const double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -30, 30)));
        const double x = v.as_float() * scale;
        return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (name == "items") {
        if (v.is_undefined()) return Value::list();
        if (!v.is_dict() || v.is_namespace()) eval_fail("items filter needs a dict, not a %s", v.type_name());
        ValueList out;
        for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::list({k, x}));
        charge(out.size() * sizeof(Value) * 3);
        return Value::list(std::move(out));
    }
    if (name == "dictsort") {
        check_args("dictsort", a, 3, {"case_sensitive", "by", "reverse"});
        if (!v.is_dict()) eval_fail("dictsort needs a dict, not a %s", v.type_name());
        bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
        std::string by = to_str(arg(a, 1, "by", Value("key")));
        bool rev = arg(a, 2, "reverse", Value(false)).truthy();
        ValueList pairs;
        for (const auto& [k, x] : v.as_dict().items) pairs.push_back(Value::list({k, x}));
        return sorted_copy(*this, std::move(pairs), rev, cs, Value(int64_t{by == "value" ? 1 : 0}));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
        const bool by_attr = name == "selectattr" || name == "rejectattr";
        const bool keep = name == "selectattr" || name == "select";
        size_t p = 0;
        Value attribute = by_attr ? arg(a, p++, "attribute") : Value();
        if (by_attr && !attribute.is_string()) eval_fail("%s needs an attribute name", fn);
        Value test = arg(a, p++, "test");
        CallArgs test_args = tail_args(a, p);
        ValueList out;
        for (const Value& item : iterate(v)) {
            Value x = by_attr ? attribute_path(item, attribute.as_string()) : item;
            bool r = test.is_undefined() ? x.truthy() : apply_test(str_arg(test, "test name"), x, test_args, line);
            if (r == keep) out.push_back(item);
        }
        charge(out.size() * sizeof(Value));
        return Value::list(std::move(out));
    }
    if (name == "map") {
        ValueList out;
        Value attribute;
        for (auto& [k, x] : a.keyword)
            if (k == "attribute") attribute = x;
        if (!attribute.is_undefined()) {
            Value def;
            for (auto& [k, x] : a.keyword)
                if (k == "default") def = x;
            for (const Value& item : iterate(v)) {
                Value r = key_of(item, attribute);
                out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
            }
        } else {
            if (a.positional.empty()) eval_fail("map needs a filter name or attribute=");
            std::string filter = str_arg(a.positional[0], "map filter name");
            CallArgs rest = tail_args(a, 1);
            for (const Value& item : iterate(v)) {
                CallArgs copy = rest;
                out.push_back(apply_filter(filter, item, copy, line));
            }
        }
        charge(out.size() * sizeof(Value));
        return Value::list(std::move(out));
    }
    if (name == "unique") {
        check_args("unique", a, 2, {"case_sensitive", "attribute"});
        bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
        Value attribute = arg(a, 1, "attribute");
        ValueList out, seen;
        for (const Value& item : iterate(v)) {
            Value k = key_of(item, attribute);
            if (!cs && k.is_string()) k = Value(py_lower(k.as_string()));
            bool dup = false;
            for (const Value& s : seen) dup = dup || s.equals(k);
            if (dup) continue;
            step();
            seen.push_back(k);
            out.push_back(item);
        }
        return Value::list(std::move(out));
    }
    if (name == "reverse") {
        if (v.is_string()) {
            auto cps = utf8_decode(v.as_string());
            std::string r;
            for (auto it = cps.rbegin(); it != cps.rend(); ++it) unicode::append_utf8(r, *it);
            return Value(std::move(r));
        }
        ValueList items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::list(std::move(items));
    }
    if (name == "sort") {
        check_args("sort", a, 3, {"reverse", "case_sensitive", "attribute"});
        return sorted_copy(*this, iterate(v), arg(a, 0, "reverse", Value(false)).truthy(),
                           arg(a, 1, "case_sensitive", Value(false)).truthy(), arg(a, 2, "attribute"));
    }
    if (name == "sum") {
        check_args("sum", a, 2, {"attribute", "start"});
        Value attribute = arg(a, 0, "attribute");
        Value total = arg(a, 1, "start", Value(int64_t{0}));
        for (const Value& item : iterate(v)) total = binary_op(*this, "+", total, key_of(item, attribute));
        return total;
    }
    if (name == "min" || name == "max") {
        check_args(fn, a, 2, {"case_sensitive", "attribute"});
        bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
        Value attribute = arg(a, 1, "attribute");
        ValueList items = iterate(v);
        if (items.empty()) return Value();
        Value best = items[0];
        for (size_t i = 1; i < items.size(); ++i) {
            int c = compare_values(key_of(items[i], attribute), key_of(best, attribute), cs);
            if (name == "min" ? c < 0 : c > 0) best = items[i];
        }
        return best;
    }
    if (name == "indent") {
        check_args("indent", a, 3, {"width", "first", "blank"});
        Value w = arg(a, 0, "width", Value(int64_t{4}));
        std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(w, "indent width"), 0, 256)), ' ');
        bool first = arg(a, 1, "first", Value(false)).truthy();
        bool blank = arg(a, 2, "blank", Value(false)).truthy();
        // Jinja's indent: the text's lines (Python's splitlines of text + "\n") joined by "\n", every line
        // after the first indented unless blank (all of them with blank=true), the first with first=true.
        const std::vector<std::string> lines = py_splitlines(to_str(v) + "\n", false);
        std::string out = first ? pad : "";
        for (size_t i = 0; i < lines.size(); ++i) {
            if (i > 0) out += (blank || !lines[i].empty()) ? "\n" + pad : "\n";
            out += lines[i];
        }
        charge(out.size());
        return Value(std::move(out));
    }
    if (name == "truncate") {
        // Jinja's: unchanged within length + leeway characters, else cut to length - len(end) (at the
        // last space unless killwords) with end appended.
        check_args("truncate", a, 4, {"length", "killwords", "end", "leeway"});
        const int64_t length = int_arg(arg(a, 0, "length", Value(int64_t{255})), "truncate length");
        const bool killwords = arg(a, 1, "killwords", Value(false)).truthy();
        const std::string end = to_str(arg(a, 2, "end", Value(std::string("..."))));
        const int64_t leeway = int_arg(arg(a, 3, "leeway", Value(int64_t{5})), "truncate leeway");
        const int64_t end_len = int64_t(utf8_length(end));
        if (length < end_len) eval_fail("truncate: expected length >= %lld", (long long)end_len);
        if (leeway < 0) eval_fail("truncate: expected leeway >= 0");
        const std::string s = to_str(v);
        if (int64_t(utf8_length(s)) <= length + leeway) return Value(s);
        std::vector<int64_t> head(static_cast<size_t>(length - end_len));
        for (size_t i = 0; i < head.size(); ++i) head[i] = int64_t(i);
        std::string out = utf8_slice(s, head);
        if (!killwords) {
            const std::string space = " ";
            out = py_rsplit(out, &space, 1)[0];
        }
        return Value(out + end);
    }
    if (name == "slice") {
        // Jinja's: the items in `slices` lists of consecutive items, the first len % slices one longer;
        // with fill_with, the shorter ones padded with it.
        check_args("slice", a, 2, {"slices", "fill_with"});
        const int64_t slices = int_arg(arg(a, 0, "slices"), "slice count");
        if (slices <= 0 || slices > (1 << 20)) eval_fail("slice count must be between 1 and %d", 1 << 20);
        const Value fill = arg(a, 1, "fill_with", Value::none());
        const ValueList items = iterate(v);
        const int64_t n = int64_t(items.size()), per = n / slices, extra = n % slices;
        ValueList out;
        for (int64_t i = 0, start = 0; i < slices; ++i) {
            const int64_t len = per + (i < extra ? 1 : 0);
            ValueList part(items.begin() + start, items.begin() + start + len);
            start += len;
            if (!fill.is_none() && i >= extra) part.push_back(fill);
            out.push_back(Value::list(std::move(part)));
        }
        return Value::list(std::move(out));
    }
    if (name == "wordcount") return Value(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
    if (name == "center") {
        int64_t width = int_arg(arg(a, 0, "width", Value(int64_t{80})), "center width");
        std::string s = to_str(v);
        int64_t len = static_cast<int64_t>(utf8_length(s));
        if (width <= len || width > (1 << 20)) return Value(s);
        int64_t total = width - len, left = total / 2 + (total & width & 1);
        return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
    }
    if (name == "batch") {
        int64_t size = int_arg(arg(a, 0, "linecount"), "batch size");
        if (size <= 0) eval_fail("batch size must be positive");
        Value fill = arg(a, 1, "fill_with", Value::none());
        ValueList out, cur;
        for (const Value& item : iterate(v)) {
            cur.push_back(item);
            if (static_cast<int64_t>(cur.size()) == size) {
                out.push_back(Value::list(std::move(cur)));
                cur.clear();
            }
        }
        if (!cur.empty()) {
            if (!fill.is_none())
                while (static_cast<int64_t>(cur.size()) < size) cur.push_back(fill);
            out.push_back(Value::list(std::move(cur)));
        }
        return Value::list(std::move(out));
    }
    if (name == "format") {
        Value fmt_args = Value::list(a.positional);
        return binary_op(*this, "%", Value(to_str(v)), fmt_args);
    }
    if (name == "attr") {  // attributes only: a dict's keys are not attributes
        const std::string& attr = str_arg(arg(a, 0, "name"), "attr name");
        return v.is_namespace() ? get_attr(v, attr) : bound_method(v, attr);
    }
    if (name == "pprint") return Value(repr(v));
    eval_fail("unknown filter '%s'", fn);
}

bool Interpreter::apply_test(const std::string& name, const Value& v, CallArgs& a, int line) {
    step();
    (void)line;
    auto other = [&]() -> Value {
        if (a.positional.empty() && a.keyword.empty()) eval_fail("test '%s' needs an argument", name.c_str());
        return a.positional.empty() ? a.keyword[0].second : a.positional[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "mapping") return v.is_dict() && !v.is_namespace();
    if (name == "iterable") return v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
    if (name == "sequence") return v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
    if (name == "callable") return v.is_callable();
    if (name == "escaped") return false;
    if (name == "lower") return v.is_string() && py_lower(v.as_string()) == v.as_string();
    if (name == "upper") return v.is_string() && py_upper(v.as_string()) == v.as_string();
    if (name == "odd" || name == "even") {
        int64_t i = int_arg(v, "odd/even test value");
        return ((i % 2) != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
        int64_t d = int_arg(other(), "divisibleby argument");
        if (d == 0) eval_fail("divisibleby 0");
        return int_arg(v, "divisibleby value") % d == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return v.equals(other());
    if (name == "ne" || name == "!=") return !v.equals(other());
    if (name == "lt" || name == "<" || name == "lessthan") return compare_values(v, other()) < 0;
    if (name == "le" || name == "<=") return compare_values(v, other()) <= 0;
    if (name == "gt" || name == ">" || name == "greaterthan") return compare_values(v, other()) > 0;
    if (name == "ge" || name == ">=") return compare_values(v, other()) >= 0;
    if (name == "in") return contains(other(), v);
    if (name == "sameas") return v.same_object(other());
    eval_fail("unknown test '%s'", name.c_str());
}

}  // namespace cera::jinja
