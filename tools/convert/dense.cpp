// The Llama-style dense transformers: pre-norm attention + SwiGLU FFN blocks. The four GGUF
// architectures differ in a few columns of one table: llama.cpp's `llama` family (llama, granite)
// uses RoPE NORM, so HF's rotate-half q/k rows are permuted and the file carries vocab_size and
// rope.dimension_count; qwen2 adds q/k/v biases; qwen3 a per-head RMSNorm of q and k; granite four
// scalar multipliers.
#include <cmath>

#include "convert/arch.h"
#include "core/check.h"

namespace cera::convert {
namespace {

struct DenseArch {
    const char* arch;     // GGUF general.architecture
    bool norm_rope;       // RoPE NORM: q/k rows permuted from rotate-half to adjacent pairs
    bool qkv_bias;        // q, k and v projections carry biases (required)
    bool qk_norm;         // per-head RMSNorm of q and k
    bool llama_keys;      // <arch>.vocab_size and rope.dimension_count are written
    bool rope_freqs;      // Llama 3.1 RoPE scaling has a form (rope_freqs.weight)
    bool granite_scales;  // embedding / attention / residual / logit multipliers
};
// clang-format off
//                                arch       norm_rope qkv_bias qk_norm llama_keys rope_freqs granite
constexpr DenseArch kLlama   = {"llama",   true,     false,   false,  true,      true,      false};
constexpr DenseArch kQwen2   = {"qwen2",   false,    true,    false,  false,     false,     false};
constexpr DenseArch kQwen3   = {"qwen3",   false,    false,   true,   false,     false,     false};
constexpr DenseArch kGranite = {"granite", true,     false,   false,  true,      false,     true};

// Per layer, under model.layers.<i>. / blk.<i>.
const TensorRow kLayer[] = {
    {"input_layernorm.weight",          "attn_norm.weight",   {Dim::kEmbd}},
    {"self_attn.q_proj.weight",         "attn_q.weight",      {Dim::kQ, Dim::kEmbd}, Op::kRopeQ},
    {"self_attn.k_proj.weight",         "attn_k.weight",      {Dim::kKv, Dim::kEmbd}, Op::kRopeK},
    {"self_attn.v_proj.weight",         "attn_v.weight",      {Dim::kKv, Dim::kEmbd}},
    {"self_attn.o_proj.weight",         "attn_output.weight", {Dim::kEmbd, Dim::kQ}},
    {"post_attention_layernorm.weight", "ffn_norm.weight",    {Dim::kEmbd}},
    {"mlp.gate_proj.weight",            "ffn_gate.weight",    {Dim::kFf, Dim::kEmbd}},
    {"mlp.up_proj.weight",              "ffn_up.weight",      {Dim::kFf, Dim::kEmbd}},
    {"mlp.down_proj.weight",            "ffn_down.weight",    {Dim::kEmbd, Dim::kFf}},
};
const TensorRow kQkvBias[] = {
    {"self_attn.q_proj.bias", "attn_q.bias", {Dim::kQ}, Op::kRopeQ},
    {"self_attn.k_proj.bias", "attn_k.bias", {Dim::kKv}, Op::kRopeK},
    {"self_attn.v_proj.bias", "attn_v.bias", {Dim::kKv}},
};
const TensorRow kQkNorm[] = {
    {"self_attn.q_norm.weight", "attn_q_norm.weight", {Dim::kHeadDim}},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", {Dim::kHeadDim}},
};
const TensorRow kFinalNorm = {"model.norm.weight", "output_norm.weight", {Dim::kEmbd}};
// clang-format on

// Settings that change the arithmetic and have no form in these GGUF architectures are refused,
// not dropped.
void refuse_unsupported(const HfConfig& cfg, const DenseArch& a, int64_t n_ctx) {
    const std::string act = cfg.str("hidden_act", cfg.str("hidden_activation", "silu"));
    if (act != "silu") refuse("hidden_act '%s' (supported: silu)", act.c_str());
    // A window narrower than the context is in force unless use_sliding_window (Qwen) switches it off.
    if (cfg.has("sliding_window") && cfg.flag("use_sliding_window", true) && cfg.i64("sliding_window") < n_ctx)
        refuse("sliding_window %lld below the context of %lld", (long long)cfg.i64("sliding_window"), (long long)n_ctx);
    if (cfg.has("layer_types"))
        for (const std::string& t : cfg.strings("layer_types"))
            if (t != "full_attention") refuse("layer_types '%s' (supported: full_attention)", t.c_str());
    if (!a.qkv_bias && cfg.flag("attention_bias", false)) refuse("attention_bias is not supported by GGUF %s", a.arch);
    if (cfg.flag("mlp_bias", false)) refuse("mlp_bias is not supported by GGUF %s", a.arch);
}

void convert_dense(Conversion& c, const DenseArch& a) {
    const HfConfig& cfg = c.cfg();
    Dims& d = c.dims;
    d.n_vocab = cfg.i64("vocab_size");
    d.n_embd = cfg.i64("hidden_size");
    d.n_ff = cfg.i64("intermediate_size");
    d.n_head = cfg.i64("num_attention_heads");
    d.n_head_kv = cfg.i64("num_key_value_heads", d.n_head);
    const int64_t n_layer = cfg.i64("num_hidden_layers");
    const int64_t n_ctx = cfg.i64("max_position_embeddings");
    const bool explicit_head_dim = cfg.has("head_dim");
    d.head_dim = explicit_head_dim ? cfg.i64("head_dim") : (d.n_head > 0 ? d.n_embd / d.n_head : 0);
    if (d.n_head <= 0 || d.n_head_kv <= 0 || d.n_head % d.n_head_kv != 0 || d.head_dim <= 0 || d.head_dim % 2 != 0)
        throw_error(ErrorCode::kInvalidFile, "config.json: bad head counts (%lld heads, %lld kv heads, head_dim %lld)",
                    (long long)d.n_head, (long long)d.n_head_kv, (long long)d.head_dim);
    // GGUF granite has no key_length: its head size is always n_embd / n_head.
    if (a.granite_scales && explicit_head_dim && d.head_dim * d.n_head != d.n_embd)
        refuse("head_dim %lld differs from hidden_size / num_attention_heads; GGUF granite cannot hold it",
               (long long)d.head_dim);
    refuse_unsupported(cfg, a, n_ctx);
    const Rope rope = read_rope(cfg);
    if (rope.type == "llama3" && !a.rope_freqs) refuse("rope type 'llama3' has no GGUF %s form", a.arch);

    c.set_arch(a.arch);
    c.norm_rope = a.norm_rope;
    c.u32("block_count", n_layer);
    c.u32("context_length", n_ctx);
    c.u32("embedding_length", d.n_embd);
    c.u32("feed_forward_length", d.n_ff);
    c.u32("attention.head_count", d.n_head);
    c.u32("attention.head_count_kv", d.n_head_kv);
    c.f32("rope.freq_base", rope.theta);
    c.f32("attention.layer_norm_rms_epsilon", cfg.f32("rms_norm_eps"));
    if (explicit_head_dim && !a.granite_scales) {
        c.u32("attention.key_length", d.head_dim);
        c.u32("attention.value_length", d.head_dim);
    }
    if (a.llama_keys) {
        c.u32("vocab_size", d.n_vocab);
        c.u32("rope.dimension_count", d.head_dim);
    }
    if (rope.type == "linear") {
        c.str("rope.scaling.type", "linear");
        c.f32("rope.scaling.factor", rope.factor);
    }
    if (a.granite_scales) {
        // transformers' names are multipliers; GGUF's are scales of the same meaning.
        if (cfg.has("attention_multiplier")) c.f32("attention.scale", cfg.f32("attention_multiplier"));
        c.f32("embedding_scale", cfg.f32("embedding_multiplier", 1.0f));
        c.f32("residual_scale", cfg.f32("residual_multiplier", 1.0f));
        c.f32("logit_scale", cfg.f32("logits_scaling", 1.0f));
    }

    c.put_embedding_and_output(cfg.flag("tie_word_embeddings", false));
    for (int64_t il = 0; il < n_layer; ++il) {
        c.put(kLayer, il);
        if (a.qkv_bias) c.put(kQkvBias, il);
        if (a.qk_norm) c.put(kQkNorm, il);
    }
    c.put(kFinalNorm);
    if (rope.type == "llama3") c.add_f32("rope_freqs.weight", llama3_rope_factors(rope, d.head_dim));
}

}  // namespace

void convert_llama(Conversion& c) { convert_dense(c, kLlama); }
void convert_qwen2(Conversion& c) { convert_dense(c, kQwen2); }
void convert_qwen3(Conversion& c) { convert_dense(c, kQwen3); }
void convert_granite(Conversion& c) { convert_dense(c, kGranite); }

}  // namespace cera::convert
