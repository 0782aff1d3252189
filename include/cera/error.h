// cera::Error: the one exception type for bad input (files, prompts, requests).
// Bugs and broken invariants use CERA_CHECK (src/core/check.h) instead.
#pragma once
#include <stdexcept>
#include <string>

namespace cera {

enum class ErrorCode {
    kInvalidArgument,   // a bad option or request value
    kIo,                // a file could not be opened, read or written
    kInvalidFile,       // a malformed GGUF, tokenizer or other data file
    kUnsupported,       // a valid input this build cannot handle (unknown arch, type)
    kMissing,           // a required key or tensor is absent
    kOutOfRange,        // a value outside its allowed range (token id, context length)
    kParse,             // a template, grammar or JSON that does not parse
    kDevice,            // no such device, or the device failed
    kCancelled,         // the caller cancelled the operation
    kOverCapacity,      // no room for the request now (a full queue); it may succeed later
};

// One-line name of an error code, e.g. "invalid file".
const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
   public:
    Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
    ErrorCode code() const { return code_; }

   private:
    ErrorCode code_;
};

}  // namespace cera
