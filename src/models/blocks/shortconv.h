// The LFM2 gated short convolution: in_proj to B, C, X (in that order), a
// depthwise causal conv of length L over B ⊙ X with a rolling state of the last
// L - 1 inputs per sequence, gated by C, then out_proj.
#pragma once
#include <cstdint>

#include "models/arch.h"

namespace cera {

struct ShortConvWeights {
    Tensor in_proj;   // [3 * n_embd, n_embd]  rows: B, C, X
    Tensor conv;      // f32 [n_embd, L]         (GGUF ne {L, n_embd})
    Tensor out_proj;  // [n_embd, n_embd]
};

// Reads blk.<il>.shortconv.{in_proj,conv,out_proj}.weight; a split loader takes its rank's channels
// (of B, C and X alike, of the conv, and the matching columns of out_proj).
ShortConvWeights load_short_conv(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t l_cache);

// y = out_proj (C ⊙ conv(B ⊙ X)), with (B, C, X) = in_proj h; updates the conv state of layer il of
// the step's sequence, or of every sequence of a batch (Step::conv_segs). y is summed over the ranks.
//   h, y: f32 [n_tokens, n_embd]
void short_conv_block(const Step& s, const ShortConvWeights& w, size_t il, const Tensor& h, const Tensor& y);

}  // namespace cera
