// The stb_image implementation, in a translation unit of its own so that the macros it needs stay here.
//
// stb_image calls memcpy with a null destination and a zero length (a PNG whose first IDAT chunk is
// empty), which is undefined behaviour in C and C++; the memcpy it sees here returns early on a zero
// length, so every valid and every malformed file decodes with defined behaviour.
#include <cstring>

namespace {
inline void* copy_bytes(void* dst, const void* src, size_t n) { return n == 0 ? dst : std::memcpy(dst, src, n); }
}  // namespace

#define memcpy(dst, src, n) copy_bytes((dst), (src), (n))
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_FAILURE_USERMSG
// Only the formats image.cpp hands to stb_image: JPEG goes to libjpeg-turbo (stb_image's JPEG decoder
// reads past its Huffman tables on malformed files), WebP to libwebp, the rest is refused.
#define STBI_ONLY_PNG
#define STBI_ONLY_GIF
#define STBI_ONLY_BMP
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop
