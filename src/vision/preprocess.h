// The LFM2-VL image processor (Hugging Face's Lfm2VlImageProcessorFast, in the same order):
//   1. an image small enough for one tile is "smart-resized": both sides a multiple of
//      patch_size * downsample, the pixel count within the min/max image-token bounds;
//   2. a larger one is resized to a grid of tile_size tiles (the grid whose aspect ratio is closest to
//      the image's, min_tiles..max_tiles tiles) and cut into them, plus a smart-resized thumbnail;
//   3. each piece is normalised ((x / 255 - mean) / std) and cut into patch_size patches, row-major,
//      each patch flattened as (y, x, channel) — a NaFlex grid of its own size.
// Resizing is PyTorch's antialiased bilinear resize of 8-bit images (torchvision's, the processor's),
// in the same fixed-point arithmetic, so that the pixels are the processor's exactly.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "vision/image.h"

namespace cera::vision {

struct ProcessorConfig {
    int patch_size = 16;        // encoder patch side, pixels
    int downsample = 2;         // pixel-unshuffle factor of the projector
    int min_image_tokens = 64;  // of a single-tile image or thumbnail
    int max_image_tokens = 256;
    int tile_size = 512;
    int min_tiles = 2, max_tiles = 10;
    bool use_thumbnail = true;
    bool do_image_splitting = true;
    double max_pixels_tolerance = 2.0;  // how far past max_image_tokens an image may be before it is tiled
    std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
};

// One encoder input: a grid of grid_h x grid_w patches.
struct PatchGrid {
    int grid_h = 0, grid_w = 0;
    std::vector<float> patches;  // f32 [grid_h * grid_w, patch_size * patch_size * 3]
};

struct ProcessedImage {
    int rows = 1, cols = 1;  // tile grid (1 x 1: not tiled)
    bool thumbnail = false;  // the last piece is a thumbnail after rows * cols tiles
    // Tiles in row-major order, then the thumbnail; or the single smart-resized image.
    std::vector<PatchGrid> pieces;
};

// Image tokens a piece becomes after the projector: ceil(grid_h / f) * ceil(grid_w / f).
int piece_tokens(const PatchGrid& g, int downsample);
int image_tokens(const ProcessedImage& img, int downsample);

// The pieces and layout of an image. Throws kInvalidArgument for an aspect ratio so extreme that a
// piece would exceed the encoder's patch budget (max(max_image_tokens f², (tile_size / patch_size)²)).
ProcessedImage preprocess(const RgbImage& img, const ProcessorConfig& cfg);

// The prompt text the chat template expects in place of one image: <|image_start|>, for a tiled
// image <|img_row_R_col_C|> before each tile and <|img_thumbnail|> before the thumbnail, each piece's
// image tokens (`image_token`, once per embedding row), <|image_end|>.
std::string image_prompt_text(const ProcessedImage& img, int downsample, const std::string& image_token = "<image>");

// Smart resize (step 1): the {height, width} an image of h x w pixels is resized to.
std::array<int, 2> smart_resize(int h, int w, const ProcessorConfig& cfg);
// PyTorch's antialiased bilinear resize of an 8-bit RGB image (horizontal pass, then vertical).
RgbImage resize_bilinear_aa(const RgbImage& img, int out_w, int out_h);
// The antialiased bilinear interpolation of rows of f32 values (SigLIP2's position-embedding resize):
// src [in_h, in_w, ch] -> dst [out_h, out_w, ch], in double precision.
void resize_bilinear_aa_f32(const float* src, int in_h, int in_w, int ch, float* dst, int out_h, int out_w);

}  // namespace cera::vision
