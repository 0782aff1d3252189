// LFM2 (Liquid foundation model 2): a hybrid of gated short-convolution layers
// and grouped-query attention layers, each followed by a SwiGLU FFN.
//   x = token_embd[ids]
//   per layer:  h = RMSNorm(x) * attn_norm                     (the "operator norm")
//               x += ShortConv(h)          when head_count_kv[il] == 0
//               x += Wo·Attn(RoPE_neox(qnorm(Wq h)), RoPE_neox(knorm(Wk h)), Wv h)   otherwise
//               x += FFN(RMSNorm(x) * ffn_norm)             SwiGLU, or MoE (lfm2moe)
//   logits = token_embd · (RMSNorm(x) * token_embd_norm)      (tied unless output.weight exists)
#include "models/lfm2.h"

#include <cmath>

#include "core/check.h"
#include "models/blocks/attention.h"
#include "models/blocks/ffn.h"
#include "models/blocks/shortconv.h"

namespace cera {
namespace {

// (a) hyperparameters
struct Lfm2Config {
    int64_t n_embd = 0;              // embedding_length
    int64_t n_layer = 0;             // block_count
    int64_t n_ff = 0;                // feed_forward_length (dense FFN)
    int64_t n_head = 0;              // attention.head_count
    std::vector<int64_t> n_head_kv;  // [n_layer] attention.head_count_kv; 0 = short-conv layer
    int64_t head_dim = 0;            // n_embd / n_head
    int64_t l_cache = 0;             // shortconv.l_cache: conv kernel length L
    int sliding_window = 0;
    float eps = 1e-5f;
    float rope_base = 10000.0f;
};

Lfm2Config read_config(const HParams& hp) {
    Lfm2Config c;
    c.n_embd = hp.u32("embedding_length");
    c.n_layer = hp.u32("block_count");
    c.n_ff = hp.u32("feed_forward_length");
    c.n_head = hp.u32("attention.head_count");
    c.l_cache = hp.u32("shortconv.l_cache");
    c.eps = hp.f32("attention.layer_norm_rms_epsilon");
    c.rope_base = hp.f32("rope.freq_base", 10000.0f);
    c.sliding_window = int(hp.u32("attention.sliding_window", 0));
    hp.require(c.n_embd > 0, "embedding_length", c.n_embd, "must be positive");
    hp.require(c.n_layer > 0, "block_count", c.n_layer, "must be positive");
    hp.require(c.n_head > 0, "attention.head_count", c.n_head, "must be positive");
    hp.require(c.n_embd % c.n_head == 0, "embedding_length", c.n_embd, "not divisible by attention.head_count");
    c.head_dim = c.n_embd / c.n_head;
    hp.require(c.head_dim % 2 == 0, "attention.head_count", c.n_head, "gives an odd head size");
    hp.require(c.l_cache >= 2, "shortconv.l_cache", c.l_cache, "must be at least 2");
    c.n_head_kv = hp.per_layer("attention.head_count_kv", c.n_layer);
    for (int64_t v : c.n_head_kv)
        hp.require(v >= 0 && (v == 0 || c.n_head % v == 0), "attention.head_count_kv", v,
                   "must be 0 (short-conv layer) or divide attention.head_count");
    if (!hp.file().get_bool(hp.key("attention.causal"), true))
        throw_error(ErrorCode::kUnsupported, "%s = false: non-causal LFM2 is not supported",
                    hp.key("attention.causal").c_str());
    return c;
}

// (b) weights
enum class MixerKind { kShortConv, kAttention };
enum class FfnKind { kDense, kMoe };

struct Lfm2Layer {
    MixerKind mixer = MixerKind::kShortConv;
    FfnKind ffn_kind = FfnKind::kDense;
    Tensor attn_norm;  // f32 [n_embd] operator norm (conv and attention layers)
    Tensor ffn_norm;   // f32 [n_embd]
    ShortConvWeights conv;
    AttentionWeights attn;
    AttentionConfig attn_cfg;
    SwigluWeights ffn;
    MoeWeights moe;
};

class Lfm2 final : public Architecture {
 public:
    Lfm2(LoadContext& ctx, const Lfm2MoeConfig* moe) {
        cfg_ = read_config(ctx.hp);
        const Lfm2Config& c = cfg_;
        load_common(ctx, *this, c.n_embd, c.n_layer, "token_embd_norm.weight", c.eps);
        if (moe) {
            moe_params_.n_expert = int(moe->n_expert);
            moe_params_.n_expert_used = int(moe->n_expert_used);
            moe_params_.gating = moe->gating;
            moe_params_.normalize_weights = moe->normalize;
            moe_params_.weights_scale = moe->weights_scale;
        }
        const Shard& sh = ctx.wl.shard();
        scratch.q_width = c.n_embd / sh.split();  // a rank's query heads, or its conv channels
        scratch.wide = std::max(c.n_ff, 3 * c.n_embd) / sh.split();
        layers_.resize(size_t(c.n_layer));
        state.resize(size_t(c.n_layer));
        layer_begin = sh.layer_begin(c.n_layer), layer_end = sh.layer_end(c.n_layer);
        for (int64_t il = 0; il < c.n_layer; ++il) {
            Lfm2Layer& l = layers_[size_t(il)];
            const bool mine = il >= layer_begin && il < layer_end;  // a pipeline stage loads its own layers
            if (c.n_head_kv[size_t(il)] == 0)
                ++info.n_conv_layers;
            else
                ++info.n_attn_layers;
            if (!mine) continue;
            l.attn_norm = ctx.wl.f32(blk(il, "attn_norm.weight"), {c.n_embd});
            l.ffn_norm = ctx.wl.f32(blk(il, "ffn_norm.weight"), {c.n_embd});
            const int64_t n_kv = c.n_head_kv[size_t(il)];
            if (n_kv == 0) {
                l.mixer = MixerKind::kShortConv;
                l.conv = load_short_conv(ctx.wl, il, c.n_embd, c.l_cache);
                state[size_t(il)] = {0, l.conv.conv.ne[1], c.l_cache - 1};
            } else {
                l.mixer = MixerKind::kAttention;
                AttentionConfig& a = l.attn_cfg;
                a.shape = {c.n_embd, c.n_head, n_kv, c.head_dim, QkvBias::kNone, QkNorm::kPerHead};
                a.rope.mode = RopeMode::kNeox;
                a.rope.n_rot = int(c.head_dim);
                a.rope.freq_base = c.rope_base;
                a.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
                a.norm_eps = c.eps;
                a.sliding_window = c.sliding_window;
                l.attn = load_attention(ctx.wl, il, a.shape);
                a.shape = shard_shape(a.shape, sh);
                state[size_t(il)] = {a.shape.kv_width(), 0, 0, c.head_dim, a.rope};
                scratch.kv_width = std::max(scratch.kv_width, a.shape.kv_width());
            }
            if (moe && il >= moe->n_dense_lead) {
                l.ffn_kind = FfnKind::kMoe;
                l.moe = load_moe(ctx.wl, il, c.n_embd, moe->n_ff_exp, moe->n_expert);
                scratch.wide = std::max(scratch.wide, moe->n_ff_exp / sh.split());
                scratch.n_expert = moe->n_expert;
                scratch.n_expert_used = moe->n_expert_used;
            } else {
                l.ffn_kind = FfnKind::kDense;
                l.ffn = load_swiglu(ctx.wl, il, c.n_embd, c.n_ff);
            }
        }
    }

