// Feed-forward blocks: the SwiGLU MLP and a mixture of SwiGLU experts with a
// top-k router (LFM2-MoE: sigmoid gating, selection bias, renormalised weights).
#pragma once
#include <cstdint>

#include "models/arch.h"

namespace cera {

struct SwigluWeights {
    Tensor gate;  // [n_ff, n_embd]  (W1)
    Tensor up;    // [n_ff, n_embd]  (W3)
    Tensor down;  // [n_embd, n_ff]  (W2)
};

// Reads blk.<il>.ffn_{gate,up,down}.weight; a split loader takes its rank's rows of gate and up and the
// matching columns of down (so for each expert of load_moe).
SwigluWeights load_swiglu(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t n_ff);

// y = W2 (silu(W1 h) ⊙ W3 h), summed over the ranks;  h, y: f32 [n_tokens, n_embd]
void swiglu_block(const Step& s, const SwigluWeights& w, const Tensor& h, const Tensor& y);

struct MoeWeights {
    Tensor router;      // [n_expert, n_embd]                 ffn_gate_inp
    Tensor gate_exps;   // [n_expert, n_ff_exp, n_embd]
    Tensor up_exps;     // [n_expert, n_ff_exp, n_embd]
    Tensor down_exps;   // [n_expert, n_embd, n_ff_exp]
    Tensor probs_bias;  // f32 [n_expert] or empty             exp_probs_b (expert choice only)
};

// Reads blk.<il>.ffn_gate_inp.weight, ffn_{gate,up,down}_exps.weight and the optional exp_probs_b.bias.
MoeWeights load_moe(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t n_ff_exp, int64_t n_expert);

// y = sum over the k chosen experts e of weight_e * SwiGLU_e(h);  h, y: f32 [n_tokens, n_embd]
void moe_block(const Step& s, const MoeWeights& w, const MoeParams& p, const Tensor& h, const Tensor& y);

}  // namespace cera
