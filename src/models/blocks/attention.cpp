#include "models/blocks/attention.h"

#include <string>

namespace cera {

AttentionWeights load_attention(WeightLoader& wl, int64_t il, const AttentionShape& s) {
    shard_shape(s, wl.shard());  // the heads divide
    AttentionWeights w;
    w.wq = wl.matrix(blk(il, "attn_q.weight"), {s.n_embd, s.q_width()}, Split::kRows);
    w.wk = wl.matrix(blk(il, "attn_k.weight"), {s.n_embd, s.kv_width()}, Split::kRows);
    w.wv = wl.matrix(blk(il, "attn_v.weight"), {s.n_embd, s.kv_width()}, Split::kRows);
    w.wo = wl.matrix(blk(il, "attn_output.weight"), {s.q_width(), s.n_embd}, Split::kCols);
    if (s.bias == QkvBias::kPresent) {
        w.bq = wl.f32(blk(il, "attn_q.bias"), {s.q_width()}, Split::kCols);
        w.bk = wl.f32(blk(il, "attn_k.bias"), {s.kv_width()}, Split::kCols);
        w.bv = wl.f32(blk(il, "attn_v.bias"), {s.kv_width()}, Split::kCols);
    }
    if (s.qk_norm == QkNorm::kPerHead) {
        w.q_norm = wl.f32(blk(il, "attn_q_norm.weight"), {s.head_dim});
        w.k_norm = wl.f32(blk(il, "attn_k_norm.weight"), {s.head_dim});
    }
    return w;
}

AttentionShape shard_shape(const AttentionShape& s, const Shard& shard) {
    if (shard.pipeline) return s;
    if (s.n_head % shard.world != 0 || s.n_head_kv % shard.world != 0)
        throw SplitError(std::to_string(s.n_head) + " query heads and " + std::to_string(s.n_head_kv) +
                         " KV heads do not divide among " + std::to_string(shard.world) + " ranks");
    AttentionShape l = s;
    l.n_head /= shard.world, l.n_head_kv /= shard.world;
    return l;
}

void attention_block(const Step& s, const AttentionWeights& w, const AttentionConfig& c, const LayerCache& cache,
                     const Tensor& h, const Tensor& y) {
    Backend& be = *s.be;
    const AttentionShape& sh = c.shape;
    const Tensor q = s.q.reshaped(sh.q_width(), s.n_tokens);
    const Tensor k = s.k.reshaped(sh.kv_width(), s.n_tokens);
    const Tensor v = s.v.reshaped(sh.kv_width(), s.n_tokens);
    const Tensor attn = s.attn.reshaped(sh.q_width(), s.n_tokens);
    s.linear(w.wq, h, w.bq, q);
    s.linear(w.wk, h, w.bk, k);
    s.linear(w.wv, h, w.bv, v);
    be.norm_rope(q, int(sh.n_head), int(sh.head_dim), w.q_norm, c.norm_eps, s.pos, c.rope);
    be.norm_rope(k, int(sh.n_head_kv), int(sh.head_dim), w.k_norm, c.norm_eps, s.pos, c.rope);
    // Rotated caches: q.k is the same with both sides rotated; the values' weighted sum comes out
    // rotated and is turned back below.
    if (cache.rotated_k) {
        be.rotate_heads(q, int(sh.head_dim), false);
        be.rotate_heads(k, int(sh.head_dim), false);
    }
    if (cache.rotated_v) be.rotate_heads(v, int(sh.head_dim), false);
    be.kv_store(k, v, s.kv_rows, cache.k, cache.v, cache.k_open);
    AttentionParams p;
    p.n_head = int(sh.n_head);
    p.n_head_kv = int(sh.n_head_kv);
    p.head_dim = int(sh.head_dim);
    p.scale = c.attn_scale;
    p.sliding_window = c.sliding_window;
    p.paging = s.paging;
    if (cache.k_open) p.k_new = k, p.k_open = cache.k_open;
    be.attention(q, cache.k, cache.v, s.pos, p, attn);
    if (cache.rotated_v) be.rotate_heads(attn, int(sh.head_dim), true);
    s.linear(w.wo, attn, Tensor{}, y);
    s.all_reduce(y);
}

}  // namespace cera
