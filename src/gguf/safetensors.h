// The safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end)}} (offsets relative to the end of the
// header), then the data. The file is mapped, not read; F64, F32, F16 and BF16 tensors are accepted
// and every value reaches the converter as f32.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mmap.h"

namespace cera {

struct StTensor {
    std::string dtype;           // "F64", "F32", "F16", "BF16"
    std::vector<int64_t> shape;  // outermost first (PyTorch order)
    const uint8_t* data = nullptr;
    size_t n_bytes = 0;

    int64_t n_elements() const;
    // The values as f32, written to out[0 .. n_elements()).
    void to_f32(float* out) const;
};

class SafeTensors {
 public:
    // Maps and validates the file: every tensor's dtype, shape and byte range (throws cera::Error).
    explicit SafeTensors(const std::string& path);
    // The shards of one checkpoint as one set of tensors; a name in two shards is refused. `name`
    // (the index file) stands for the set in messages.
    SafeTensors(const std::vector<std::string>& shards, std::string name);

    const std::string& path() const { return path_; }
    const StTensor* find(const std::string& name) const;
    const std::map<std::string, StTensor>& tensors() const { return tensors_; }
    // The shard file that holds a tensor (the one file when not sharded).
    const std::string& file_of(const std::string& name) const;

 private:
    void add_file(const std::string& path);

    std::string path_;
    std::vector<MappedFile> maps_;
    std::map<std::string, StTensor> tensors_;
    std::map<std::string, size_t> shard_of_;  // tensor name -> maps_ index
};

// "4096x128"
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace cera
