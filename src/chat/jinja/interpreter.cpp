#include "chat/jinja/interpreter.h"

#include <algorithm>

#include "chat/jinja/error.h"
#include "chat/jinja/format.h"
#include "chat/jinja/text.h"
#include "core/check.h"

namespace cera::jinja {

Value* Interpreter::Frame::find(const std::string& name) {
    for (auto& [k, v] : vars)
        if (k == name) return &v;
    return nullptr;
}

void Interpreter::Frame::set(const std::string& name, Value v) {
    if (Value* p = find(name)) {
        *p = std::move(v);
    } else {
        vars.emplace_back(name, std::move(v));
    }
}

std::shared_ptr<Interpreter::Frame> Interpreter::new_frame() {
    auto frame = std::make_shared<Frame>();
    CycleBreaker::track(frame, [](void* p) { decltype(Frame::vars)().swap(static_cast<Frame*>(p)->vars); });
    return frame;
}

Interpreter::Interpreter(const RenderLimits& limits, StrftimeFn strftime_now)
    : limits_(limits), strftime_now_(std::move(strftime_now)) {}

std::string Interpreter::render(const Body& body, const std::vector<std::pair<std::string, Value>>& globals) {
    scope_.clear();
    auto builtins = new_frame();
    for (auto& [k, v] : builtin_globals(*this)) builtins->set(k, v);
    auto root = new_frame();
    for (const auto& [k, v] : globals) root->set(k, v);
    scope_.push_back(builtins);
    scope_.push_back(root);
    std::string out;
    exec_body(body, out);
    return out;
}

void Interpreter::step() {
    if (++steps_ > limits_.max_steps)
        throw_error(ErrorCode::kOutOfRange, "chat template: evaluation exceeded %llu steps (runaway loop?)",
                    static_cast<unsigned long long>(limits_.max_steps));
}

void Interpreter::charge(size_t bytes) {
    allocated_ += bytes;
    if (allocated_ > limits_.max_alloc_bytes)
        throw_error(ErrorCode::kOutOfRange, "chat template: built more than %zu bytes of data", limits_.max_alloc_bytes);
}

void Interpreter::append(std::string& out, const std::string& text) {
    if (out.size() + text.size() > limits_.max_output_bytes)
        throw_error(ErrorCode::kOutOfRange, "chat template: output larger than %zu bytes", limits_.max_output_bytes);
    out += text;
}

Value Interpreter::lookup(const std::string& name) {
    for (auto it = scope_.rbegin(); it != scope_.rend(); ++it)
        if (Value* v = (*it)->find(name)) return *v;
    return Value::undefined();
}

void Interpreter::assign(const std::string& name, Value v) { scope_.back()->set(name, std::move(v)); }

void Interpreter::assign_targets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
        assign(targets[0], v);
        return;
    }
    if (!v.is_list() && !v.is_string()) eval_fail("cannot unpack a %s into %zu names", v.type_name(), targets.size());
    ValueList items = iterate(v);
    if (items.size() != targets.size())
        eval_fail("cannot unpack %zu values into %zu names", items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
}