    // (c) the layer loop
    void forward(Step& s) const override {
        Backend& be = *s.be;
        s.stage_in();
        for (size_t il = size_t(layer_begin); il < size_t(layer_end); ++il) {
            const Lfm2Layer& l = layers_[il];
            be.rms_norm(s.x, l.attn_norm, cfg_.eps, s.h);
            if (l.mixer == MixerKind::kShortConv)
                short_conv_block(s, l.conv, il, s.h, s.y);
            else
                attention_block(s, l.attn, l.attn_cfg, s.cache[il], s.h, s.y);
            be.add(s.x, s.y, 1.0f, s.x);
            if (il + 1 == layers_.size() && !s.keep_output_rows()) break;
            be.rms_norm(s.x, l.ffn_norm, cfg_.eps, s.h);
            if (l.ffn_kind == FfnKind::kDense)
                swiglu_block(s, l.ffn, s.h, s.y);
            else
                moe_block(s, l.moe, moe_params_, s.h, s.y);
            be.add(s.x, s.y, 1.0f, s.x);
        }
        s.stage_out();
    }

 private:
    Lfm2Config cfg_;
    MoeParams moe_params_;
    std::vector<Lfm2Layer> layers_;
};

}  // namespace

std::unique_ptr<Architecture> make_lfm2_hybrid(LoadContext& ctx, const Lfm2MoeConfig* moe) {
    return std::make_unique<Lfm2>(ctx, moe);
}

std::unique_ptr<Architecture> make_lfm2(LoadContext& ctx) { return make_lfm2_hybrid(ctx, nullptr); }

}  // namespace cera
