// Errors raised while evaluating a template. EvalError carries no position: the
// interpreter catches it at the innermost node and rethrows a cera::Error naming
// the template line.
#pragma once
#include <stdexcept>
#include <string>

namespace cera::jinja {

struct EvalError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Throws EvalError with a printf-formatted message.
[[noreturn]] void eval_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace cera::jinja
