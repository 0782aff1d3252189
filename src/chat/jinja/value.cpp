#include "chat/jinja/value.h"

#include <cmath>
#include <utility>
#include <vector>

namespace cera::jinja {

namespace {

struct Tracked {
    std::weak_ptr<void> obj;
    void (*clear)(void*);
};
thread_local std::vector<Tracked>* g_tracked = nullptr;

}  // namespace

CycleBreaker::CycleBreaker() {
    if (!g_tracked) {
        g_tracked = new std::vector<Tracked>();
        owner_ = true;
    }
}

CycleBreaker::~CycleBreaker() {
    if (!owner_) return;
    std::vector<Tracked>* tracked = g_tracked;
    g_tracked = nullptr;
    // Hold every survivor first, so that emptying one cannot free another mid-way.
    std::vector<std::pair<std::shared_ptr<void>, void (*)(void*)>> alive;
    for (const Tracked& t : *tracked)
        if (auto p = t.obj.lock()) alive.emplace_back(std::move(p), t.clear);
    delete tracked;
    for (auto& [p, clear] : alive) clear(p.get());
}

void CycleBreaker::track(const std::shared_ptr<void>& obj, void (*clear)(void*)) {
    if (g_tracked) g_tracked->push_back({obj, clear});
}

Value Value::none() {
    Value v;
    v.kind_ = ValueKind::kNone;
    return v;
}

Value::Value(bool b) : kind_(ValueKind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(ValueKind::kInt), i_(i) {}
Value::Value(double d) : kind_(ValueKind::kFloat), f_(d) {}
Value::Value(std::string s) : kind_(ValueKind::kString), s_(std::make_shared<std::string>(std::move(s))) {}

Value Value::list(ValueList items) {
    Value v;
    v.kind_ = ValueKind::kList;
    v.list_ = std::make_shared<ValueList>(std::move(items));
    CycleBreaker::track(v.list_, [](void* p) { ValueList().swap(*static_cast<ValueList*>(p)); });
    return v;
}

Value Value::dict() {
    Value v;
    v.kind_ = ValueKind::kDict;
    v.dict_ = std::make_shared<Dict>();
    CycleBreaker::track(v.dict_, [](void* p) { decltype(Dict::items)().swap(static_cast<Dict*>(p)->items); });
    return v;
}

Value Value::namespace_object() {
    Value v = dict();
    v.dict_->is_namespace = true;
    return v;
}

Value Value::callable(std::string name, NativeFunction fn) {
    Value v;
    v.kind_ = ValueKind::kCallable;
    v.s_ = std::make_shared<std::string>(std::move(name));
    v.fn_ = std::make_shared<NativeFunction>(std::move(fn));
    CycleBreaker::track(v.fn_, [](void* p) { NativeFunction().swap(*static_cast<NativeFunction*>(p)); });
    return v;
}

bool Value::is_namespace() const { return kind_ == ValueKind::kDict && dict_->is_namespace; }

double Value::as_float() const {
    if (kind_ == ValueKind::kFloat) return f_;
    return static_cast<double>(as_int());
}

bool Value::truthy() const {
    switch (kind_) {
        case ValueKind::kUndefined:
        case ValueKind::kNone: return false;
        case ValueKind::kBool: return b_;
        case ValueKind::kInt: return i_ != 0;
        case ValueKind::kFloat: return f_ != 0.0;
        case ValueKind::kString: return !s_->empty();
        case ValueKind::kList: return !list_->empty();
        case ValueKind::kDict: return dict_->is_namespace || !dict_->items.empty();
        case ValueKind::kCallable: return true;
    }
    return false;
}

bool Value::equals(const Value& other) const {
    if (is_number() && other.is_number()) {
        if (kind_ == ValueKind::kFloat || other.kind_ == ValueKind::kFloat) return as_float() == other.as_float();
        return as_int() == other.as_int();
    }
    if (kind_ != other.kind_) return false;
    switch (kind_) {
        case ValueKind::kUndefined:
        case ValueKind::kNone: return true;
        case ValueKind::kString: return *s_ == *other.s_;
        case ValueKind::kList: {
            if (list_ == other.list_) return true;
            if (list_->size() != other.list_->size()) return false;
            for (size_t i = 0; i < list_->size(); ++i)
                if (!(*list_)[i].equals((*other.list_)[i])) return false;
            return true;
        }
        case ValueKind::kDict: {
            if (dict_ == other.dict_) return true;
            if (dict_->is_namespace || other.dict_->is_namespace) return false;
            if (dict_->items.size() != other.dict_->items.size()) return false;
            for (const auto& [k, v] : dict_->items) {
                const Value* o = other.dict_->find(k);
                if (!o || !v.equals(*o)) return false;
            }
            return true;
        }
        case ValueKind::kCallable: return fn_ == other.fn_;
        default: return false;
    }
}

bool Value::same_object(const Value& other) const {
    if (kind_ != other.kind_) return false;
    switch (kind_) {
        case ValueKind::kList: return list_ == other.list_;
        case ValueKind::kDict: return dict_ == other.dict_;
        case ValueKind::kCallable: return fn_ == other.fn_;
        default: return equals(other);
    }
}

const char* Value::type_name() const {
    switch (kind_) {
        case ValueKind::kUndefined: return "undefined";
        case ValueKind::kNone: return "none";
        case ValueKind::kBool: return "bool";
        case ValueKind::kInt: return "int";
        case ValueKind::kFloat: return "float";
        case ValueKind::kString: return "string";
        case ValueKind::kList: return "list";
        case ValueKind::kDict: return dict_->is_namespace ? "namespace" : "dict";
        case ValueKind::kCallable: return "callable";
    }
    return "value";
}

const Value* Dict::find(const Value& key) const {
    for (const auto& [k, v] : items)
        if (k.equals(key)) return &v;
    return nullptr;
}

Value* Dict::find(const Value& key) {
    for (auto& [k, v] : items)
        if (k.equals(key)) return &v;
    return nullptr;
}

void Dict::set(const Value& key, Value value) {
    if (Value* v = find(key)) {
        *v = std::move(value);
        return;
    }
    items.emplace_back(key, std::move(value));
}

bool Dict::erase(const Value& key) {
    for (auto it = items.begin(); it != items.end(); ++it) {
        if (it->first.equals(key)) {
            items.erase(it);
            return true;
        }
    }
    return false;
}

}  // namespace cera::jinja
