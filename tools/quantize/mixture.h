// Which type each tensor of a model gets when it is quantized to a file type, by the
// rules llama-quantize applies (no importance matrix): which tensors are quantized at
// all, the types of the mixtures (Q4_K_M, Q5_K_S, ...), the head and embedding types,
// and the fallback for rows that do not fill whole blocks. Both `cera quantize` and
// `cera synth` choose their tensor types here, so the two never disagree.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace cera::quantize {

// llama.cpp's llama_ftype values, as `general.file_type` stores them.
enum class FileType : uint32_t {
    kAllF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ8_0 = 7,
    kQ5_0 = 8,
    kQ5_1 = 9,
    kQ2_K = 10,
    kQ3_K_S = 11,
    kQ3_K_M = 12,
    kQ3_K_L = 13,
    kQ4_K_S = 14,
    kQ4_K_M = 15,
    kQ5_K_S = 16,
    kQ5_K_M = 17,
    kQ6_K = 18,
    kQ2_K_S = 21,
    kIQ4_NL = 25,
    kIQ4_XS = 30,
    kBF16 = 32,
};

// A file type and the name it is asked for by.
struct FileTypeName {
    FileType type;
    const char* name;
};

// Every name `cera quantize` takes, in the order --help lists them. Q4_K and Q5_K
// stand for Q4_K_M and Q5_K_M, as in llama-quantize.
const std::vector<FileTypeName>& file_type_names();

// Parses a file type name (case-insensitive). Throws cera::Error(kInvalidArgument) for a
// name llama-quantize does not know and kUnsupported, saying why, for one this build cannot
// write (no quantizer for its base type, or an activation-only format such as Q8_K).
FileType parse_file_type(std::string_view name);

// The type most tensors get (llama_ftype_get_default_type).
GgmlType default_type(FileType ft);
const char* file_type_name(FileType ft);

// What the rules need to know about the model, read from its metadata.
struct ModelFacts {
    std::string arch;      // general.architecture
    int64_t n_layer = 0;   // {arch}.block_count
    int64_t n_expert = 0;  // {arch}.expert_count (0 when absent or 1)
    // llama.cpp's 70B class (llama with 80 layers and grouped KV heads, qwen2 with 80):
    // its attn_v gets Q5_K where the mixture says Q3_K or Q4_K.
    bool is_70b = false;
    // Query heads per KV head of layer 0 (0 when that layer has no attention, as LFM2's first layers):
    // the Q2_K mixtures give attn_v more bits from 4 on.
    int64_t n_gqa = 0;
};

// A tensor as the rules see it.
struct TensorDesc {
    std::string name;
    std::vector<int64_t> ne;  // ne[0] innermost
    GgmlType type;            // its type in the input
};

struct MixtureOptions {
    FileType file_type = FileType::kQ8_0;
    // Every quantized tensor in the default type (llama-quantize --pure): no mixture rules,
    // only the fallback for rows that do not fill a block.
    bool pure = false;
    std::optional<GgmlType> token_embedding_type;  // --token-embedding-type
    std::optional<GgmlType> output_tensor_type;    // --output-tensor-type
    bool has_imatrix = false;  // an importance matrix is given (changes Q4_0 / Q5_0's ffn_down)
};

// Whether llama-quantize quantizes this tensor at all: 2-D and 3-D tensors whose names
// end in "weight", except norms, routers, short-conv kernels and a few small per-model
// tensors. The others are copied as they are.
bool allows_quantization(const TensorDesc& t);

// `type`, or where its blocks do not tile a row of `t`, llama-quantize's fallback: a type
// with 32-element blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K -> Q4_0), and
// F16 where 32 does not divide the row either. Throws cera::Error(kUnsupported) for a type
// without a fallback (Q8_0, Q4_0, ... on rows that are not a multiple of 32).
GgmlType fallback_type(const TensorDesc& t, GgmlType type);
// As above for a row of ne0 elements; nullopt where the type has no fallback.
std::optional<GgmlType> fallback_for(GgmlType type, int64_t ne0);

// The output type of every tensor, in the order given. Tensors that are not quantized keep
// their input type. The counters of the rules (the i-th attn_v of n, the layer of an
// ffn_down) run in llama-quantize's order (see quantize_order). Throws
// cera::Error(kUnsupported) where llama-quantize fails: rows of a tensor that fit neither
// the chosen type nor its fallback (say Q8_0 with ne[0] = 100), and an expert model's FFN
// tensor outside blk.N.
std::vector<GgmlType> choose_types(const MixtureOptions& o, const ModelFacts& m,
                                   const std::vector<TensorDesc>& tensors);

// The indices of `names` in the order llama-quantize writes tensors: tensors outside the
// blocks first, then block by block, by name within each.
std::vector<size_t> quantize_order(const std::vector<std::string>& names);

}  // namespace cera::quantize
