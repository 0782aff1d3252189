// Llama (1, 2, 3.x): the dense transformer with RoPE NORM (adjacent pairs; the
// HF→GGUF converter permutes the q/k rows for it) and, for Llama 3.x long
// context, per-frequency factors in rope_freqs.weight. Also stories260K.
#include "models/blocks/transformer.h"

namespace cera {

std::unique_ptr<Architecture> make_llama(LoadContext& ctx) {
    DenseOptions o;
    o.rope = RopeMode::kNorm;
    return make_dense_transformer(ctx, o);
}

}  // namespace cera
