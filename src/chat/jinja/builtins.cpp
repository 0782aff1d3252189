// Operators, attribute and item access, the methods of strings, lists and
// dicts, and the global functions (range, namespace, dict, raise_exception,
// strftime_now).
#include <algorithm>
#include <cmath>

#include "chat/jinja/builtins_util.h"
#include "chat/jinja/error.h"
#include "chat/jinja/format.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/text.h"
#include "core/check.h"
#include "tokenizer/unicode.h"

namespace cera::jinja {

Value arg(CallArgs& args, size_t index, const char* name, Value def) {
    if (index < args.positional.size()) return args.positional[index];
    for (auto& [k, v] : args.keyword)
        if (k == name) return v;
    return def;
}

void check_args(const char* fn, const CallArgs& args, size_t max_positional, std::initializer_list<const char*> names) {
    if (args.positional.size() > max_positional)
        eval_fail("%s takes at most %zu positional arguments, got %zu", fn, max_positional, args.positional.size());
    for (const auto& [k, v] : args.keyword) {
        bool ok = false;
        for (const char* n : names) ok = ok || k == n;
        if (!ok) eval_fail("%s got an unexpected keyword argument '%s'", fn, k.c_str());
    }
}

int64_t int_arg(const Value& v, const char* what) {
    if (!v.is_int() && !v.is_bool()) eval_fail("%s must be an integer, not %s", what, v.type_name());
    return v.as_int();
}

const std::string& str_arg(const Value& v, const char* what) {
    if (!v.is_string()) eval_fail("%s must be a string, not %s", what, v.type_name());
    return v.as_string();
}

ValueList iterate(const Value& v) {
    switch (v.kind()) {
        case ValueKind::kList: return v.as_list();
        case ValueKind::kUndefined: return {};
        case ValueKind::kDict: {
            if (v.is_namespace()) eval_fail("a namespace is not iterable");
            ValueList keys;
            for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
            return keys;
        }
        case ValueKind::kString: {
            ValueList chars;
            std::string one;
            for (char32_t cp : utf8_decode(v.as_string())) {
                one.clear();
                unicode::append_utf8(one, cp);
                chars.emplace_back(one);
            }
            return chars;
        }
        default: eval_fail("a value of type %s is not iterable", v.type_name());
    }
}

bool contains(const Value& haystack, const Value& needle) {
    switch (haystack.kind()) {
        case ValueKind::kUndefined: return false;
        case ValueKind::kString:
            if (!needle.is_string()) eval_fail("'in <string>' requires a string on the left, not %s", needle.type_name());
            return haystack.as_string().find(needle.as_string()) != std::string::npos;
        case ValueKind::kList:
            for (const Value& x : haystack.as_list())
                if (x.equals(needle)) return true;
            return false;
        case ValueKind::kDict: return haystack.as_dict().find(needle) != nullptr;
        default: eval_fail("'in' needs a string, list or dict on the right, not %s", haystack.type_name());
    }
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
            double x = a.as_float(), y = b.as_float();
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = a.as_int(), y = b.as_int();
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
        if (case_sensitive) {
            int c = a.as_string().compare(b.as_string());
            return c < 0 ? -1 : c > 0 ? 1 : 0;
        }
        int c = py_lower(a.as_string()).compare(py_lower(b.as_string()));
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_list() && b.is_list()) {
        const ValueList& x = a.as_list();
        const ValueList& y = b.as_list();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (x[i].equals(y[i])) continue;
            return compare_values(x[i], y[i], case_sensitive);
        }
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    eval_fail("cannot order a %s and a %s", a.type_name(), b.type_name());
}

namespace {

Value repeat_sequence(Interpreter& interp, const Value& seq, int64_t times) {
    if (times < 0) times = 0;
    if ((seq.is_string() && seq.as_string().empty()) || (seq.is_list() && seq.as_list().empty())) return seq;
    if (seq.is_string()) {
        const std::string& s = seq.as_string();
        interp.charge(s.size() * static_cast<size_t>(std::min<int64_t>(times, 1 << 30)));
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += s;
        return Value(std::move(out));
    }
    const ValueList& l = seq.as_list();
    interp.charge(l.size() * sizeof(Value) * static_cast<size_t>(std::min<int64_t>(times, 1 << 30)));
    ValueList out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), l.begin(), l.end());
    return Value::list(std::move(out));
}

int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

