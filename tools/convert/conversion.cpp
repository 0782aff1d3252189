#include "convert/conversion.h"

#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "core/quant/quant.h"
#include "gguf/keys.h"

namespace cera::convert {

int64_t Dims::of(Dim d) const {
    switch (d) {
        case Dim::kVocab:
            return n_vocab;
        case Dim::kEmbd:
            return n_embd;
        case Dim::kFf:
            return n_ff;
        case Dim::kQ:
            return n_head * head_dim;
        case Dim::kKv:
            return n_head_kv * head_dim;
        case Dim::kHeadDim:
            return head_dim;
        case Dim::kFfExp:
            return n_ff_exp;
        case Dim::kExpert:
            return n_expert;
        case Dim::kConvIn:
            return 3 * n_embd;
        case Dim::kLCache:
            return l_cache;
        case Dim::kOne:
            return 1;
        case Dim::kVEmbd:
            return v_embd;
        case Dim::kVFf:
            return v_ff;
        case Dim::kVPatchIn:
            return 3 * patch * patch;
        case Dim::kVPos:
            return v_pos;
        case Dim::kProjIn:
            return proj_in;
        case Dim::kProjHidden:
            return proj_hidden;
    }
    return 0;
}

namespace {

// HF rotate-half rows -> NORM-RoPE rows, per head: new[h][2j + s] = old[h][s * d/2 + j].
//   w: [n_head * head_dim, row_len] row-major
void permute_rope_rows(std::vector<float>& w, int64_t n_head, int64_t head_dim, int64_t row_len) {
    std::vector<float> out(w.size());
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t j = 0; j < half; ++j)
            for (int64_t s = 0; s < 2; ++s) {
                const float* src = w.data() + ((h * head_dim) + s * half + j) * row_len;
                float* dst = out.data() + ((h * head_dim) + 2 * j + s) * row_len;
                std::memcpy(dst, src, size_t(row_len) * sizeof(float));
            }
    w.swap(out);
}

// Linear patch embedding over (y, x, c) pixels -> conv kernel [v_embd][c][y][x].
void permute_patch_embedding(std::vector<float>& w, int64_t patch) {
    const int64_t pdim = 3 * patch * patch;
    std::vector<float> out(w.size());
    for (size_t o = 0; o < w.size() / size_t(pdim); ++o)
        for (int64_t c = 0; c < 3; ++c)
            for (int64_t y = 0; y < patch; ++y)
                for (int64_t x = 0; x < patch; ++x)
                    out[o * size_t(pdim) + size_t((c * patch + y) * patch + x)] =
                        w[o * size_t(pdim) + size_t((y * patch + x) * 3 + c)];
    w.swap(out);
}

std::string replace_expert(const char* pattern, int64_t x) {
    std::string s = pattern;
    const size_t at = s.find("{x}");
    CERA_CHECK(at != std::string::npos, "expert row '%s' has no {x}", pattern);
    return s.replace(at, 3, std::to_string(x));
}

}  // namespace

Conversion::Conversion(const HfConfig& cfg, const SafeTensors& st, gguf::Writer& w, GgmlType type)
    : cfg_(cfg), st_(st), w_(w), type_(type) {}

void Conversion::set_arch(const std::string& arch) {
    arch_ = arch;
    w_.set_string(gguf::keys::kArchitecture, arch);
}

void Conversion::u32(const char* suffix, int64_t v) {
    if (v < 0 || v > int64_t(UINT32_MAX))
        throw_error(ErrorCode::kInvalidFile, "%s.%s = %lld does not fit a u32", arch_.c_str(), suffix, (long long)v);
    w_.set_u32(gguf::keys::arch_key(arch_, suffix), uint32_t(v));
}
void Conversion::f32(const char* suffix, float v) { w_.set_f32(gguf::keys::arch_key(arch_, suffix), v); }
void Conversion::i32s(const char* suffix, const std::vector<int32_t>& v) {
    w_.set(gguf::keys::arch_key(arch_, suffix), gguf::value_i32_array(v));
}
void Conversion::str(const char* suffix, std::string v) {
    w_.set_string(gguf::keys::arch_key(arch_, suffix), std::move(v));
}
void Conversion::flag(const char* suffix, bool v) { w_.set_bool(gguf::keys::arch_key(arch_, suffix), v); }
void Conversion::f32s(const char* suffix, const std::vector<float>& v) {
    w_.set(gguf::keys::arch_key(arch_, suffix), gguf::value_f32_array(v));
}

std::string Conversion::hf_name(const char* row_name) const {
    const std::string s = row_name;
    return s.rfind("model.", 0) == 0 ? hf_model + s.substr(6) : s;
}

const StTensor& Conversion::need(const std::string& name, const std::vector<int64_t>& shape) {
    const StTensor* t = st_.find(name);
    if (!t) throw_error(ErrorCode::kMissing, "%s: tensor '%s' is missing", st_.path().c_str(), name.c_str());
    if (t->shape != shape)
        throw_error(ErrorCode::kInvalidFile, "tensor '%s' has shape [%s], expected [%s]", name.c_str(),
                    shape_str(t->shape).c_str(), shape_str(shape).c_str());
    used_.insert(name);
    return *t;
}

void Conversion::put(const TensorRow& r, int64_t layer) {
    if (layer < 0) return place(r, hf_name(r.hf), r.gguf);
    const std::string n = std::to_string(layer);
    place(r, hf_model + "layers." + n + "." + r.hf, "blk." + n + "." + r.gguf);
}

