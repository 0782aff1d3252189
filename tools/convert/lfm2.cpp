// LFM2 and LFM2-MoE: a stack of gated short-convolution layers and grouped-query attention layers
// (q/k RMSNorm, RoPE NEOX, so no row permutation), each followed by a SwiGLU FFN; in LFM2-MoE the
// FFNs after the first num_dense_layers are mixtures of experts with a sigmoid router and an
// expert-choice bias. GGUF marks a short-conv layer by head_count_kv 0 (a per-layer i32 array).
#include "convert/arch.h"
#include "core/check.h"

namespace cera::convert {
namespace {

// clang-format off
// Per layer, under model.layers.<i>. / blk.<i>.
const TensorRow kNorms[] = {
    {"operator_norm.weight", "attn_norm.weight", {Dim::kEmbd}},
    {"ffn_norm.weight",      "ffn_norm.weight",  {Dim::kEmbd}},
};
// The conv kernel [n_embd, 1, L] loses its middle dimension: GGUF holds it as ne {L, n_embd}.
const TensorRow kShortConv[] = {
    {"conv.in_proj.weight",  "shortconv.in_proj.weight",  {Dim::kConvIn, Dim::kEmbd}},
    {"conv.conv.weight",     "shortconv.conv.weight",     {Dim::kEmbd, Dim::kOne, Dim::kLCache}, Op::kCopy, true},
    {"conv.out_proj.weight", "shortconv.out_proj.weight", {Dim::kEmbd, Dim::kEmbd}},
};
const TensorRow kAttention[] = {
    {"self_attn.q_proj.weight",      "attn_q.weight",      {Dim::kQ, Dim::kEmbd}},
    {"self_attn.k_proj.weight",      "attn_k.weight",      {Dim::kKv, Dim::kEmbd}},
    {"self_attn.v_proj.weight",      "attn_v.weight",      {Dim::kKv, Dim::kEmbd}},
    {"self_attn.out_proj.weight",    "attn_output.weight", {Dim::kEmbd, Dim::kQ}},
    {"self_attn.q_layernorm.weight", "attn_q_norm.weight", {Dim::kHeadDim}},
    {"self_attn.k_layernorm.weight", "attn_k_norm.weight", {Dim::kHeadDim}},
};
const TensorRow kDenseFfn[] = {
    {"feed_forward.w1.weight", "ffn_gate.weight", {Dim::kFf, Dim::kEmbd}},
    {"feed_forward.w3.weight", "ffn_up.weight",   {Dim::kFf, Dim::kEmbd}},
    {"feed_forward.w2.weight", "ffn_down.weight", {Dim::kEmbd, Dim::kFf}},
};
// The experts, one HF tensor each, stack into one 3-D GGUF tensor per projection.
const TensorRow kMoeFfn[] = {
    {"feed_forward.gate.weight",           "ffn_gate_inp.weight",  {Dim::kExpert, Dim::kEmbd}, Op::kCopy, true},
    {"feed_forward.experts.{x}.w1.weight", "ffn_gate_exps.weight", {Dim::kFfExp, Dim::kEmbd}, Op::kExperts},
    {"feed_forward.experts.{x}.w3.weight", "ffn_up_exps.weight",   {Dim::kFfExp, Dim::kEmbd}, Op::kExperts},
    {"feed_forward.experts.{x}.w2.weight", "ffn_down_exps.weight", {Dim::kEmbd, Dim::kFfExp}, Op::kExperts},
};
const TensorRow kExpertBias = {"feed_forward.expert_bias", "exp_probs_b.bias", {Dim::kExpert}};
// LFM2's final norm (applied after the last layer despite its name).
const TensorRow kFinalNorm = {"model.embedding_norm.weight", "token_embd_norm.weight", {Dim::kEmbd}};
// clang-format on

// true for an attention layer, false for a short-conv one: layer_types, or the older full_attn_idxs.
std::vector<bool> attention_layers(const HfConfig& cfg, int64_t n_layer) {
    std::vector<bool> attn(size_t(n_layer), false);
    if (cfg.has("layer_types")) {
        const std::vector<std::string> types = cfg.strings("layer_types");
        if (int64_t(types.size()) != n_layer)
            throw_error(ErrorCode::kInvalidFile, "config.json: layer_types has %zu entries for %lld layers",
                        types.size(), (long long)n_layer);
        for (size_t i = 0; i < types.size(); ++i) {
            if (types[i] != "conv" && types[i] != "full_attention")
                refuse("layer_types '%s' (supported: conv, full_attention)", types[i].c_str());
            attn[i] = types[i] == "full_attention";
        }
    } else {
        for (int64_t i : cfg.ints("full_attn_idxs")) {
            if (i < 0 || i >= n_layer)
                throw_error(ErrorCode::kInvalidFile, "config.json: full_attn_idxs has layer %lld of %lld", (long long)i,
                            (long long)n_layer);
            attn[size_t(i)] = true;
        }
    }
    return attn;
}

// LFM2's FFN width: with block_auto_adjust_ff_dim, 2/3 of the configured size, times
// block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of.
int64_t lfm2_ff_dim(const HfConfig& cfg) {
    int64_t ff = cfg.has("block_ff_dim") ? cfg.i64("block_ff_dim") : cfg.i64("intermediate_size");
    if (!cfg.flag("block_auto_adjust_ff_dim", false)) return ff;
    ff = int64_t(2.0 * double(ff) / 3.0);
    if (cfg.has("block_ffn_dim_multiplier")) ff = int64_t(double(cfg.f32("block_ffn_dim_multiplier")) * double(ff));
    const int64_t multiple = cfg.i64("block_multiple_of", 1);
    if (multiple <= 0) throw_error(ErrorCode::kInvalidFile, "config.json: block_multiple_of must be positive");
    return multiple * ((ff + multiple - 1) / multiple);
}

void convert_hybrid(Conversion& c, const char* arch, bool moe) {
    const HfConfig& cfg = c.cfg();
    Dims& d = c.dims;
    d.n_vocab = cfg.i64("vocab_size");
    d.n_embd = cfg.i64("hidden_size");
    d.n_head = cfg.i64("num_attention_heads");
    d.n_head_kv = cfg.i64("num_key_value_heads", d.n_head);
    d.l_cache = cfg.i64("conv_L_cache");
    const int64_t n_layer = cfg.i64("num_hidden_layers");
    const int64_t n_ctx = cfg.i64("max_position_embeddings");
    if (d.n_head <= 0 || d.n_embd % d.n_head != 0 || d.n_head_kv <= 0 || d.n_head % d.n_head_kv != 0)
        throw_error(ErrorCode::kInvalidFile, "config.json: bad head counts (%lld heads, %lld kv heads, hidden %lld)",
                    (long long)d.n_head, (long long)d.n_head_kv, (long long)d.n_embd);
    // GGUF LFM2 has no key_length: the head size is n_embd / n_head.
    d.head_dim = d.n_embd / d.n_head;
    if (cfg.has("head_dim") && cfg.i64("head_dim") != d.head_dim)
        refuse("head_dim %lld differs from hidden_size / num_attention_heads; GGUF %s cannot hold it",
               (long long)cfg.i64("head_dim"), arch);
    if (cfg.flag("conv_bias", false)) refuse("conv_bias is not supported by GGUF %s", arch);
    const Rope rope = read_rope(cfg);
    if (rope.type != "default") refuse("rope type '%s' has no GGUF %s form", rope.type.c_str(), arch);
    const std::vector<bool> attn = attention_layers(cfg, n_layer);

    int64_t n_dense = n_layer;
    bool expert_bias = false;
    if (moe) {
        d.n_ff = cfg.i64("intermediate_size");
        d.n_ff_exp = cfg.i64("moe_intermediate_size");
        d.n_expert = cfg.i64("num_experts");
        n_dense = cfg.i64("num_dense_layers", 0);
        const int64_t n_used = cfg.i64("num_experts_per_tok");
        if (d.n_expert <= 0 || n_used <= 0 || n_used > d.n_expert || n_dense < 0 || n_dense > n_layer)
            throw_error(ErrorCode::kInvalidFile, "config.json: bad experts (%lld, %lld used, %lld dense layers)",
                        (long long)d.n_expert, (long long)n_used, (long long)n_dense);
        // GGUF lfm2moe always renormalises the chosen experts' weights and never scales them.
        if (!cfg.flag("norm_topk_prob", true)) refuse("norm_topk_prob false has no GGUF %s form", arch);
        if (cfg.f32("routed_scaling_factor", 1.0f) != 1.0f)
            refuse("routed_scaling_factor %g has no GGUF %s form", cfg.f32("routed_scaling_factor"), arch);
        expert_bias = cfg.flag("use_expert_bias", false);
    } else {
        d.n_ff = lfm2_ff_dim(cfg);
    }

    std::vector<int32_t> head_count_kv(attn.size());
    for (size_t i = 0; i < attn.size(); ++i) head_count_kv[i] = attn[i] ? int32_t(d.n_head_kv) : 0;
    c.set_arch(arch);
    c.u32("block_count", n_layer);
    c.u32("context_length", n_ctx);
    c.u32("embedding_length", d.n_embd);
    c.u32("feed_forward_length", d.n_ff);
    c.u32("attention.head_count", d.n_head);
    c.i32s("attention.head_count_kv", head_count_kv);
    c.f32("rope.freq_base", rope.theta);
    c.f32("attention.layer_norm_rms_epsilon", cfg.f32("norm_eps"));
    if (moe) {
        c.u32("expert_count", d.n_expert);
        c.u32("expert_used_count", cfg.i64("num_experts_per_tok"));
        c.u32("expert_feed_forward_length", d.n_ff_exp);
        c.u32("leading_dense_block_count", n_dense);
        c.u32("expert_gating_func", 2);  // sigmoid
    }
    c.u32("vocab_size", d.n_vocab);
    c.u32("shortconv.l_cache", d.l_cache);

    c.put_embedding_and_output(cfg.flag("tie_word_embeddings", true));
    c.put(kFinalNorm);
    for (int64_t il = 0; il < n_layer; ++il) {
        c.put(attn[size_t(il)] ? std::span<const TensorRow>(kAttention) : std::span<const TensorRow>(kShortConv), il);
        c.put(kNorms, il);
        if (il < n_dense) {
            c.put(kDenseFfn, il);
        } else {
            c.put(kMoeFfn, il);
            if (expert_bias) c.put(kExpertBias, il);
        }
    }
}

}  // namespace

void convert_lfm2(Conversion& c) { convert_hybrid(c, "lfm2", /*moe=*/false); }
void convert_lfm2moe(Conversion& c) { convert_hybrid(c, "lfm2moe", /*moe=*/true); }

}  // namespace cera::convert