// printf-style `string % args`.
std::string percent_format(const std::string& fmt, const Value& args) {
    ValueList items = args.is_list() ? args.as_list() : ValueList{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        if (++i >= fmt.size()) eval_fail("incomplete format: '%%' at the end");
        char c = fmt[i];
        if (c == '%') {
            out.push_back('%');
            continue;
        }
        if (next >= items.size()) eval_fail("not enough arguments for format string");
        const Value& v = items[next++];
        switch (c) {
            case 's': out += to_str(v); break;
            case 'r': out += repr(v); break;
            case 'd':
            case 'i':
                if (!v.is_number()) eval_fail("%%%c format: a number is required, not %s", c, v.type_name());
                out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int());
                break;
            case 'f': {
                if (!v.is_number()) eval_fail("%%f format: a number is required, not %s", v.type_name());
                char buf[64];
                std::snprintf(buf, sizeof(buf), "%f", v.as_float());
                out += buf;
                break;
            }
            default: eval_fail("unsupported: format conversion '%%%c'", c);
        }
    }
    if (next < items.size() && args.is_list()) eval_fail("not all arguments converted during string formatting");
    return out;
}

}  // namespace

Value binary_op(Interpreter& interp, const std::string& op, const Value& a, const Value& b) {
    const char o = op[0];
    if (a.is_number() && b.is_number()) {
        const bool use_float = a.is_float() || b.is_float();
        if (op == "/") {
            if (b.as_float() == 0.0) eval_fail("division by zero");
            return Value(a.as_float() / b.as_float());
        }
        if (op == "**") {
            if (!use_float && b.as_int() >= 0) {
                int64_t base = a.as_int(), e = b.as_int(), r = 1;
                for (int64_t i = 0; i < e; ++i) {
                    if (__builtin_mul_overflow(r, base, &r)) eval_fail("integer overflow in '**'");
                    if (r == 0 || r == 1) break;
                }
                return Value(r);
            }
            return Value(std::pow(a.as_float(), b.as_float()));
        }
        if (use_float) {
            double x = a.as_float(), y = b.as_float();
            switch (o) {
                case '+': return Value(x + y);
                case '-': return Value(x - y);
                case '*': return Value(x * y);
                default: break;
            }
            if (y == 0.0) eval_fail("division by zero");
            if (op == "//") return Value(std::floor(x / y));
            double m = std::fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return Value(m);
        }
        int64_t x = a.as_int(), y = b.as_int(), r = 0;
        switch (o) {
            case '+':
                if (__builtin_add_overflow(x, y, &r)) eval_fail("integer overflow in '+'");
                return Value(r);
            case '-':
                if (__builtin_sub_overflow(x, y, &r)) eval_fail("integer overflow in '-'");
                return Value(r);
            case '*':
                if (__builtin_mul_overflow(x, y, &r)) eval_fail("integer overflow in '*'");
                return Value(r);
            default: break;
        }
        if (y == 0) eval_fail("division by zero");
        if (x == INT64_MIN && y == -1) eval_fail("integer overflow");
        if (op == "//") return Value(floor_div(x, y));
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
    }
    if (op == "+" && a.is_string() && b.is_string()) {
        interp.charge(a.as_string().size() + b.as_string().size());
        return Value(a.as_string() + b.as_string());
    }
    if (op == "+" && a.is_list() && b.is_list()) {
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        interp.charge(out.size() * sizeof(Value));
        return Value::list(std::move(out));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool()))
        return repeat_sequence(interp, a, b.as_int());
    if (op == "*" && (b.is_string() || b.is_list()) && (a.is_int() || a.is_bool()))
        return repeat_sequence(interp, b, a.as_int());
    if (op == "%" && a.is_string()) {
        std::string s = percent_format(a.as_string(), b);
        interp.charge(s.size());
        return Value(std::move(s));
    }
    if (a.is_undefined() || b.is_undefined())
        eval_fail("undefined value used with '%s' (a %s and a %s)", op.c_str(), a.type_name(), b.type_name());
    eval_fail("unsupported operand types for '%s': %s and %s", op.c_str(), a.type_name(), b.type_name());
}

