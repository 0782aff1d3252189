// libFuzzer target for image decoding and the LFM2-VL preprocessing. Any input must decode or throw
// cera::Error; an image that decodes must have the size its pixels say, and must preprocess (or throw
// cera::Error) into
// pieces whose patch grids and token counts agree with the prompt text built for them.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cera/error.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "image_fuzz: property violated: %s\n", what);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace cera::vision;
    // Coverage instrumentation makes every pixel of a resize cost about 50 times what it does in a
    // release build, so the fuzzer works at a sixteenth of the processor's scale by area: tiles of 128
    // pixels, at most 16 image tokens (64 patches) a piece. Every path (smart resize up and down, tiling with
    // a thumbnail, the aspect-ratio refusal) is reached by images of up to 2^18 pixels.
    DecodeLimits limits;
    limits.max_pixels = 1 << 18;
    RgbImage img;
    try {
        img = decode_image({data, size}, limits);
    } catch (const cera::Error&) {
        return 0;
    }
    if (img.width < 1 || img.height < 1 || int64_t(img.width) * img.height > limits.max_pixels ||
        img.rgb.size() != size_t(img.width) * size_t(img.height) * 3)
        fail("decoded size");
    ProcessorConfig cfg;
    cfg.tile_size = 128;
    cfg.min_image_tokens = 4;
    cfg.max_image_tokens = 16;
    const int64_t max_patches =
        std::max<int64_t>(int64_t(cfg.max_image_tokens) * cfg.downsample * cfg.downsample,
                          int64_t(cfg.tile_size / cfg.patch_size) * (cfg.tile_size / cfg.patch_size));
    ProcessedImage p;
    try {
        p = preprocess(img, cfg);
    } catch (const cera::Error&) {  // an aspect ratio past the patch budget
        return 0;
    }
    if (p.pieces.empty() || (p.rows * p.cols > 1) != (p.pieces.size() > 1)) fail("pieces");
    const size_t dim = size_t(cfg.patch_size) * size_t(cfg.patch_size) * 3;
    std::string text = image_prompt_text(p, cfg.downsample);
    size_t markers = 0;
    for (size_t at = 0; (at = text.find("<image>", at)) != std::string::npos; at += 7) ++markers;
    if (markers != size_t(image_tokens(p, cfg.downsample))) fail("tokens");
    for (const PatchGrid& g : p.pieces) {
        if (g.grid_h < 1 || g.grid_w < 1 || g.grid_h % cfg.downsample || g.grid_w % cfg.downsample ||
            g.patches.size() != size_t(g.grid_h) * size_t(g.grid_w) * dim)
            fail("grid");
        if (int64_t(g.grid_h) * g.grid_w > max_patches) fail("over the patch budget");
        for (float v : g.patches)
            if (!(v >= -1.0f && v <= 1.0f)) fail("normalised range");
    }
    return 0;
}
