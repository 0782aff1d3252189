#include "core/check.h"

#include <cstdarg>
#include <string>

namespace cera {

const char* error_code_name(ErrorCode code) {
    switch (code) {
        case ErrorCode::kInvalidArgument: return "invalid argument";
        case ErrorCode::kIo: return "i/o error";
        case ErrorCode::kInvalidFile: return "invalid file";
        case ErrorCode::kUnsupported: return "unsupported";
        case ErrorCode::kMissing: return "missing";
        case ErrorCode::kOutOfRange: return "out of range";
        case ErrorCode::kParse: return "parse error";
        case ErrorCode::kDevice: return "device error";
        case ErrorCode::kCancelled: return "cancelled";
        case ErrorCode::kOverCapacity: return "over capacity";
    }
    return "error";
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
    std::fprintf(stderr, "cera: internal check failed at %s:%d: %s", file, line, cond);
    if (fmt) {
        std::fputs(": ", stderr);
        va_list ap;
        va_start(ap, fmt);
        std::vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    std::fputc('\n', stderr);
    std::abort();
}
}  // namespace detail

void throw_error(ErrorCode code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string msg(n > 0 ? size_t(n) : 0, '\0');
    if (n > 0) std::vsnprintf(msg.data(), msg.size() + 1, fmt, ap2);
    va_end(ap2);
    throw Error(code, msg);
}

}  // namespace cera