// ---------------------------------------------------------------- statements

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
        Flow f = exec(*s, out);
        if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
    step();
    try {
        switch (s.kind) {
            case StmtKind::kText: append(out, s.text); return Flow::kNormal;
            case StmtKind::kOutput: append(out, to_str(eval(*s.expr))); return Flow::kNormal;
            case StmtKind::kIf:
                for (const auto& [cond, body] : s.branches)
                    if (eval(*cond).truthy()) return exec_body(body, out);
                return exec_body(s.else_body, out);
            case StmtKind::kFor: return exec_for(s, out);
            case StmtKind::kSet:
            case StmtKind::kSetBlock: exec_set(s, out); return Flow::kNormal;
            case StmtKind::kMacro: assign(s.name, make_macro(s)); return Flow::kNormal;
            case StmtKind::kCallBlock: exec_call_block(s, out); return Flow::kNormal;
            case StmtKind::kFilterBlock: {
                std::string inner;
                exec_body(s.body, inner);
                append(out, to_str(eval_filter_chain(*s.expr, Value(std::move(inner)))));
                return Flow::kNormal;
            }
            case StmtKind::kBreak: return Flow::kBreak;
            case StmtKind::kContinue: return Flow::kContinue;
            case StmtKind::kDo: eval(*s.expr); return Flow::kNormal;
            case StmtKind::kWith: {
                auto frame = new_frame();
                for (size_t i = 0; i < s.targets.size(); ++i) frame->set(s.targets[i], eval(*s.values[i]));
                scope_.push_back(frame);
                Flow f;
                try {
                    f = exec_body(s.body, out);
                } catch (...) {
                    scope_.pop_back();
                    throw;
                }
                scope_.pop_back();
                return f;
            }
            case StmtKind::kScope: return exec_body(s.body, out);
        }
    } catch (const EvalError& e) {
        throw_error(ErrorCode::kParse, "chat template: line %d: %s", s.line, e.what());
    }
    return Flow::kNormal;
}

