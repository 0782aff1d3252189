// Qwen3: the dense transformer without biases, with a per-head RMSNorm of q and
// k (attn_q_norm, attn_k_norm) before RoPE NEOX; head_dim comes from
// qwen3.attention.key_length and may differ from n_embd / n_head.
#include "models/blocks/transformer.h"

namespace cera {

std::unique_ptr<Architecture> make_qwen3(LoadContext& ctx) {
    DenseOptions o;
    o.rope = RopeMode::kNeox;
    o.qk_norm = QkNorm::kPerHead;
    return make_dense_transformer(ctx, o);
}

}  // namespace cera
