// Granite (3.x dense): the Llama block (RoPE NORM) with four scalars:
// granite.embedding_scale multiplies the embeddings, granite.residual_scale each
// branch before the residual add, granite.attention.scale replaces
// 1/sqrt(head_dim), and granite.logit_scale (required) divides the logits.
#include "core/check.h"
#include "models/blocks/transformer.h"

namespace cera {

std::unique_ptr<Architecture> make_granite(LoadContext& ctx) {
    DenseOptions o;
    o.rope = RopeMode::kNorm;
    o.scales.embedding = ctx.hp.f32("embedding_scale", 1.0f);
    o.scales.residual = ctx.hp.f32("residual_scale", 1.0f);
    o.scales.attention = ctx.hp.f32("attention.scale", 0.0f);
    o.scales.logit = ctx.hp.f32("logit_scale");
    if (!(o.scales.logit > 0.0f))
        throw_error(ErrorCode::kInvalidFile, "%s = %g: must be positive", ctx.hp.key("logit_scale").c_str(),
                    double(o.scales.logit));
    return make_dense_transformer(ctx, o);
}

}  // namespace cera
