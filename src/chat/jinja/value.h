// Values of the Jinja subset used by chat templates: Python-like none, bool, int,
// float, string, list, dict (insertion ordered), namespace and callables, plus
// Jinja's "undefined". Lists, dicts and namespaces are shared by reference, as in
// Python, so `ns.x = ...` and `list.append(...)` are seen through every alias.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cera::jinja {

class Value;
class Interpreter;

enum class ValueKind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

using ValueList = std::vector<Value>;

// Arguments of a call: positional values, then keyword values in call order.
struct CallArgs {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
};

// A callable value (macro, bound method, global function). `line` is the call site.
using NativeFunction = std::function<Value(Interpreter& interp, CallArgs& args, int line)>;

struct Dict;

class Value {
   public:
    Value() = default;  // undefined
    static Value none();
    static Value undefined() { return Value(); }
    Value(bool b);
    Value(int64_t i);
    Value(int i) : Value(static_cast<int64_t>(i)) {}
    Value(double d);
    Value(std::string s);
    Value(const char* s) : Value(std::string(s)) {}
    static Value list(ValueList items = {});
    static Value dict();
    static Value namespace_object();
    static Value callable(std::string name, NativeFunction fn);

    ValueKind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
    bool is_none() const { return kind_ == ValueKind::kNone; }
    bool is_bool() const { return kind_ == ValueKind::kBool; }
    bool is_int() const { return kind_ == ValueKind::kInt; }
    bool is_float() const { return kind_ == ValueKind::kFloat; }
    bool is_number() const { return kind_ == ValueKind::kInt || kind_ == ValueKind::kFloat || kind_ == ValueKind::kBool; }
    bool is_string() const { return kind_ == ValueKind::kString; }
    bool is_list() const { return kind_ == ValueKind::kList; }
    bool is_dict() const { return kind_ == ValueKind::kDict; }
    bool is_callable() const { return kind_ == ValueKind::kCallable; }
    bool is_namespace() const;

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == ValueKind::kBool ? (b_ ? 1 : 0) : i_; }  // bool counts as int
    double as_float() const;  // int, bool or float as a double
    const std::string& as_string() const { return *s_; }
    ValueList& as_list() const { return *list_; }
    Dict& as_dict() const { return *dict_; }
    const std::string& callable_name() const { return *s_; }
    const NativeFunction& function() const { return *fn_; }

    // Python truthiness (undefined is false).
    bool truthy() const;
    // Python equality: 1 == 1.0 == True, lists and dicts element-wise.
    bool equals(const Value& other) const;
    // Identity of shared containers (for `is sameas`).
    bool same_object(const Value& other) const;
    // Type name for error messages: "string", "int", "list", ...
    const char* type_name() const;

   private:
    ValueKind kind_ = ValueKind::kUndefined;
    bool b_ = false;
    int64_t i_ = 0;
    double f_ = 0;
    std::shared_ptr<std::string> s_;
    std::shared_ptr<ValueList> list_;
    std::shared_ptr<Dict> dict_;
    std::shared_ptr<NativeFunction> fn_;
};

// While a CycleBreaker is alive on this thread, every list, dict and callable
// made (and every object passed to track) is remembered; when the outermost one
// ends, the survivors are emptied. A template can build reference cycles (a list
// appended to itself, a macro kept in the frame it closes over) that shared
// ownership alone would leak; this frees them at the end of each render.
class CycleBreaker {
   public:
    CycleBreaker();
    ~CycleBreaker();
    CycleBreaker(const CycleBreaker&) = delete;
    CycleBreaker& operator=(const CycleBreaker&) = delete;

    // Remembers `obj` (if a breaker is active) to be emptied by `clear` at the end.
    static void track(const std::shared_ptr<void>& obj, void (*clear)(void*));

   private:
    bool owner_ = false;
};

// An insertion-ordered dict. Keys are strings, ints, bools, floats or none (as Python allows).
struct Dict {
    std::vector<std::pair<Value, Value>> items;
    bool is_namespace = false;

    // The value for `key`, or nullptr.
    const Value* find(const Value& key) const;
    Value* find(const Value& key);
    // Inserts or replaces (keeping the original position, as Python does).
    void set(const Value& key, Value value);
    // Removes `key`; returns whether it was present.
    bool erase(const Value& key);
};

}  // namespace cera::jinja
