#include "models/blocks/ffn.h"

namespace cera {

SwigluWeights load_swiglu(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t n_ff) {
    SwigluWeights w;
    w.gate = wl.matrix(blk(il, "ffn_gate.weight"), {n_embd, n_ff}, Split::kRows);
    w.up = wl.matrix(blk(il, "ffn_up.weight"), {n_embd, n_ff}, Split::kRows);
    w.down = wl.matrix(blk(il, "ffn_down.weight"), {n_ff, n_embd}, Split::kCols);
    return w;
}

void swiglu_block(const Step& s, const SwigluWeights& w, const Tensor& h, const Tensor& y) {
    const int64_t n_ff = w.gate.ne[1];
    const Tensor g = Step::cols(s.wide0, n_ff);
    const Tensor u = Step::cols(s.wide1, n_ff);
    s.linear(w.gate, h, Tensor{}, g);
    s.linear(w.up, h, Tensor{}, u);
    s.be->swiglu(g, u, g);
    s.linear(w.down, g, Tensor{}, y);
    s.all_reduce(y);
}

MoeWeights load_moe(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t n_ff_exp, int64_t n_expert) {
    MoeWeights w;
    w.router = wl.matrix(blk(il, "ffn_gate_inp.weight"), {n_embd, n_expert});
    w.gate_exps = wl.matrix(blk(il, "ffn_gate_exps.weight"), {n_embd, n_ff_exp, n_expert}, Split::kRows);
    w.up_exps = wl.matrix(blk(il, "ffn_up_exps.weight"), {n_embd, n_ff_exp, n_expert}, Split::kRows);
    w.down_exps = wl.matrix(blk(il, "ffn_down_exps.weight"), {n_ff_exp, n_embd, n_expert}, Split::kCols);
    w.probs_bias = wl.f32_optional(blk(il, "exp_probs_b.bias"), {n_expert});
    return w;
}

void moe_block(const Step& s, const MoeWeights& w, const MoeParams& p, const Tensor& h, const Tensor& y) {
    const Tensor router = s.router.reshaped(p.n_expert, s.n_tokens);
    const Tensor ids = s.moe_ids.reshaped(p.n_expert_used, s.n_tokens);
    const Tensor wts = s.moe_w.reshaped(p.n_expert_used, s.n_tokens);
    s.be->matmul(w.router, h, Tensor{}, router);
    s.be->moe_route(router, w.probs_bias, p, ids, wts);
    s.experts(w.gate_exps, w.up_exps, w.down_exps, h, ids, wts, y);
    s.all_reduce(y);
}

}  // namespace cera
