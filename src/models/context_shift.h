// Context shift of one sequence's caches: drop a run of tokens from the KV caches and
// re-rotate the keys that move so that their RoPE matches their new positions.
//   RoPE(k, p) rotated by -d == RoPE(k, p - d)   (each pair turns by an angle linear in the position)
#pragma once
#include <cstdint>
#include <span>

#include "models/arch.h"

namespace cera {

// Drops cache rows [n_keep, n_keep + n_discard) of every attention layer: rows
// [n_keep + n_discard, position) move down by n_discard and their keys are rotated by -n_discard
// with the layer's RoPE (NORM or NEOX, with freq factors and scaling). Rows [0, n_keep) and the
// conv states are untouched. Uses the backend's own norm_rope, so the result matches keys roped
// directly at the new positions up to rounding (and F16 rounding for F16 caches). Allocates
// temporaries (not a hot path). Throws kOutOfRange unless 0 <= n_keep, 0 <= n_discard and
// n_keep + n_discard <= position.
void shift_kv_cache(Backend& be, std::span<const LayerStateSpec> specs, std::span<const LayerCache> caches,
                    int32_t position, int32_t n_keep, int32_t n_discard);

}  // namespace cera
