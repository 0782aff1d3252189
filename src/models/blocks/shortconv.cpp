#include "models/blocks/shortconv.h"

namespace cera {

ShortConvWeights load_short_conv(WeightLoader& wl, int64_t il, int64_t n_embd, int64_t l_cache) {
    ShortConvWeights w;
    w.in_proj = wl.matrix(blk(il, "shortconv.in_proj.weight"), {n_embd, 3 * n_embd});
    w.conv = wl.f32(blk(il, "shortconv.conv.weight"), {l_cache, n_embd});
    w.out_proj = wl.matrix(blk(il, "shortconv.out_proj.weight"), {n_embd, n_embd});
    return w;
}

void short_conv_block(const Step& s, const ShortConvWeights& w, size_t il, const Tensor& h, const Tensor& y) {
    const int64_t n_embd = h.ne[0];
    const Tensor bcx = Step::cols(s.wide0, 3 * n_embd);
    const Tensor gated = s.attn.reshaped(n_embd, s.n_tokens);
    s.be->matmul(w.in_proj, h, Tensor{}, bcx);
    for (const Step::Segment& g : s.segments) {  // each sequence over its own rolling state
        const LayerCache& c = g.cache[il];
        int64_t r0 = 0;  // the rows up to each snapshot, then the rest
        auto run = [&](int64_t r1) {
            if (r1 > r0)
                s.be->short_conv(bcx.row_slice(g.row0 + r0, r1 - r0), w.conv, c.conv,
                                 gated.row_slice(g.row0 + r0, r1 - r0), c.conv_prev);
            r0 = r1;
        };
        for (const Step::ConvSnapshot& k : g.snapshots) {
            run(k.end);
            s.be->copy(s.cache[il].conv.row_slice(k.row, 1), c.conv);
        }
        run(g.n_tokens);
    }
    s.be->matmul(w.out_proj, gated, Tensor{}, y);
}

}  // namespace cera
