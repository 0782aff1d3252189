// Python methods of strings, lists and dicts as templates call them:
// message.content.strip(), text.split('</think>'), d.items(), list.append(x).
#include <utf8proc.h>

#include <algorithm>
#include <utility>

#include "chat/jinja/builtins_util.h"
#include "chat/jinja/error.h"
#include "chat/jinja/format.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/text.h"

namespace cera::jinja {

namespace {

const char* const kStringMethods[] = {"strip",      "lstrip",     "rstrip",  "split",   "rsplit",  "splitlines",
                                      "startswith", "endswith",   "upper",   "lower",   "title",   "capitalize",
                                      "replace",    "format",     "join",    "find",    "rfind",   "count",
                                      "isdigit",    "isalpha",    "isalnum", "isspace", "isupper", "islower",
                                      "removeprefix", "removesuffix"};
const char* const kListMethods[] = {"append", "extend", "pop", "insert", "index", "count", "remove", "reverse", "copy"};
const char* const kDictMethods[] = {"items", "keys", "values", "get", "update", "pop", "copy", "setdefault"};

template <size_t N>
bool known(const char* const (&names)[N], const std::string& name) {
    for (const char* n : names)
        if (name == n) return true;
    return false;
}

const std::string* opt_str(const Value& v, const char* what) {
    if (v.is_none() || v.is_undefined()) return nullptr;
    return &str_arg(v, what);
}

// str.startswith / endswith: a string or a list (tuple) of strings.
bool affix_match(const std::string& s, const Value& affix, bool prefix) {
    auto one = [&](const Value& a) {
        const std::string& x = str_arg(a, prefix ? "startswith() argument" : "endswith() argument");
        if (x.size() > s.size()) return false;
        return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    if (affix.is_list()) {
        for (const Value& a : affix.as_list())
            if (one(a)) return true;
        return false;
    }
    return one(affix);
}

std::string str_format(const std::string& fmt, CallArgs& args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
            else eval_fail("format(): single '}' in format string");
            out.push_back('}');
            continue;
        }
        if (c != '{') {
            out.push_back(c);
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.push_back('{');
            ++i;
            continue;
        }
        size_t close = fmt.find('}', i);
        if (close == std::string::npos) eval_fail("format(): unclosed '{' in format string");
        std::string field = fmt.substr(i + 1, close - i - 1);
        if (field.find_first_of(":![.") != std::string::npos)
            eval_fail("unsupported: format() field '{%s}' (only {}, {0} and {name})", field.c_str());
        Value v;
        if (field.empty()) {
            if (auto_index >= args.positional.size()) eval_fail("format(): not enough arguments");
            v = args.positional[auto_index++];
        } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
            size_t k = std::stoul(field);
            if (k >= args.positional.size()) eval_fail("format(): no argument %zu", k);
            v = args.positional[k];
        } else {
            bool found = false;
            for (auto& [key, value] : args.keyword) {
                if (key == field) {
                    v = value;
                    found = true;
                }
            }
            if (!found) eval_fail("format(): no argument named '%s'", field.c_str());
        }
        out += to_str(v);
        i = close;
    }
    return out;
}

// Python's str predicates over code points (false for an empty string; utf8_decode reads a byte outside
// UTF-8 as the code point of its value).
template <class Pred>
bool all_code_points(const std::string& s, Pred pred) {
    const std::vector<char32_t> cps = utf8_decode(s);
    return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}
utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
// str.isalpha: letters (categories Lu, Ll, Lt, Lm, Lo).
bool py_alpha(char32_t c) {
    const auto k = category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
// str.isalnum's numeric part: decimal digits, letter numbers and other numbers (Nd, Nl, No).
bool py_numeric_category(char32_t c) {
    const auto k = category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
// str.isdigit: decimal digits and the digits of Unicode's Numeric_Type=Digit (superscripts, subscripts,
// circled and other compatibility digits), which utf8proc does not tabulate.
bool py_digit(char32_t c) {
    if (category(c) == UTF8PROC_CATEGORY_ND) return true;
    static constexpr std::pair<char32_t, char32_t> kDigitRanges[] = {
        {0xB2, 0xB3},     {0xB9, 0xB9},     {0x1369, 0x1371}, {0x19DA, 0x19DA}, {0x2070, 0x2070},   {0x2074, 0x2079},
        {0x2080, 0x2089}, {0x2460, 0x2468}, {0x2474, 0x247C}, {0x2488, 0x2490}, {0x24EA, 0x24EA},   {0x24F5, 0x24FD},
        {0x24FF, 0x24FF}, {0x2776, 0x277E}, {0x2780, 0x2788}, {0x278A, 0x2792}, {0x10A40, 0x10A43}, {0x1F100, 0x1F10A}};
    for (const auto& [lo, hi] : kDigitRanges)
        if (c >= lo && c <= hi) return true;
    return false;
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& a) {
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        check_args(name.c_str(), a, 1, {"chars"});
        const std::string* chars = opt_str(arg(a, 0, "chars"), "strip() chars");
        return Value(py_strip(s, name != "rstrip", name != "lstrip", chars));
    }
    if (name == "split" || name == "rsplit") {
        check_args(name.c_str(), a, 2, {"sep", "maxsplit"});
        const std::string* sep = opt_str(arg(a, 0, "sep"), "split() separator");
        int64_t maxsplit = int_arg(arg(a, 1, "maxsplit", Value(int64_t{-1})), "split() maxsplit");
        auto parts = name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit);
        in.charge(s.size() + parts.size() * sizeof(Value));
        ValueList out;
        for (auto& p : parts) out.emplace_back(std::move(p));
        return Value::list(std::move(out));
    }
    if (name == "splitlines") {
        check_args("splitlines()", a, 1, {"keepends"});
        auto lines = py_splitlines(s, arg(a, 0, "keepends", Value(false)).truthy());
        in.charge(s.size());
        ValueList out;
        for (auto& l : lines) out.emplace_back(std::move(l));
        return Value::list(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
        check_args(name.c_str(), a, 1, {});
        if (a.positional.empty()) eval_fail("%s() needs an argument", name.c_str());
        return Value(affix_match(s, a.positional[0], name == "startswith"));
    }
    if (name == "upper") return Value(py_upper(s));
    if (name == "lower") return Value(py_lower(s));
    if (name == "title") return Value(py_title(s));
    if (name == "capitalize") return Value(py_capitalize(s));
    if (name == "replace") {
        check_args("replace()", a, 3, {"count"});
        const std::string& from = str_arg(arg(a, 0, "old"), "replace() old");
        const std::string& to = str_arg(arg(a, 1, "new"), "replace() new");
        int64_t count = int_arg(arg(a, 2, "count", Value(int64_t{-1})), "replace() count");
        std::string r = py_replace(s, from, to, count);
        in.charge(r.size());
        return Value(std::move(r));
    }
    if (name == "format") {
        std::string r = str_format(s, a);
        in.charge(r.size());
        return Value(std::move(r));
    }
    if (name == "join") {
        check_args("join()", a, 1, {});
        std::string r;
        bool first = true;
        for (const Value& v : iterate(arg(a, 0, "iterable"))) {
            if (!first) r += s;
            first = false;
            r += str_arg(v, "join() item");
        }
        in.charge(r.size());
        return Value(std::move(r));
    }
    if (name == "find" || name == "rfind" || name == "count") {
        check_args(name.c_str(), a, 1, {});
        const std::string& sub = str_arg(arg(a, 0, "sub"), "find() argument");
        if (name == "count") {
            if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
            int64_t n = 0;
            for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
            return Value(n);
        }
        size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
        if (p == std::string::npos) return Value(int64_t{-1});
        return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
    }
    if (name == "removeprefix" || name == "removesuffix") {
        const std::string& x = str_arg(arg(a, 0, "affix"), "remove*() argument");
        if (x.size() <= s.size()) {
            if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
            if (name == "removesuffix" && s.compare(s.size() - x.size(), x.size(), x) == 0)
                return Value(s.substr(0, s.size() - x.size()));
        }
        return Value(s);
    }
    if (name == "isdigit") return Value(all_code_points(s, py_digit));
    if (name == "isalpha") return Value(all_code_points(s, py_alpha));
    if (name == "isalnum")
        return Value(all_code_points(s, [](char32_t c) { return py_alpha(c) || py_numeric_category(c); }));
    if (name == "isspace") return Value(all_code_points(s, is_py_space));
    if (name == "isupper") return Value(py_upper(s) == s && py_lower(s) != s);
    if (name == "islower") return Value(py_lower(s) == s && py_upper(s) != s);
    eval_fail("string has no method '%s'", name.c_str());
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
    ValueList& l = self.as_list();
    if (name == "append") {
        check_args("append()", a, 1, {});
        if (a.positional.size() != 1) eval_fail("append() takes exactly one argument");
        in.charge(sizeof(Value));
        l.push_back(a.positional[0]);
        return Value::none();
    }
    if (name == "extend") {
        ValueList more = iterate(arg(a, 0, "iterable"));
        in.charge(more.size() * sizeof(Value));
        l.insert(l.end(), more.begin(), more.end());
        return Value::none();
    }
    if (name == "pop") {
        if (l.empty()) eval_fail("pop from an empty list");
        int64_t n = static_cast<int64_t>(l.size());
        int64_t i = int_arg(arg(a, 0, "index", Value(n - 1)), "pop() index");
        if (i < 0) i += n;
        if (i < 0 || i >= n) eval_fail("pop index out of range");
        Value v = l[static_cast<size_t>(i)];
        l.erase(l.begin() + i);
        return v;
    }
    if (name == "insert") {
        int64_t n = static_cast<int64_t>(l.size());
        int64_t i = int_arg(arg(a, 0, "index"), "insert() index");
        if (i < 0) i = std::max<int64_t>(0, i + n);
        i = std::min(i, n);
        in.charge(sizeof(Value));
        l.insert(l.begin() + i, arg(a, 1, "object"));
        return Value::none();
    }
    if (name == "index" || name == "count" || name == "remove") {
        Value x = arg(a, 0, "value");
        int64_t count = 0;
        for (size_t i = 0; i < l.size(); ++i) {
            if (!l[i].equals(x)) continue;
            if (name == "index") return Value(static_cast<int64_t>(i));
            if (name == "remove") {
                l.erase(l.begin() + static_cast<int64_t>(i));
                return Value::none();
            }
            ++count;
        }
        if (name == "count") return Value(count);
        eval_fail("%s(): value not in list", name.c_str());
    }
    if (name == "reverse") {
        std::reverse(l.begin(), l.end());
        return Value::none();
    }
    if (name == "copy") return Value::list(l);
    eval_fail("list has no method '%s'", name.c_str());
}

Value dict_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
    Dict& d = self.as_dict();
    if (name == "items" || name == "keys" || name == "values") {
        check_args(name.c_str(), a, 0, {});
        ValueList out;
        for (const auto& [k, v] : d.items) {
            if (name == "items") out.push_back(Value::list({k, v}));
            else out.push_back(name == "keys" ? k : v);
        }
        in.charge(out.size() * sizeof(Value) * (name == "items" ? 3 : 1));
        return Value::list(std::move(out));
    }
    if (name == "get") {
        check_args("get()", a, 2, {"default"});
        const Value* v = d.find(arg(a, 0, "key"));
        return v ? *v : arg(a, 1, "default", Value::none());
    }
    if (name == "pop") {
        Value key = arg(a, 0, "key");
        const Value* v = d.find(key);
        if (!v) {
            if (a.positional.size() > 1) return a.positional[1];
            eval_fail("pop(): key %s not in dict", repr(key).c_str());
        }
        Value out = *v;
        d.erase(key);
        return out;
    }
    if (name == "setdefault") {
        Value key = arg(a, 0, "key");
        if (const Value* v = d.find(key)) return *v;
        Value def = arg(a, 1, "default", Value::none());
        d.set(key, def);
        return def;
    }
    if (name == "update") {
        for (const Value& p : a.positional) {
            if (!p.is_dict()) eval_fail("update() takes a dict, not a %s", p.type_name());
            for (const auto& [k, v] : p.as_dict().items) d.set(k, v);
        }
        for (const auto& [k, v] : a.keyword) d.set(Value(k), v);
        in.charge((a.positional.size() + a.keyword.size()) * sizeof(Value));
        return Value::none();
    }
    if (name == "copy") {
        Value c = Value::dict();
        c.as_dict().items = d.items;
        return c;
    }
    eval_fail("dict has no method '%s'", name.c_str());
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name) {
    if (obj.is_string() && known(kStringMethods, name)) {
        return Value::callable(name, [obj, name](Interpreter& in, CallArgs& a, int) {
            return string_method(in, obj.as_string(), name, a);
        });
    }
    if (obj.is_list() && known(kListMethods, name)) {
        return Value::callable(name, [obj, name](Interpreter& in, CallArgs& a, int) { return list_method(in, obj, name, a); });
    }
    if (obj.is_dict() && !obj.is_namespace() && known(kDictMethods, name)) {
        return Value::callable(name, [obj, name](Interpreter& in, CallArgs& a, int) { return dict_method(in, obj, name, a); });
    }
    return Value();
}

}  // namespace cera::jinja
