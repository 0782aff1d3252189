// Qwen2: the dense transformer with biases on the q, k and v projections and
// RoPE NEOX (pairs i and i + head_dim/2).
#include "models/blocks/transformer.h"

namespace cera {

std::unique_ptr<Architecture> make_qwen2(LoadContext& ctx) {
    DenseOptions o;
    o.rope = RopeMode::kNeox;
    o.bias = QkvBias::kPresent;
    return make_dense_transformer(ctx, o);
}

}  // namespace cera