void Conversion::put_under(std::span<const TensorRow> rows, const std::string& hf_prefix,
                           const std::string& gguf_prefix) {
    for (const TensorRow& r : rows) place(r, hf_prefix + r.hf, gguf_prefix + r.gguf);
}

void Conversion::place(const TensorRow& r, const std::string& hf, const std::string& gg) {
    std::vector<int64_t> shape;
    for (Dim d : r.shape) shape.push_back(dims.of(d));

    std::vector<const StTensor*> src;
    std::vector<int64_t> out_shape;  // PyTorch order
    if (r.op == Op::kExperts) {
        for (int64_t x = 0; x < dims.n_expert; ++x) src.push_back(&need(replace_expert(hf.c_str(), x), shape));
        out_shape.push_back(dims.n_expert);
    } else {
        src.push_back(&need(hf, shape));
    }
    if (r.op == Op::kPatchEmbd) {
        out_shape = {shape[0], 3, dims.patch, dims.patch};
    } else {
        for (size_t i = 0; i < r.shape.size(); ++i)
            if (r.shape[i] != Dim::kOne) out_shape.push_back(shape[i]);
    }
    std::vector<int64_t> ne(out_shape.rbegin(), out_shape.rend());  // GGUF order: innermost first

    // 1-D tensors and the rows marked keep_f32 stay F32; a tensor whose rows do not fill whole blocks
    // of the requested type falls back to F32.
    GgmlType type = GgmlType::kF32;
    if (r.op == Op::kPatchEmbd) {
        if (type_ == GgmlType::kF16) type = GgmlType::kF16;
    } else if (ne.size() >= 2 && !r.keep_f32 && type_ != GgmlType::kF32) {
        const QuantTraits* q = quant_traits(type_);
        if (q && q->quantize && ne[0] % q->block_size == 0)
            type = type_;
        else
            std::fprintf(stderr, "cera convert: %s: rows of %lld do not fit %s blocks, kept as F32\n", gg.c_str(),
                         (long long)ne[0], type_name(type_));
    }
    int64_t permute_heads = 0;
    if (norm_rope && r.op == Op::kRopeQ) permute_heads = dims.n_head;
    if (norm_rope && r.op == Op::kRopeK) permute_heads = dims.n_head_kv;
    const int64_t head_dim = dims.head_dim;
    const int64_t n_cols = ne[0];
    // The permuted rows are the outermost dimension: a bias has rows of one value.
    int64_t row_len = 1;
    for (size_t i = 1; i < out_shape.size(); ++i) row_len *= out_shape[i];
    const int64_t patch = r.op == Op::kPatchEmbd ? dims.patch : 0;
    w_.add_tensor(gg, type, ne,
                  [src, permute_heads, head_dim, row_len, n_cols, type, patch](uint8_t* dst, size_t n_bytes) {
                      size_t n = 0;
                      for (const StTensor* s : src) n += size_t(s->n_elements());
                      std::vector<float> data(n);
                      size_t off = 0;
                      for (const StTensor* s : src) {
                          s->to_f32(data.data() + off);
                          off += size_t(s->n_elements());
                      }
                      if (permute_heads > 0) permute_rope_rows(data, permute_heads, head_dim, row_len);
                      if (patch > 0) permute_patch_embedding(data, patch);
                      const size_t rows = n / size_t(n_cols);
                      const size_t row_bytes = row_size(type, n_cols);
                      CERA_CHECK(rows * row_bytes == n_bytes, "tensor data size mismatch");
                      for (size_t i = 0; i < rows; ++i)
                          quantize_row_ref(type, data.data() + i * size_t(n_cols), dst + i * row_bytes, n_cols);
                  });
}

void Conversion::put(std::span<const TensorRow> rows, int64_t layer) {
    for (const TensorRow& r : rows) put(r, layer);
}

void Conversion::put_embedding_and_output(bool tied) {
    tied_ = tied;
    const bool has_embed = has(hf_name("model.embed_tokens.weight"));
    if (!has_embed && !tied)
        throw_error(ErrorCode::kMissing, "%s: tensor '%s' is missing", st_.path().c_str(),
                    hf_name("model.embed_tokens.weight").c_str());
    put({has_embed ? "model.embed_tokens.weight" : "lm_head.weight", "token_embd.weight", {Dim::kVocab, Dim::kEmbd}});
    if (!tied) {
        if (!has("lm_head.weight"))
            throw_error(ErrorCode::kMissing, "lm_head.weight is missing and tie_word_embeddings is false");
        put({"lm_head.weight", "output.weight", {Dim::kVocab, Dim::kEmbd}});
    }
}

void Conversion::add_f32(const std::string& name, const std::vector<float>& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    w_.add_tensor(name, GgmlType::kF32, {int64_t(v.size())}, std::span<const uint8_t>(p, v.size() * sizeof(float)));
}

void Conversion::check_all_used() const {
    for (const auto& [name, t] : st_.tensors()) {
        const bool rope_cache = name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0;
        const bool tied_head = tied_ && name == "lm_head.weight";
        bool left = false;
        for (const std::string& p : left_) left = left || name.rfind(p, 0) == 0;
        if (!used_.count(name) && !rope_cache && !tied_head && !left)
            throw_error(ErrorCode::kUnsupported, "%s: tensor '%s' has no place in a GGUF %s model", st_.path().c_str(),
                        name.c_str(), arch_.c_str());
    }
}

}  // namespace cera::convert
