// LFM2-MoE: the LFM2 hybrid stack whose FFNs after the first
// leading_dense_block_count layers are mixtures of SwiGLU experts. The router is
// sigmoid(ffn_gate_inp · f); the top-k experts are chosen by sigmoid + exp_probs_b
// (the bias only affects the choice), and weighted by their sigmoid values
// renormalised to sum to 1.
#include "core/check.h"
#include "models/lfm2.h"

namespace cera {

std::unique_ptr<Architecture> make_lfm2moe(LoadContext& ctx) {
    const HParams& hp = ctx.hp;
    Lfm2MoeConfig m;
    m.n_expert = hp.u32("expert_count");
    m.n_expert_used = hp.u32("expert_used_count");
    m.n_ff_exp = hp.u32("expert_feed_forward_length");
    m.n_dense_lead = hp.u32("leading_dense_block_count", 0);
    const int64_t gating = hp.u32("expert_gating_func");
    m.normalize = hp.file().get_bool(hp.key("expert_weights_norm"), true);
    m.weights_scale = hp.f32("expert_weights_scale", 1.0f);
    hp.require(m.n_expert > 0, "expert_count", m.n_expert, "must be positive");
    hp.require(m.n_expert_used > 0 && m.n_expert_used <= m.n_expert, "expert_used_count", m.n_expert_used,
               "must be in [1, expert_count]");
    hp.require(m.n_ff_exp > 0, "expert_feed_forward_length", m.n_ff_exp, "must be positive");
    hp.require(m.n_dense_lead >= 0, "leading_dense_block_count", m.n_dense_lead, "must not be negative");
    hp.require(gating == 1 || gating == 2, "expert_gating_func", gating, "expected 1 (softmax) or 2 (sigmoid)");
    m.gating = gating == 2 ? MoeGating::kSigmoid : MoeGating::kSoftmax;
    return make_lfm2_hybrid(ctx, &m);
}

}  // namespace cera