namespace {

// Restores the scope stack when a loop body or macro call ends, also by exception.
template <typename Scope>
struct ScopeRestore {
    Scope& scope;
    Scope saved;
    ScopeRestore(Scope& s, Scope replacement) : scope(s), saved(std::move(s)) { scope = std::move(replacement); }
    ~ScopeRestore() { scope = std::move(saved); }
};

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
    Value seq = eval(*s.expr);
    if (seq.is_none() || seq.is_number() || seq.is_callable()) eval_fail("'%s' object is not iterable", seq.type_name());
    if (seq.is_namespace()) eval_fail("a namespace is not iterable");
    ValueList items = iterate(seq);
    auto frame = new_frame();
    Scope inner = scope_;
    inner.push_back(frame);
    ScopeRestore<Scope> restore(scope_, inner);
    if (s.cond) {
        ValueList kept;
        for (const Value& item : items) {
            step();
            frame->vars.clear();
            assign_targets(s.targets, item);
            if (eval(*s.cond).truthy()) kept.push_back(item);
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        frame->vars.clear();
        return exec_body(s.else_body, out);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // The loop variable's keys and its cycle() are made once per loop; cycle reads the current index.
    static const char* const kKeys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                        "length", "depth", "depth0", "previtem", "nextitem", "cycle"};
    Value keys[12];
    for (int k = 0; k < 12; ++k) keys[k] = Value(kKeys[k]);
    auto current = std::make_shared<int64_t>(0);
    Value cycle = Value::callable("loop.cycle", [current](Interpreter&, CallArgs& args, int) -> Value {
        if (args.positional.empty()) eval_fail("loop.cycle() needs at least one value");
        return args.positional[static_cast<size_t>(*current) % args.positional.size()];
    });
    for (int64_t i = 0; i < n; ++i) {
        step();
        frame->vars.clear();
        *current = i;
        Value loop = Value::dict();
        auto& d = loop.as_dict().items;
        d.reserve(12);
        const Value vals[12] = {Value(i + 1), Value(i), Value(n - i), Value(n - i - 1), Value(i == 0), Value(i == n - 1),
                                Value(n), Value(int64_t{1}), Value(int64_t{0}),
                                i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined(),
                                i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined(), cycle};
        for (int k = 0; k < 12; ++k) d.emplace_back(keys[k], vals[k]);
        frame->set("loop", loop);
        assign_targets(s.targets, items[static_cast<size_t>(i)]);
        Flow f = exec_body(s.body, out);
        if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, std::string& out) {
    Value v;
    if (s.kind == StmtKind::kSetBlock) {
        std::string inner;
        exec_body(s.body, inner);
        v = Value(std::move(inner));
        if (s.expr) v = eval_filter_chain(*s.expr, v);
    } else {
        v = eval(*s.expr);
    }
    if (s.attr_target) {
        Value ns = eval(*s.attr_target);
        if (!ns.is_namespace())
            eval_fail("cannot set attribute '%s' on a %s (only namespace() objects allow it)", s.name.c_str(),
                      ns.type_name());
        ns.as_dict().set(Value(s.name), std::move(v));
        return;
    }
    assign_targets(s.targets, v);
}

Value Interpreter::make_macro(const Stmt& s) {
    const Stmt* def = &s;
    Scope closure = scope_;
    return Value::callable(s.name, [def, closure](Interpreter& in, CallArgs& args, int line) -> Value {
        if (in.call_depth_ >= in.limits_.max_call_depth)
            throw_error(ErrorCode::kOutOfRange, "chat template: line %d: macro calls nested deeper than %d", line,
                        in.limits_.max_call_depth);
        if (args.positional.size() > def->params.size())
            eval_fail("macro '%s' takes %zu arguments, got %zu", def->name.c_str(), def->params.size(),
                      args.positional.size());
        auto frame = new_frame();
        Scope inner = closure;
        inner.push_back(frame);
        ScopeRestore<Scope> restore(in.scope_, inner);
        ++in.call_depth_;
        struct DepthDown {
            int& d;
            ~DepthDown() { --d; }
        } down{in.call_depth_};
        std::vector<bool> given(def->params.size(), false);
        for (size_t i = 0; i < args.positional.size(); ++i) {
            frame->set(def->params[i].first, args.positional[i]);
            given[i] = true;
        }
        for (auto& [key, value] : args.keyword) {
            if (key == "caller") {
                frame->set("caller", value);
                continue;
            }
            size_t k = 0;
            while (k < def->params.size() && def->params[k].first != key) ++k;
            if (k == def->params.size()) eval_fail("macro '%s' has no parameter '%s'", def->name.c_str(), key.c_str());
            frame->set(key, value);
            given[k] = true;
        }
        for (size_t k = 0; k < def->params.size(); ++k) {
            if (given[k]) continue;
            frame->set(def->params[k].first, def->params[k].second ? in.eval(*def->params[k].second) : Value());
        }
        std::string out;
        in.exec_body(def->body, out);
        return Value(std::move(out));
    });
}

void Interpreter::exec_call_block(const Stmt& s, std::string& out) {
    const Expr& call = *s.expr;
    Value callee = eval(*call.a);
    CallArgs args;
    eval_args(call, args);
    const Stmt* def = &s;
    Scope closure = scope_;
    args.keyword.emplace_back("caller", Value::callable("caller", [def, closure](Interpreter& in, CallArgs& a, int) {
        auto frame = new_frame();
        for (size_t k = 0; k < def->params.size(); ++k) {
            Value v = k < a.positional.size() ? a.positional[k] : Value();
            for (auto& [key, value] : a.keyword)
                if (key == def->params[k].first) v = value;
            if (v.is_undefined() && def->params[k].second) v = in.eval(*def->params[k].second);
            frame->set(def->params[k].first, v);
        }
        Scope inner = closure;
        inner.push_back(frame);
        ScopeRestore<Scope> restore(in.scope_, inner);
        std::string text;
        in.exec_body(def->body, text);
        return Value(std::move(text));
    }));
    append(out, to_str(this->call(callee, args, s.line)));
}

// ---------------------------------------------------------------- expressions

void Interpreter::eval_args(const Expr& e, CallArgs& args) {
    for (const auto& item : e.items) args.positional.push_back(eval(*item));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v));
}

Value Interpreter::call(const Value& callee, CallArgs& args, int line) {
    if (!callee.is_callable()) eval_fail("a %s is not callable", callee.type_name());
    step();
    return callee.function()(*this, args, line);
}

Value Interpreter::eval_filter_chain(const Expr& e, const Value& input) {
    // In {% filter %} / {% set x | f %} the innermost operand is missing and stands for the block's text.
    Value in = !e.a ? input : e.a->kind == ExprKind::kFilter ? eval_filter_chain(*e.a, input) : eval(*e.a);
    CallArgs args;
    eval_args(e, args);
    return apply_filter(e.name, in, args, e.line);
}

Value Interpreter::eval_compare(const Expr& e) {
    Value left = eval(*e.a);
    for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.items[i]);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") r = left.equals(right);
        else if (op == "!=") r = !left.equals(right);
        else if (op == "in") r = contains(right, left);
        else if (op == "notin") r = !contains(right, left);
        else {
            int c = compare_values(left, right);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value(false);
        left = std::move(right);
    }
    return Value(true);
}

namespace {

// Python slice indices for a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
    auto as_index = [](const Value& v, const char* what) -> int64_t {
        if (!v.is_int() && !v.is_bool()) eval_fail("slice %s must be an integer or none, not %s", what, v.type_name());
        return v.as_int();
    };
    int64_t st = step.is_none() || step.is_undefined() ? 1 : as_index(step, "step");
    if (st == 0) eval_fail("slice step cannot be zero");
    int64_t lo, hi;
    if (st > 0) {
        lo = start.is_none() || start.is_undefined() ? 0 : as_index(start, "start");
        hi = stop.is_none() || stop.is_undefined() ? n : as_index(stop, "stop");
        if (lo < 0) lo = std::max<int64_t>(0, lo + n);
        if (hi < 0) hi = std::max<int64_t>(0, hi + n);
        lo = std::min(lo, n);
        hi = std::min(hi, n);
    } else {
        lo = start.is_none() || start.is_undefined() ? n - 1 : as_index(start, "start");
        hi = stop.is_none() || stop.is_undefined() ? -1 : as_index(stop, "stop");
        if (!(start.is_none() || start.is_undefined())) {
            if (lo < 0) lo += n;
            lo = std::min(lo, n - 1);
            if (lo < -1) lo = -1;
        }
        if (!(stop.is_none() || stop.is_undefined())) {
            if (hi < 0) hi = std::max<int64_t>(-1, hi + n);
            hi = std::min(hi, n - 1);
        }
    }
    std::vector<int64_t> out;
    if (st > 0) {
        for (int64_t i = lo; i < hi; i += st) out.push_back(i);
    } else {
        for (int64_t i = lo; i > hi; i += st) out.push_back(i);
    }
    return out;
}

}  // namespace

Value Interpreter::eval_slice(const Expr& e) {
    Value obj = eval(*e.a);
    Value start = e.b ? eval(*e.b) : Value::none();
    Value stop = e.c ? eval(*e.c) : Value::none();
    Value st = e.d ? eval(*e.d) : Value::none();
    if (obj.is_list()) {
        const ValueList& l = obj.as_list();
        std::vector<int64_t> idx = slice_indices(static_cast<int64_t>(l.size()), start, stop, st);
        charge(idx.size() * sizeof(Value));
        ValueList out;
        out.reserve(idx.size());
        for (int64_t i : idx) out.push_back(l[static_cast<size_t>(i)]);
        return Value::list(std::move(out));
    }
    if (obj.is_string()) {
        const std::string& s = obj.as_string();
        std::vector<int64_t> idx = slice_indices(static_cast<int64_t>(utf8_length(s)), start, stop, st);
        charge(s.size());
        return Value(utf8_slice(s, idx));
    }
    if (obj.is_undefined()) eval_fail("cannot slice an undefined value");
    eval_fail("cannot slice a %s", obj.type_name());
}

