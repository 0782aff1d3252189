// GGUF reader: maps a file, validates every count, string, offset and size
// against the file before any access, and exposes metadata and tensors.
// A malformed file throws cera::Error(kInvalidFile) naming what is wrong.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"

namespace cera::gguf {

// GGUF metadata value types, numbered as in the file.
enum class ValueType : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* value_type_name(ValueType t);  // "u32", "string", "array", ...

struct Value;
// An array value: element type and elements. Nested arrays are allowed.
struct Array {
    ValueType elem_type = ValueType::kU8;
    std::vector<Value> items;
};

// One metadata value. Integers keep their exact type; strings are UTF-8 bytes as stored.
struct Value {
    ValueType type = ValueType::kU8;
    std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> v;

    bool is_integer() const;
    bool is_float() const { return type == ValueType::kF32 || type == ValueType::kF64; }
    // Numeric conversions; throw cera::Error if the value is not numeric or does not fit.
    int64_t as_int() const;
    uint64_t as_uint() const;
    double as_double() const;
    const std::string& as_string() const;  // throws unless kString
    const Array& as_array() const;          // throws unless kArray
};

struct TensorInfo {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;  // dimensions, ne[0] (innermost, contiguous) first, as stored
    uint64_t offset = 0;      // relative to the data section
    size_t n_bytes = 0;       // bytes of data
    const uint8_t* data = nullptr;  // points into the mapping (or the caller's buffer)

    int64_t n_elements() const;
    int64_t rows() const { return ne.empty() ? 1 : n_elements() / ne[0]; }  // product of ne[1..]
};

class File {
   public:
    // Maps and parses `path`. Throws cera::Error (kIo / kInvalidFile).
    static std::unique_ptr<File> open(const std::string& path);
    // Parses a caller-owned buffer that must outlive the File (fuzzing, tests).
    static std::unique_ptr<File> from_memory(const uint8_t* data, size_t size, std::string name = "<memory>");

    uint32_t version() const { return version_; }
    const std::string& path() const { return path_; }
    size_t file_size() const { return size_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    // Whether the tensor data lies in a read-only mapping of the file (open), not in a caller's
    // buffer (from_memory).
    bool mapped() const { return map_.data() != nullptr; }

    // Metadata in file order.
    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;  // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. The one-argument form throws kMissing when the key is absent and
    // kInvalidFile naming the key, the expected and the actual type on a mismatch.
    // Integer getters accept any integer type whose value fits.
    uint32_t get_u32(std::string_view key) const;
    uint32_t get_u32(std::string_view key, uint32_t fallback) const;
    int64_t get_i64(std::string_view key) const;
    int64_t get_i64(std::string_view key, int64_t fallback) const;
    float get_f32(std::string_view key) const;   // accepts f32 or f64 (and integers, converted)
    float get_f32(std::string_view key, float fallback) const;
    bool get_bool(std::string_view key) const;
    bool get_bool(std::string_view key, bool fallback) const;
    std::string get_string(std::string_view key) const;
    std::string get_string(std::string_view key, const std::string& fallback) const;
    std::vector<std::string> get_string_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    std::vector<float> get_f32_array(std::string_view key) const;
    // The architecture string (`general.architecture`), or "" when absent.
    std::string architecture() const { return get_string("general.architecture", ""); }

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

   private:
    File() = default;
    void parse(const uint8_t* data, size_t size);

    MappedFile map_;
    std::string path_;
    size_t size_ = 0;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace cera::gguf
