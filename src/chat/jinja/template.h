// A parsed Jinja template (the subset chat templates use) and its renderer.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/lexer.h"

namespace cera::jinja {

class Template {
   public:
    // Parses `source`; throws cera::Error (kParse) naming the line and column.
    explicit Template(std::string_view source, const LexOptions& options = {});
    // Renders with `globals` as variables; see Interpreter::render for the errors.
    std::string render(const std::vector<std::pair<std::string, Value>>& globals, const RenderLimits& limits = {},
                       StrftimeFn strftime_now = {}) const;

   private:
    Body body_;
};

// Parses JSON text into a value (objects keep their key order); throws cera::Error (kParse) naming `what`.
Value value_from_json(std::string_view json, const char* what);
// strftime_now() for a fixed time (seconds since the epoch, formatted as UTC), or the local clock when < 0.
StrftimeFn make_strftime(int64_t unix_seconds);

}  // namespace cera::jinja
