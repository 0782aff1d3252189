// Argument helpers shared by the builtin functions, methods and filters.
#pragma once
#include <initializer_list>
#include <string>

#include "chat/jinja/value.h"

namespace cera::jinja {

// Argument `index` (positional) or `name` (keyword), else `def`.
Value arg(CallArgs& args, size_t index, const char* name, Value def = Value());
// Rejects more than `max_positional` positional arguments and keywords not in `names`.
void check_args(const char* fn, const CallArgs& args, size_t max_positional, std::initializer_list<const char*> names);
// The integer in `v` (bools count), or an error naming `what`.
int64_t int_arg(const Value& v, const char* what);
// The string in `v`, or an error naming `what`.
const std::string& str_arg(const Value& v, const char* what);
// A method of a string, list or dict bound to `obj` (e.g. "strip", "append", "items"); undefined if none.
Value bound_method(const Value& obj, const std::string& name);

}  // namespace cera::jinja
