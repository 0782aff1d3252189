// Grouped-query causal self-attention with optional q/k/v biases (qwen2) and
// per-head q/k RMSNorm (qwen3, lfm2), RoPE, and a KV cache per layer.
#pragma once
#include <cstdint>

#include "models/arch.h"

namespace cera {

enum class QkvBias { kNone, kPresent };  // q, k and v projections carry biases
enum class QkNorm { kNone, kPerHead };   // RMSNorm of each q and k head before RoPE

struct AttentionShape {
    int64_t n_embd = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    QkvBias bias = QkvBias::kNone;
    QkNorm qk_norm = QkNorm::kNone;
    int64_t q_width() const { return n_head * head_dim; }
    int64_t kv_width() const { return n_head_kv * head_dim; }
};

struct AttentionWeights {
    Tensor wq;              // [n_head * head_dim, n_embd]
    Tensor wk, wv;          // [n_head_kv * head_dim, n_embd]
    Tensor wo;              // [n_embd, n_head * head_dim]
    Tensor bq;              // f32 [n_head * head_dim] or empty
    Tensor bk, bv;          // f32 [n_head_kv * head_dim] or empty
    Tensor q_norm, k_norm;  // f32 [head_dim] or empty
};

struct AttentionConfig {
    AttentionShape shape;
    RopeParams rope;
    float attn_scale = 0.0f;  // softmax scale
    float norm_eps = 1e-6f;   // eps of the q/k norms
    int sliding_window = 0;
};

// Reads blk.<il>.attn_{q,k,v,output}.weight (+ biases, + q/k norms) with their shapes checked (s: the
// whole layer's); a split loader takes its rank's heads of q, k and v and the matching columns of the
// output projection.
AttentionWeights load_attention(WeightLoader& wl, int64_t il, const AttentionShape& s);
// A rank's heads of s: kUnsupported unless the query and KV heads both divide among the ranks.
AttentionShape shard_shape(const AttentionShape& s, const Shard& shard);

// y = Wo · Attention(RoPE(norm(Wq h)), RoPE(norm(Wk h)), Wv h); stores this batch's k and v in the cache.
// c.shape is this rank's (shard_shape); y is summed over the ranks.
//   h, y: f32 [n_tokens, n_embd]
void attention_block(const Step& s, const AttentionWeights& w, const AttentionConfig& c, const LayerCache& cache,
                     const Tensor& h, const Tensor& y);

}  // namespace cera
