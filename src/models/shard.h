// Tensor parallelism (docs/tensor-parallel.md): a model split over `world` backends, each rank holding
// a share of every layer's heads, channels and FFN columns and the whole residual stream. Products
// whose outputs are split (q/k/v, gate/up, in_proj) take a range of the weight's rows; products whose
// inputs are split (attention output, down, out_proj) take a range of its columns and leave partial
// sums that one all-reduce a block adds up, as Megatron-LM splits a transformer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/collectives.h"
#include "cera/error.h"

namespace cera {

// Which share of a model a rank holds: a share of every layer (tensor parallel), or with `pipeline`
// whole layers, a range of them a rank (the fallback for shapes that do not divide).
struct Shard {
    int rank = 0, world = 1;
    bool pipeline = false;
    // The ranks each layer's heads, channels and columns are divided among: world, or 1 for pipeline stages.
    int split() const { return pipeline ? 1 : world; }
    // The layers [layer_begin, layer_end) of n_layer that this rank runs.
    int64_t layer_begin(int64_t n_layer) const { return pipeline ? begin(n_layer) : 0; }
    int64_t layer_end(int64_t n_layer) const { return pipeline ? end(n_layer) : n_layer; }
    // Rank's part [begin, end) of n items split as evenly as whole groups of `unit` items allow.
    int64_t begin(int64_t n, int64_t unit = 1) const { return (n / unit) * rank / world * unit; }
    int64_t end(int64_t n, int64_t unit = 1) const { return (n / unit) * (rank + 1) / world * unit; }
    int64_t size(int64_t n, int64_t unit = 1) const { return end(n, unit) - begin(n, unit); }
};

// A split that does not divide among the ranks (heads, channels, whole blocks): load_model then makes
// the ranks pipeline stages instead. kUnsupported, its message naming what did not divide.
struct SplitError : Error {
    explicit SplitError(const std::string& what) : Error(ErrorCode::kUnsupported, "tensor parallel: " + what) {}
};

// How a weight is divided among the ranks. GGUF order: ne[0] is a row's length (a product's input),
// ne[1] the rows (its output); a stacked MoE weight has its experts in ne[2].
enum class Split {
    kNone,   // every rank holds all of it
    kRows,   // ne[1] divided: each rank computes a range of the outputs (of every expert)
    kCols,   // ne[0] divided: each rank multiplies a range of the inputs and holds a partial sum
    kVocab,  // ne[1] divided as evenly as it goes (Shard::begin, end): an LM head's rows of the vocabulary
};

}  // namespace cera
