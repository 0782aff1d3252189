// The LFM2-VL image preprocessing on the host (vision/preprocess.h): resizes, tiles, patches, and the
// position table's resize to each piece's grid, for a random W x H image. Prints the median and the
// fastest of the repetitions, in milliseconds.
//   image_preprocess_bench [W H] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "vision/preprocess.h"

using namespace cera::vision;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    int w = 1024, h = 768, reps = 20;
    if (argc >= 3 && argv[1][0] != '-') w = std::atoi(argv[1]), h = std::atoi(argv[2]);
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (w < 1 || h < 1) {
        std::fprintf(stderr, "usage: image_preprocess_bench [W H] [--reps N]\n");
        return 2;
    }
    RgbImage img;
    img.width = w, img.height = h;
    img.rgb.resize(size_t(w) * size_t(h) * 3);
    std::mt19937 rng(1);
    for (auto& b : img.rgb) b = uint8_t(rng());
    const ProcessorConfig cfg;
    constexpr int kPosSide = 16, kEmbd = 1152;  // SigLIP2's position table (LFM2-VL-1.6B)
    const std::vector<float> table(size_t(kPosSide) * kPosSide * kEmbd, 0.5f);
    std::vector<double> pre_ms, pos_ms;
    size_t pieces = 0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        const ProcessedImage p = preprocess(img, cfg);
        const auto t1 = Clock::now();
        // One resize a grid, as the encoder does: the tiles share one.
        int last_h = 0, last_w = 0;
        for (const PatchGrid& g : p.pieces) {
            if (g.grid_h == last_h && g.grid_w == last_w) continue;
            std::vector<float> out(size_t(g.grid_h) * size_t(g.grid_w) * kEmbd);
            resize_bilinear_aa_f32(table.data(), kPosSide, kPosSide, kEmbd, out.data(), g.grid_h, g.grid_w);
            last_h = g.grid_h, last_w = g.grid_w;
        }
        const auto t2 = Clock::now();
        pre_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        pos_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        pieces = p.pieces.size();
    }
    std::sort(pre_ms.begin(), pre_ms.end());
    std::sort(pos_ms.begin(), pos_ms.end());
    std::printf(
        "%dx%d, %zu pieces: preprocess median %.2f ms (fastest %.2f); position tables median %.2f ms (fastest %.2f)\n",
        w, h, pieces, pre_ms[pre_ms.size() / 2], pre_ms.front(), pos_ms[pos_ms.size() / 2], pos_ms.front());
}
