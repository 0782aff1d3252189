// What every architecture converter writes through: the `<arch>.*` keys, and the checkpoint's
// tensors placed by table rows (HF name, GGUF name, shape, how the values move).
//
// A row names its HF tensor under "model.layers.<i>." and its GGUF tensor under "blk.<i>." when
// it is put for layer i, or by full names when put as a global; put_under() places rows under other
// prefixes (a vision tower's layers). A text model nested in a multimodal checkpoint has its tensors
// under another prefix than "model." (Conversion::hf_model). Shapes are symbolic (Dim) and
// resolved per model from Conversion::dims, so one table serves every size; a tensor whose shape
// differs is refused. Data is converted while the file is written (the safetensors file stays
// mapped), so a model never sits in memory twice.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "gguf/safetensors.h"
#include "core/dtype.h"
#include "gguf/writer.h"

namespace cera::convert {

// A tensor dimension, named after the glossary; resolved by Dims::of.
enum class Dim {
    kVocab,    // n_vocab
    kEmbd,     // n_embd
    kFf,       // n_ff (dense FFN)
    kQ,        // n_head * head_dim
    kKv,       // n_head_kv * head_dim
    kHeadDim,  // head_dim
    kFfExp,    // n_ff_exp (one expert's FFN)
    kExpert,   // n_expert
    kConvIn,   // 3 * n_embd (short-conv in_proj: B, C and x)
    kLCache,   // l_cache (short-conv kernel length)
    kOne,      // 1: present in the HF shape, dropped in the GGUF one (the conv kernel [n_embd, 1, L])
    // A vision tower and its projector (the mmproj file of a vision-language model).
    kVEmbd,        // v_embd: the tower's width
    kVFf,          // v_ff: the tower's FFN width
    kVPatchIn,     // 3 * patch * patch: one patch's pixels
    kVPos,         // v_pos: the position table's rows (a square grid)
    kProjIn,       // proj_in: v_embd times the downsampling factor squared
    kProjHidden,   // proj_hidden: the projector's hidden width
};

struct Dims {
    int64_t n_vocab = 0, n_embd = 0, n_ff = 0;
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t n_ff_exp = 0, n_expert = 0, l_cache = 0;
    int64_t v_embd = 0, v_ff = 0, patch = 0, v_pos = 0, proj_in = 0, proj_hidden = 0;
    int64_t of(Dim d) const;
};

// How the HF values become the GGUF tensor.
enum class Op {
    kCopy,     // the same values in the same order
    kRopeQ,    // q rows: permuted per head (n_head) to adjacent pairs when Conversion::norm_rope is set
    kRopeK,    // k rows: the same over n_head_kv heads
    kExperts,  // "{x}" in the HF name runs over the n_expert experts, stacked outermost
    // A patch embedding stored as a linear layer [v_embd, patch * patch * 3] over (y, x, channel)
    // pixels becomes the conv kernel GGUF holds, PyTorch [v_embd, 3, patch, patch]; it stays F32
    // (F16 with --type F16) as llama.cpp keeps it.
    kPatchEmbd,
};

struct TensorRow {
    const char* hf;
    const char* gguf;
    std::vector<Dim> shape;  // the HF shape, outermost first (PyTorch order); one expert's for kExperts
    Op op = Op::kCopy;
    bool keep_f32 = false;  // stays F32 whatever --type (as llama.cpp keeps routers and conv kernels)
};

class Conversion {
 public:
    Conversion(const HfConfig& cfg, const SafeTensors& st, gguf::Writer& w, GgmlType type);

    const HfConfig& cfg() const { return cfg_; }
    gguf::Writer& writer() { return w_; }
    GgmlType type() const { return type_; }

    // general.architecture; the `<arch>.*` keys below are written under it.
    void set_arch(const std::string& arch);
    const std::string& arch() const { return arch_; }
    void u32(const char* suffix, int64_t v);
    void f32(const char* suffix, float v);
    void i32s(const char* suffix, const std::vector<int32_t>& v);
    void str(const char* suffix, std::string v);
    void flag(const char* suffix, bool v);
    void f32s(const char* suffix, const std::vector<float>& v);

    // Filled by the architecture before any put().
    Dims dims;
    // RoPE NORM (adjacent pairs, llama.cpp's `llama` family): HF's rotate-half q/k rows are permuted.
    bool norm_rope = false;
    // Where the text model's tensors are: rows naming "model.<x>" are looked up as hf_model + "<x>".
    std::string hf_model = "model.";

    void put(const TensorRow& row, int64_t layer = -1);
    void put(std::span<const TensorRow> rows, int64_t layer = -1);
    // The rows named under these prefixes (for a layer of another stack).
    void put_under(std::span<const TensorRow> rows, const std::string& hf_prefix, const std::string& gguf_prefix);
    // A row's HF name as a global: "model." resolved through hf_model.
    std::string hf_name(const char* row_name) const;
    bool has(const std::string& hf_name) const { return st_.find(hf_name) != nullptr; }
    // token_embd.weight (from model.embed_tokens.weight, or lm_head.weight when tied and stored only
    // there) and, when not tied, output.weight from lm_head.weight.
    void put_embedding_and_output(bool tied);
    void add_f32(const std::string& gguf_name, const std::vector<float>& values);

    // The checkpoint's tensors under `hf_prefix` are not this file's: another file written from the
    // same checkpoint holds them (the text model and its vision projector), or the model does not
    // run them (a vision layer after the one whose features it takes).
    void leave(std::string hf_prefix) { left_.push_back(std::move(hf_prefix)); }

    // Throws naming the first checkpoint tensor that no row placed and no leave() covers: a part of
    // the model the file would not run.
    void check_all_used() const;

 private:
    const StTensor& need(const std::string& hf_name, const std::vector<int64_t>& shape);
    void place(const TensorRow& r, const std::string& hf, const std::string& gg);

    const HfConfig& cfg_;
    const SafeTensors& st_;
    gguf::Writer& w_;
    GgmlType type_;
    std::string arch_;
    std::set<std::string> used_;
    std::vector<std::string> left_;
    bool tied_ = false;
};

}  // namespace cera::convert
