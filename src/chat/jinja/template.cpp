#include "chat/jinja/template.h"

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>

#include "chat/jinja/parser.h"
#include "core/check.h"

namespace cera::jinja {

Template::Template(std::string_view source, const LexOptions& options) : body_(parse(tokenize(source, options))) {}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& globals, const RenderLimits& limits,
                             StrftimeFn strftime_now) const {
    if (!strftime_now) strftime_now = make_strftime(-1);
    CycleBreaker cycle_breaker;  // frees any reference cycle the template builds
    Interpreter interp(limits, std::move(strftime_now));
    return interp.render(body_, globals);
}

namespace {

Value from_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return Value::none();
        case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            uint64_t u = j.get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
            return Value(static_cast<int64_t>(u));
        }
        case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
        case nlohmann::ordered_json::value_t::array: {
            ValueList items;
            items.reserve(j.size());
            for (const auto& x : j) items.push_back(from_json(x));
            return Value::list(std::move(items));
        }
        case nlohmann::ordered_json::value_t::object: {
            Value d = Value::dict();
            for (auto it = j.begin(); it != j.end(); ++it) d.as_dict().set(Value(it.key()), from_json(it.value()));
            return d;
        }
        default: return Value::none();
    }
}

}  // namespace

Value value_from_json(std::string_view json, const char* what) {
    // Bounded nesting so hostile input cannot exhaust the stack while parsing or converting.
    int depth = 0, max_depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < json.size(); ++i) {
        char c = json[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            max_depth = std::max(max_depth, ++depth);
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    if (max_depth > 128) throw_error(ErrorCode::kParse, "%s: JSON nested deeper than 128 levels", what);
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(json, nullptr, false);
    if (j.is_discarded()) throw_error(ErrorCode::kParse, "%s: not valid JSON", what);
    return from_json(j);
}

StrftimeFn make_strftime(int64_t unix_seconds) {
    return [unix_seconds](const std::string& format) -> std::string {
        std::time_t t = unix_seconds >= 0 ? static_cast<std::time_t>(unix_seconds) : std::time(nullptr);
        std::tm tm{};
        if (unix_seconds >= 0) gmtime_r(&t, &tm);
        else localtime_r(&t, &tm);
        if (format.empty()) return "";
        char buf[1024];
        size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
        return std::string(buf, n);
    };
}

}  // namespace cera::jinja