Value get_item(const Value& obj, const Value& key) {
    switch (obj.kind()) {
        case ValueKind::kDict: {
            const Value* v = obj.as_dict().find(key);
            if (v) return *v;
            if (key.is_string() && !obj.is_namespace()) return get_attr(obj, key.as_string());
            return Value();
        }
        case ValueKind::kList: {
            if (!key.is_int() && !key.is_bool()) return Value();
            const ValueList& l = obj.as_list();
            int64_t i = key.as_int();
            int64_t n = static_cast<int64_t>(l.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return Value();
            return l[static_cast<size_t>(i)];
        }
        case ValueKind::kString: {
            if (!key.is_int() && !key.is_bool()) return Value();
            std::vector<char32_t> cps = utf8_decode(obj.as_string());
            int64_t i = key.as_int();
            int64_t n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return Value();
            std::string out;
            unicode::append_utf8(out, cps[static_cast<size_t>(i)]);
            return Value(std::move(out));
        }
        default: return Value();
    }
}

Value get_attr(const Value& obj, const std::string& name) {
    if (obj.is_namespace()) {
        const Value* v = obj.as_dict().find(Value(name));
        return v ? *v : Value();
    }
    if (obj.is_string() || obj.is_list() || obj.is_dict()) {
        Value m = bound_method(obj, name);
        if (!m.is_undefined()) return m;
        if (obj.is_dict()) {
            const Value* v = obj.as_dict().find(Value(name));
            return v ? *v : Value();
        }
    }
    return Value();
}

// ---------------------------------------------------------------- globals

namespace {

Value make_namespace(CallArgs& args) {
    Value ns = Value::namespace_object();
    for (const Value& p : args.positional) {
        if (!p.is_dict()) eval_fail("namespace() takes a dict or keyword arguments, not a %s", p.type_name());
        for (const auto& [k, v] : p.as_dict().items) ns.as_dict().set(k, v);
    }
    for (const auto& [k, v] : args.keyword) ns.as_dict().set(Value(k), v);
    return ns;
}

Value make_dict(CallArgs& args) {
    Value d = Value::dict();
    if (args.positional.size() > 1) eval_fail("dict() takes at most 1 positional argument");
    for (const Value& p : args.positional) {
        if (p.is_dict()) {
            for (const auto& [k, v] : p.as_dict().items) d.as_dict().set(k, v);
        } else if (p.is_list()) {
            for (const Value& pair : p.as_list()) {
                if (!pair.is_list() || pair.as_list().size() != 2) eval_fail("dict() needs pairs of key and value");
                d.as_dict().set(pair.as_list()[0], pair.as_list()[1]);
            }
        } else {
            eval_fail("dict() takes a dict or a list of pairs, not a %s", p.type_name());
        }
    }
    for (const auto& [k, v] : args.keyword) d.as_dict().set(Value(k), v);
    return d;
}

Value make_range(Interpreter& interp, CallArgs& args) {
    check_args("range()", args, 3, {});
    if (args.positional.empty()) eval_fail("range() needs at least one argument");
    int64_t start = 0, stop = 0, st = 1;
    if (args.positional.size() == 1) {
        stop = int_arg(args.positional[0], "range() stop");
    } else {
        start = int_arg(args.positional[0], "range() start");
        stop = int_arg(args.positional[1], "range() stop");
        if (args.positional.size() == 3) st = int_arg(args.positional[2], "range() step");
    }
    if (st == 0) eval_fail("range() step must not be zero");
    long double count = st > 0 ? (static_cast<long double>(stop) - start) / st : (static_cast<long double>(start) - stop) / -st;
    if (count > static_cast<long double>(interp.limits().max_range))
        throw_error(ErrorCode::kOutOfRange, "chat template: range() of more than %zu elements",
                    interp.limits().max_range);
    ValueList out;
    for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) out.emplace_back(i);
    interp.charge(out.size() * sizeof(Value));
    return Value::list(std::move(out));
}

}  // namespace

std::vector<std::pair<std::string, Value>> builtin_globals(Interpreter&) {
    std::vector<std::pair<std::string, Value>> g;
    g.emplace_back("range", Value::callable("range", [](Interpreter& in, CallArgs& a, int) { return make_range(in, a); }));
    g.emplace_back("namespace", Value::callable("namespace", [](Interpreter&, CallArgs& a, int) { return make_namespace(a); }));
    g.emplace_back("dict", Value::callable("dict", [](Interpreter&, CallArgs& a, int) { return make_dict(a); }));
    g.emplace_back("raise_exception", Value::callable("raise_exception", [](Interpreter&, CallArgs& a, int) -> Value {
        Value msg = arg(a, 0, "message", Value(""));
        throw Error(ErrorCode::kInvalidArgument, to_str(msg));
    }));
    g.emplace_back("strftime_now", Value::callable("strftime_now", [](Interpreter& in, CallArgs& a, int) -> Value {
        check_args("strftime_now()", a, 1, {"format"});
        const std::string& fmt = str_arg(arg(a, 0, "format", Value()), "strftime_now() format");
        if (fmt.size() > 256) eval_fail("strftime_now() format longer than 256 bytes");
        return Value(in.strftime_now()(fmt));
    }));
    return g;
}

}  // namespace cera::jinja
