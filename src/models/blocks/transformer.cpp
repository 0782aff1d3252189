#include "models/blocks/transformer.h"

#include <cmath>

#include "core/check.h"
#include "models/blocks/ffn.h"

namespace cera {
namespace {

// (a) hyperparameters
struct DenseConfig {
    int64_t n_embd = 0;     // embedding_length
    int64_t n_layer = 0;    // block_count
    int64_t n_ff = 0;       // feed_forward_length
    int64_t n_head = 0;     // attention.head_count
    int64_t n_head_kv = 0;  // attention.head_count_kv (one value for every layer)
    int64_t head_dim = 0;   // attention.key_length, else n_embd / n_head
    int64_t n_rot = 0;      // rope.dimension_count, else head_dim
    float eps = 1e-5f;
    float rope_base = 10000.0f;
    float rope_scale = 1.0f;  // 1 / rope.scaling.factor for linear scaling
};

DenseConfig read_config(const HParams& hp) {
    DenseConfig c;
    c.n_embd = hp.u32("embedding_length");
    c.n_layer = hp.u32("block_count");
    c.n_ff = hp.u32("feed_forward_length");
    c.n_head = hp.u32("attention.head_count");
    c.eps = hp.f32("attention.layer_norm_rms_epsilon");
    c.rope_base = hp.f32("rope.freq_base", 10000.0f);
    hp.require(c.n_embd > 0, "embedding_length", c.n_embd, "must be positive");
    hp.require(c.n_layer > 0, "block_count", c.n_layer, "must be positive");
    hp.require(c.n_ff > 0, "feed_forward_length", c.n_ff, "must be positive");
    hp.require(c.n_head > 0, "attention.head_count", c.n_head, "must be positive");
    std::vector<int64_t> kv = hp.has("attention.head_count_kv") ? hp.per_layer("attention.head_count_kv", c.n_layer)
                                                                : std::vector<int64_t>(size_t(c.n_layer), c.n_head);
    c.n_head_kv = kv[0];
    for (int64_t v : kv)
        hp.require(v == c.n_head_kv, "attention.head_count_kv", v, "differs between layers (unsupported here)");
    hp.require(c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0, "attention.head_count_kv", c.n_head_kv,
               "must be positive and divide attention.head_count");
    if (hp.has("attention.key_length")) {
        c.head_dim = hp.u32("attention.key_length");
        const int64_t vl = hp.u32("attention.value_length", c.head_dim);
        hp.require(vl == c.head_dim, "attention.value_length", vl, "must equal attention.key_length");
    } else {
        hp.require(c.n_embd % c.n_head == 0, "embedding_length", c.n_embd,
                   "not divisible by attention.head_count (and no attention.key_length)");
        c.head_dim = c.n_embd / c.n_head;
    }
    hp.require(c.head_dim > 0 && c.head_dim % 2 == 0, "attention.key_length", c.head_dim, "must be positive and even");
    c.n_rot = hp.u32("rope.dimension_count", c.head_dim);
    hp.require(c.n_rot > 0 && c.n_rot <= c.head_dim && c.n_rot % 2 == 0, "rope.dimension_count", c.n_rot,
               "must be even and at most the head size");
    if (hp.file().get_string(hp.key("rope.scaling.type"), "none") == "linear") {
        const float f = hp.f32("rope.scaling.factor");
        if (!(f > 0))
            throw_error(ErrorCode::kInvalidFile, "%s = %g: must be positive", hp.key("rope.scaling.factor").c_str(),
                        double(f));
        c.rope_scale = 1.0f / f;
    }
    return c;
}

// (b) weights
struct DenseLayer {
    Tensor attn_norm;  // f32 [n_embd]
    Tensor ffn_norm;   // f32 [n_embd]
    AttentionWeights attn;
    SwigluWeights ffn;
};

class DenseTransformer final : public Architecture {
 public:
    DenseTransformer(LoadContext& ctx, const DenseOptions& opts) : scales_(opts.scales) {
        cfg_ = read_config(ctx.hp);
        const DenseConfig& c = cfg_;
        load_common(ctx, *this, c.n_embd, c.n_layer, "output_norm.weight", c.eps);
        head.embedding_scale = scales_.embedding;
        head.logit_scale = scales_.logit;

        attn_.shape = {c.n_embd, c.n_head, c.n_head_kv, c.head_dim, opts.bias, opts.qk_norm};
        attn_.rope.mode = opts.rope;
        attn_.rope.n_rot = int(c.n_rot);
        attn_.rope.freq_base = c.rope_base;
        attn_.rope.freq_scale = c.rope_scale;
        attn_.rope.freq_factors = ctx.wl.f32_optional("rope_freqs.weight", {c.n_rot / 2});
        attn_.attn_scale = scales_.attention != 0.0f ? scales_.attention : 1.0f / std::sqrt(float(c.head_dim));
        attn_.norm_eps = c.eps;

        layers_.resize(size_t(c.n_layer));
        layer_begin = ctx.wl.shard().layer_begin(c.n_layer), layer_end = ctx.wl.shard().layer_end(c.n_layer);
        for (int64_t il = layer_begin; il < layer_end; ++il) {
            DenseLayer& l = layers_[size_t(il)];
            l.attn_norm = ctx.wl.f32(blk(il, "attn_norm.weight"), {c.n_embd});
            l.ffn_norm = ctx.wl.f32(blk(il, "ffn_norm.weight"), {c.n_embd});
            l.attn = load_attention(ctx.wl, il, attn_.shape);
            l.ffn = load_swiglu(ctx.wl, il, c.n_embd, c.n_ff);
        }
        attn_.shape = shard_shape(attn_.shape, ctx.wl.shard());  // what this rank computes
        state.assign(size_t(c.n_layer), LayerStateSpec{});
        for (int64_t il = layer_begin; il < layer_end; ++il)
            state[size_t(il)] = LayerStateSpec{attn_.shape.kv_width(), 0, 0, c.head_dim, attn_.rope};
        info.n_attn_layers = c.n_layer;
        scratch.q_width = attn_.shape.q_width();
        scratch.kv_width = attn_.shape.kv_width();
        scratch.wide = c.n_ff / ctx.wl.shard().split();
    }

    // (c) the layer loop
    void forward(Step& s) const override {
        Backend& be = *s.be;
        s.stage_in();
        for (size_t il = size_t(layer_begin); il < size_t(layer_end); ++il) {
            const DenseLayer& l = layers_[il];
            be.rms_norm(s.x, l.attn_norm, cfg_.eps, s.h);
            attention_block(s, l.attn, attn_, s.cache[il], s.h, s.y);
            be.add(s.x, s.y, scales_.residual, s.x);
            if (il + 1 == layers_.size() && !s.keep_output_rows()) break;
            be.rms_norm(s.x, l.ffn_norm, cfg_.eps, s.h);
            swiglu_block(s, l.ffn, s.h, s.y);
            be.add(s.x, s.y, scales_.residual, s.x);
        }
        s.stage_out();
    }

 private:
    DenseConfig cfg_;
    DenseScales scales_;
    AttentionConfig attn_;
    std::vector<DenseLayer> layers_;
};

}  // namespace

std::unique_ptr<Architecture> make_dense_transformer(LoadContext& ctx, const DenseOptions& opts) {
    return std::make_unique<DenseTransformer>(ctx, opts);
}

}  // namespace cera
