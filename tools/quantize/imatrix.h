// Importance matrices: for every weight matrix W of a model, the mean square of each column's input
// (the activations that multiply W's column k), measured over a text. A quantizer weighted by them
// spends its precision on the columns that carry signal (quantize_row_imatrix).
//
// The file is llama.cpp's imatrix GGUF, so files made by either tool serve both: general.type
// "imatrix", imatrix.datasets (the texts), imatrix.chunk_count and imatrix.chunk_size, and for each W
// the tensors "W.in_sum2" (f32 {ne0, n_mat}: the sums of squared inputs per column, one row per
// expert of a stacked MoE weight, else one) and "W.counts" (f32 {1, n_mat}: the input rows summed).
// llama.cpp's older .dat files are read too (per weight: its name, a call count and the values).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cera::quantize {

struct ImatrixEntry {
    int64_t ne0 = 0;              // columns
    std::vector<double> sums;     // [n_mat * ne0]
    std::vector<int64_t> counts;  // [n_mat]
    bool legacy = false;          // from a .dat file: one call count for all the values
};

struct Imatrix {
    std::map<std::string, ImatrixEntry> entries;  // by weight name
    std::vector<std::string> datasets;
    uint32_t chunk_count = 0, chunk_size = 0;
};

// Reads an imatrix GGUF, or a .dat file (anything that does not start with GGUF's magic). Throws
// cera::Error: kIo (cannot open), kInvalidFile (not an imatrix GGUF, a sums tensor without its counts or
// the other way round, shapes that disagree, non-finite or negative values, a truncated .dat file).
Imatrix read_imatrix(const std::string& path);
void write_imatrix(const Imatrix& m, const std::string& path);

// The quantizer's weights of an entry, [n_mat * ne0]: sums / count per matrix (1 for a matrix that no
// row reached; a .dat entry's values as they are when its call count is 0), as llama-quantize does.
std::vector<float> importance(const ImatrixEntry& e);

struct ImatrixOptions {
    std::string model;            // a GGUF model (run on the CPU)
    int n_ctx = 512;              // chunk length in tokens: each chunk is evaluated from an empty cache
    int n_chunks = -1;            // chunks at most; < 0: all that fit
    int n_threads = 0;            // 0: the physical cores
    bool process_output = false;  // also collect output.weight (llama-imatrix --process-output)
    std::string dataset;          // the text's name, stored in imatrix.datasets
    // After each chunk: chunks done and in all.
    std::function<void(int32_t done, int32_t total)> on_chunk;
};

struct ImatrixRun {
    Imatrix imatrix;
    int64_t n_tokens = 0;  // tokens evaluated
    double seconds = 0;
};

// Cuts the text's tokens (BOS first when the model wants one) into chunks of n_ctx, each starting with
// BOS when the model wants one, as llama-imatrix does, and sums the squared inputs of every weight
// product of the blocks (blk.*; output.weight too with process_output). Throws cera::Error
// (kInvalidArgument for fewer than two chunks of text or bad options; what loading the model throws).
ImatrixRun compute_imatrix(const ImatrixOptions& o, const std::string& text);

}  // namespace cera::quantize
