// CERA_CHECK: invariants and bugs. Aborts with file:line and a message; never
// used for bad input (that throws cera::Error).
#pragma once
#include <cstdio>
#include <cstdlib>

#include "cera/error.h"

namespace cera::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt = nullptr, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace cera::detail

#define CERA_CHECK(cond, ...)                                                       \
    do {                                                                            \
        if (__builtin_expect(!(cond), 0))                                           \
            ::cera::detail::check_failed(__FILE__, __LINE__, #cond, ##__VA_ARGS__); \
    } while (0)

namespace cera {
// Throws cera::Error with a printf-formatted message.
[[noreturn]] void throw_error(ErrorCode code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
}  // namespace cera
