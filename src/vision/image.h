// Image decoding for the vision encoder: JPEG through libjpeg-turbo, WebP through libwebp, PNG, GIF
// (first frame) and BMP through stb_image (Debian's packages), converted to 8-bit RGB the way the
// Hugging Face processors convert images: grayscale replicated, palettes expanded, alpha composited
// over white.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cera::vision {

struct RgbImage {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb;  // [height, width, 3], row-major
};

// Caps that keep a hostile file from taking the process's memory: the encoded size is checked before
// anything is parsed, the dimensions (from the header) before the pixels are decoded.
struct DecodeLimits {
    size_t max_bytes = size_t(64) << 20;  // encoded file size
    int64_t max_pixels = 50'000'000;      // width * height
    int max_side = 16384;                 // width and height each
};

// Throws cera::Error(kInvalidArgument) naming what is wrong: an empty or oversized file, a format
// that is not an image, a truncated or corrupt one, dimensions past the limits.
RgbImage decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});
// decode_image of a file's content; kIo when it cannot be read.
RgbImage load_image_file(const std::string& path, const DecodeLimits& limits = {});

}  // namespace cera::vision
