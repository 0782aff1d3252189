#include "models/blocks/shortconv.h"

namespace cera {

ShortConvWeights load_short_conv(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t l_cache) {
    ShortConvWeights w;
    w.in_proj = wl.matrix(blk(il, "shortconv.in_proj.weight"), {n_embd, 3 * n_embd}, Split::kRows, 3);
    w.conv = wl.f32(blk(il, "shortconv.conv.weight"), {l_cache, n_embd}, Split::kRows);
    w.out_proj = wl.matrix(blk(il, "shortconv.out_proj.weight"), {n_embd, n_embd}, Split::kCols);
    return w;
}

void short_conv_block(const Step& s, const ShortConvWeights& w, size_t il, const Tensor& h, const Tensor& y) {
    const int64_t n_ch = w.conv.ne[1];  // this rank's channels
    const Tensor bcx = Step::cols(s.wide0, 3 * n_ch);
    const Tensor gated = s.attn.reshaped(n_ch, s.n_tokens);
    s.linear(w.in_proj, h, Tensor{}, bcx);
    if (s.conv_segs)
        s.be->short_conv_segments(bcx, w.conv, s.conv_states[il], gated, s.conv_segs, s.conv_snaps, s.cache[il].conv);
    else
        s.be->short_conv(bcx, w.conv, s.cache[il].conv, gated, s.cache[il].conv_prev);
    s.linear(w.out_proj, gated, Tensor{}, y);
    s.all_reduce(y);
}

}  // namespace cera