Value Interpreter::eval(const Expr& e) {
    step();
    switch (e.kind) {
        case ExprKind::kLiteral: return e.literal;
        case ExprKind::kName: return lookup(e.name);
        case ExprKind::kList:
        case ExprKind::kTuple: {
            ValueList items;
            items.reserve(e.items.size());
            for (const auto& item : e.items) items.push_back(eval(*item));
            charge(items.size() * sizeof(Value));
            return Value::list(std::move(items));
        }
        case ExprKind::kDict: {
            Value d = Value::dict();
            for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
                Value k = eval(*e.items[i]);
                if (k.is_list() || k.is_dict() || k.is_undefined() || k.is_callable())
                    eval_fail("a %s cannot be a dict key", k.type_name());
                d.as_dict().set(k, eval(*e.items[i + 1]));
            }
            charge(e.items.size() * sizeof(Value));
            return d;
        }
        case ExprKind::kAttr: {
            Value obj = eval(*e.a);
            if (obj.is_undefined()) {
                if (e.a->kind == ExprKind::kName)
                    eval_fail("'%s' is undefined (reading its attribute '%s')", e.a->name.c_str(), e.name.c_str());
                eval_fail("cannot read attribute '%s' of an undefined value", e.name.c_str());
            }
            return get_attr(obj, e.name);
        }
        case ExprKind::kItem: {
            Value obj = eval(*e.a);
            Value key = eval(*e.b);
            if (obj.is_undefined()) {
                if (e.a->kind == ExprKind::kName) eval_fail("'%s' is undefined (subscripting it)", e.a->name.c_str());
                eval_fail("cannot subscript an undefined value with %s", repr(key).c_str());
            }
            return get_item(obj, key);
        }
        case ExprKind::kSlice: return eval_slice(e);
        case ExprKind::kCall: {
            Value callee = eval(*e.a);
            if (!callee.is_callable()) {
                if (e.a->kind == ExprKind::kName && callee.is_undefined())
                    eval_fail("'%s' is undefined (not a known function or macro)", e.a->name.c_str());
                if (e.a->kind == ExprKind::kAttr)
                    eval_fail("'%s' is not a callable method of a %s", e.a->name.c_str(),
                              eval(*e.a->a).type_name());
                eval_fail("a %s is not callable", callee.type_name());
            }
            CallArgs args;
            eval_args(e, args);
            return call(callee, args, e.line);
        }
        case ExprKind::kFilter: return eval_filter_chain(e, Value());
        case ExprKind::kTest: {
            Value v = eval(*e.a);
            CallArgs args;
            eval_args(e, args);
            bool r = apply_test(e.name, v, args, e.line);
            return Value(e.negated ? !r : r);
        }
        case ExprKind::kNeg:
        case ExprKind::kPos: {
            Value v = eval(*e.a);
            if (v.is_float()) return Value(e.kind == ExprKind::kNeg ? -v.as_float() : v.as_float());
            if (v.is_int() || v.is_bool()) {
                int64_t i = v.as_int();
                if (e.kind == ExprKind::kPos) return Value(i);
                if (i == INT64_MIN) eval_fail("integer overflow");
                return Value(-i);
            }
            eval_fail("bad operand type for unary %s: %s", e.kind == ExprKind::kNeg ? "-" : "+", v.type_name());
        }
        case ExprKind::kNot: return Value(!eval(*e.a).truthy());
        case ExprKind::kBinary: {
            Value a = eval(*e.a);
            Value b = eval(*e.b);
            return binary_op(*this, e.name, a, b);
        }
        case ExprKind::kConcat: {
            std::string s;
            for (const auto& item : e.items) s += to_str(eval(*item));
            charge(s.size());
            return Value(std::move(s));
        }
        case ExprKind::kCompare: return eval_compare(e);
        case ExprKind::kAnd: {
            Value a = eval(*e.a);
            return a.truthy() ? eval(*e.b) : a;
        }
        case ExprKind::kOr: {
            Value a = eval(*e.a);
            return a.truthy() ? a : eval(*e.b);
        }
        case ExprKind::kCond: {
            if (eval(*e.b).truthy()) return eval(*e.a);
            return e.c ? eval(*e.c) : Value();
        }
    }
    return Value();
}

}  // namespace cera::jinja
