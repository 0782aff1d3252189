// GGUF writer: collects metadata and tensors, then writes a version-3 file with
// every tensor's data aligned to the file's alignment (general.alignment, 32 by
// default). Tensor bytes may be given up front (copied) or produced at write time
// by a callback, so multi-GB models never need to sit in memory at once.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace cera::gguf {

// Value builders.
Value value_u8(uint8_t x);
Value value_i8(int8_t x);
Value value_u16(uint16_t x);
Value value_i16(int16_t x);
Value value_u32(uint32_t x);
Value value_i32(int32_t x);
Value value_u64(uint64_t x);
Value value_i64(int64_t x);
Value value_f32(float x);
Value value_f64(double x);
Value value_bool(bool x);
Value value_string(std::string x);
// An array; every item must have type `elem` (checked when written).
Value value_array(ValueType elem, std::vector<Value> items);
Value value_string_array(const std::vector<std::string>& xs);
Value value_i32_array(std::span<const int32_t> xs);
Value value_f32_array(std::span<const float> xs);

class Writer {
   public:
    // Fills exactly n_bytes at dst with the tensor's data (called once, at write time).
    using FillFn = std::function<void(uint8_t* dst, size_t n_bytes)>;

    // Sets a metadata value; a key set twice keeps its first position and takes the new value.
    // Setting general.alignment (u32, a power of two) also sets the data alignment.
    void set(std::string_view key, Value v);
    void set_u32(std::string_view key, uint32_t x) { set(key, value_u32(x)); }
    void set_i32(std::string_view key, int32_t x) { set(key, value_i32(x)); }
    void set_u64(std::string_view key, uint64_t x) { set(key, value_u64(x)); }
    void set_f32(std::string_view key, float x) { set(key, value_f32(x)); }
    void set_bool(std::string_view key, bool x) { set(key, value_bool(x)); }
    void set_string(std::string_view key, std::string x) { set(key, value_string(std::move(x))); }
    void remove(std::string_view key);
    // Sets general.alignment (u32); throws kInvalidArgument unless a non-zero power of two.
    void set_alignment(uint32_t alignment);
    uint32_t alignment() const { return alignment_; }

    // Adds a tensor. ne is in file order (ne[0] innermost), 1..4 dimensions, each >= 1,
    // ne[0] a multiple of the type's block size; duplicate names are rejected
    // (all kInvalidArgument). The bytes are copied; their size must be the tensor's size.
    void add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const uint8_t> bytes);
    // As above, the data produced by `fill` while writing.
    void add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, FillFn fill);

    size_t n_tensors() const { return tensors_.size(); }
    // The tensors' data bytes (alignment padding not counted), as write()'s progress counts them.
    uint64_t tensor_bytes() const {
        uint64_t n = 0;
        for (const Tensor& t : tensors_) n += t.n_bytes;
        return n;
    }
    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }

    // Writes the file (to `path`.tmp, then renamed over `path`). Throws kIo on failure. `progress`, when
    // set, is called after each tensor with the tensor bytes written so far and in all.
    using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;
    void write(const std::string& path, const ProgressFn& progress = {}) const;
    // The whole file in memory (tests, fuzz seeds).
    std::vector<uint8_t> to_bytes() const;

   private:
    struct Tensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> ne;
        size_t n_bytes = 0;
        uint64_t offset = 0;
        std::vector<uint8_t> bytes;  // empty when `fill` produces the data
        FillFn fill;
    };
    Tensor& new_tensor(std::string name, GgmlType type, std::vector<int64_t> ne);
    std::vector<uint8_t> header_bytes() const;  // header, metadata, tensor infos, padding
    template <typename Sink, typename OnTensor>
    void emit(Sink& sink, OnTensor& on_tensor) const;

    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<Tensor> tensors_;
    uint32_t alignment_ = 32;
};

}  // namespace cera::gguf
