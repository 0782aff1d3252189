// Requantizes a GGUF model to another file type the way llama-quantize does: the same
// tensor types (see mixture.h), the same bytes (the quantizers of src/core/quant equal
// ggml's, with an importance matrix and without), the same tensor order and the same
// metadata, with general.file_type and general.quantization_version rewritten (and
// llama-quantize's quantize.imatrix.* keys when an importance matrix is used).
// Input tensors of any type cera can dequantize are requantized through f32.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quantize/mixture.h"

namespace cera::quantize {

struct QuantizeOptions {
    std::string input;   // a GGUF file
    std::string output;  // written to output.tmp and renamed, so a failure leaves no partial file
    FileType file_type = FileType::kQ8_0;
    std::vector<std::string> keep;  // tensors left in their input type
    std::string imatrix;            // an importance matrix GGUF (quantize/imatrix.h), or "" for none
    int n_threads = 0;              // 0: all cores; the bytes do not depend on it
    gguf::Writer::ProgressFn on_progress;  // tensor bytes written so far and in all, after each tensor
};

struct QuantizeSummary {
    size_t n_tensors = 0;
    size_t n_converted = 0;                // tensors whose type changed (the others are copied byte for byte)
    uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
    std::map<GgmlType, int> types;         // output tensors per type
    size_t n_imatrix = 0;                  // converted tensors quantized under the importance matrix
    std::vector<std::string> no_imatrix;   // converted tensors of an imatrix-taking type it has no entry for
};

// What the mixture rules need, read from a model's metadata.
ModelFacts model_facts(const gguf::File& f);

// The output type of every tensor of `f`, in file order, --keep applied. Throws
// cera::Error: kInvalidArgument for a --keep name that is no tensor, kUnsupported for a
// tensor that must be converted but whose type cera cannot read (or write).
std::vector<GgmlType> plan_types(const gguf::File& f, const QuantizeOptions& o);

// Writes the requantized model. Throws cera::Error (kIo, kInvalidFile, kInvalidArgument,
// kUnsupported) before anything is renamed into place; an importance matrix entry whose size is not
// the tensor's columns (times its experts) is kInvalidArgument.
QuantizeSummary quantize_model(const QuantizeOptions& o);

}  // namespace cera::quantize
