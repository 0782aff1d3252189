// Turning values into text the way Python and Jinja do: str() for output,
// repr() inside containers, and json.dumps() for the `tojson` filter.
#pragma once
#include <string>

#include "chat/jinja/value.h"

namespace cera::jinja {

// Python repr() of a float: shortest round-trip digits, "1.0", "1e-05", "inf", "nan".
std::string format_float(double d);
// Python str() of a value as `{{ x }}` prints it: undefined is "", none is "None".
std::string to_str(const Value& v);
// Python repr(): strings quoted, as inside a printed list or dict.
std::string repr(const Value& v);

// json.dumps options, as HF's tojson filter exposes them (ensure_ascii defaults to false there).
struct JsonOptions {
    int indent = -1;  // < 0: single line
    bool ensure_ascii = false;
    bool sort_keys = false;
    bool custom_separators = false;
    std::string item_separator;  // used when custom_separators
    std::string key_separator;
};

// json.dumps(v, ...). Undefined and callables are errors.
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace cera::jinja
