// stb_image decodes PNG, JPEG, BMP, GIF and the rest, libwebp WebP; this file adds the checks before them
// and the RGB conversion after them.
#include "vision/image.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/check.h"

#define STBI_NO_STDIO
#include <stb/stb_image.h>
#include <webp/decode.h>

namespace cera::vision {

RgbImage decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
    if (bytes.empty()) throw_error(ErrorCode::kInvalidArgument, "image: the file is empty");
    if (bytes.size() > limits.max_bytes || bytes.size() > size_t(INT_MAX))
        throw_error(ErrorCode::kInvalidArgument, "image: %zu bytes is over the limit of %zu", bytes.size(),
                    limits.max_bytes);
    const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
    const int len = int(bytes.size());
    int w = 0, h = 0, comp = 0;
    auto check_size = [&] {
        if (w <= 0 || h <= 0 || w > limits.max_side || h > limits.max_side || int64_t(w) * h > limits.max_pixels)
            throw_error(ErrorCode::kInvalidArgument,
                        "image: %d x %d pixels is over the limit (%d per side, %lld in all)", w, h, limits.max_side,
                        (long long)limits.max_pixels);
    };
    // A RIFF container of type WEBP: libwebp (the first frame of an animation is not decoded: refused).
    const bool webp = bytes.size() >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0;
    std::unique_ptr<uint8_t, void (*)(void*)> px(nullptr, std::free);
    if (webp) {
        WebPBitstreamFeatures f;
        if (WebPGetFeatures(data, bytes.size(), &f) != VP8_STATUS_OK)
            throw_error(ErrorCode::kInvalidArgument, "image: a WebP file that cannot be read (truncated or corrupt)");
        if (f.has_animation) throw_error(ErrorCode::kInvalidArgument, "image: animated WebP is not supported");
        w = f.width, h = f.height;
        check_size();
        px = std::unique_ptr<uint8_t, void (*)(void*)>(WebPDecodeRGBA(data, bytes.size(), &w, &h), WebPFree);
        if (!px) throw_error(ErrorCode::kInvalidArgument, "image: cannot decode the WebP data (truncated or corrupt)");
    } else {
        if (!stbi_info_from_memory(data, len, &w, &h, &comp))
            throw_error(ErrorCode::kInvalidArgument,
                        "image: not a supported image (PNG, JPEG, WebP, BMP, GIF, ...): %s", stbi_failure_reason());
        check_size();
        px = std::unique_ptr<uint8_t, void (*)(void*)>(stbi_load_from_memory(data, len, &w, &h, &comp, 4),
                                                       stbi_image_free);
        if (!px) throw_error(ErrorCode::kInvalidArgument, "image: cannot decode: %s", stbi_failure_reason());
    }
    RgbImage img;
    img.width = w;
    img.height = h;
    img.rgb.resize(size_t(w) * size_t(h) * 3);
    const uint8_t* s = px.get();
    for (size_t i = 0, n = size_t(w) * size_t(h); i < n; ++i) {
        const int a = s[4 * i + 3];
        for (int c = 0; c < 3; ++c) {
            // Over an opaque white background, rounded to nearest.
            const int v = s[4 * i + size_t(c)];
            img.rgb[3 * i + size_t(c)] = uint8_t((v * a + 255 * (255 - a) + 127) / 255);
        }
    }
    return img;
}

RgbImage load_image_file(const std::string& path, const DecodeLimits& limits) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw_error(ErrorCode::kIo, "image: cannot open %s", path.c_str());
    const std::streamoff size = f.tellg();
    if (size < 0) throw_error(ErrorCode::kIo, "image: cannot read %s", path.c_str());
    if (uint64_t(size) > limits.max_bytes)
        throw_error(ErrorCode::kInvalidArgument, "image %s: %lld bytes is over the limit of %zu", path.c_str(),
                    (long long)size, limits.max_bytes);
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    f.seekg(0);
    if (!f.read(reinterpret_cast<char*>(bytes.data()), size))
        throw_error(ErrorCode::kIo, "image: cannot read %s", path.c_str());
    return decode_image(bytes, limits);
}

}  // namespace cera::vision
