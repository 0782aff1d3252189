// The dense pre-norm transformer shared by llama, qwen2, qwen3 and granite:
//   x = token_embd[ids] * embedding_scale
//   per layer:  x += residual_scale * Wo·Attn(RoPE(Wq n), RoPE(Wk n), Wv n),   n = RMSNorm(x) * attn_norm
//               x += residual_scale * W2(silu(W1 f) ⊙ W3 f),                      f = RMSNorm(x) * ffn_norm
//   logits = output · (RMSNorm(x) * output_norm) / logit_scale
// The architectures differ only in the typed options below.
#pragma once
#include <memory>

#include "models/arch.h"
#include "models/blocks/attention.h"

namespace cera {

// Granite's four scalars; the defaults are the plain transformer.
struct DenseScales {
    float embedding = 1.0f;  // multiplies the token embeddings
    float residual = 1.0f;   // multiplies each branch before it joins the residual
    float attention = 0.0f;  // softmax scale; 0 = 1/sqrt(head_dim)
    float logit = 1.0f;      // divides the logits
};

struct DenseOptions {
    RopeMode rope = RopeMode::kNorm;
    QkvBias bias = QkvBias::kNone;
    QkNorm qk_norm = QkNorm::kNone;
    DenseScales scales;
};

// Reads the common <arch>.* keys and the tensors, checking every shape.
std::unique_ptr<Architecture> make_dense_transformer(LoadContext& ctx, const DenseOptions& opts);

}  // namespace cera
