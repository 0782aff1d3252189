// LFM2 and LFM2-MoE share one hybrid stack (lfm2.cpp); lfm2moe.cpp adds the
// mixture-of-experts FFN after the leading dense layers.
#pragma once
#include <cstdint>
#include <memory>

#include "models/arch.h"

namespace cera {

struct Lfm2MoeConfig {
    int64_t n_expert = 0;       // expert_count
    int64_t n_expert_used = 0;  // expert_used_count (k)
    int64_t n_ff_exp = 0;       // expert_feed_forward_length
    int64_t n_dense_lead = 0;   // leading_dense_block_count: layers 0..n-1 keep a dense FFN
    MoeGating gating = MoeGating::kSigmoid;
    bool normalize = true;       // expert_weights_norm
    float weights_scale = 1.0f;  // expert_weights_scale
};

// moe == nullptr: plain LFM2 (every layer has a dense SwiGLU FFN).
std::unique_ptr<Architecture> make_lfm2_hybrid(LoadContext& ctx, const Lfm2MoeConfig* moe);

}  // namespace cera
