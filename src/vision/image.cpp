// libjpeg-turbo decodes JPEG (as Pillow does, so the pixels are Pillow's), libwebp WebP, stb_image PNG
// (zlib inflating its image data first), GIF and BMP; this file adds the checks before them, and after
// them the RGB conversion and the EXIF orientation (as the Hugging Face processors load images: Pillow,
// then ImageOps.exif_transpose).
#include "vision/image.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/check.h"

#define STBI_NO_STDIO
#include <stb/stb_image.h>
#include <turbojpeg.h>
#include <webp/decode.h>
#include <zlib.h>

namespace cera::vision {

namespace {

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

// The bytes of a PNG's decompressed image data: a filter byte and the packed samples of each row, of
// each Adam7 pass when interlaced. 0 for a header stb_image refuses anyway.
uint64_t png_raw_size(const uint8_t* ihdr) {
    const uint64_t w = be32(ihdr), h = be32(ihdr + 4);
    const int depth = ihdr[8], color = ihdr[9], interlace = ihdr[12];
    const int channels = color == 0 || color == 3 ? 1 : color == 2 ? 3 : color == 4 ? 2 : color == 6 ? 4 : 0;
    if (w == 0 || h == 0 || channels == 0 || (depth & (depth - 1)) != 0 || depth > 16 || interlace > 1) return 0;
    auto rows = [&](uint64_t pw, uint64_t ph) { return pw && ph ? ph * (1 + (pw * channels * depth + 7) / 8) : 0; };
    if (interlace == 0) return rows(w, h);
    static constexpr int kAdam7[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4},
                                         {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
    uint64_t n = 0;
    for (const auto& [x0, y0, dx, dy] : kAdam7) n += rows((w + dx - 1 - x0) / dx, (h + dy - 1 - y0) / dy);
    return n;
}

// Calls f(offset, type, data) for each chunk of a PNG before IEND, until f returns true; a chunk past the
// end of the file is refused. False when b is not a PNG.
template <class F>
bool walk_png(std::span<const uint8_t> b, F&& f) {
    static constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (b.size() < 8 || std::memcmp(b.data(), kSignature, 8) != 0) return false;
    for (size_t at = 8; at + 12 <= b.size();) {
        const uint32_t len = be32(b.data() + at);
        if (len > b.size() - at - 12)
            throw_error(ErrorCode::kInvalidArgument,
                        "image: a PNG chunk at byte %zu claims %u bytes, past the end of the file (truncated or "
                        "corrupt)",
                        at, len);
        const uint8_t* type = b.data() + at + 4;
        if (std::memcmp(type, "IEND", 4) == 0 || f(at, type, b.subspan(at + 8, len))) break;
        at += 12 + size_t(len);
    }
    return true;
}

// stb_image trusts a PNG's structure further than a server can: it sizes its buffer for the compressed
// data from the lengths the chunks claim, and grows the decompressed data for as long as the stream
// goes on. A file of a few hundred bytes could make it allocate gigabytes, and a decompression bomb
// within the size limit up to 4 GiB. So every chunk up to IEND must lie inside the file, and the image
// data is inflated (zlib) into the bytes the header's pixels need and no more. A stream that holds
// more than that is read as libpng and Pillow read it, up to the pixels, and stb_image (which refuses
// it) gets a copy of the file whose image data is exactly those bytes. Returns that copy, or nothing
// when stb_image can read the file as it is (or refuses it anyway).
std::vector<uint8_t> check_png(std::span<const uint8_t> b) {
    const uint8_t* ihdr = nullptr;
    bool apple = false;  // Apple's CgBI variant stores the image data as raw deflate, without zlib's header
    size_t first_idat = 0;
    std::vector<uint8_t> idat;
    const bool png = walk_png(b, [&](size_t at, const uint8_t* type, std::span<const uint8_t> data) {
        if (std::memcmp(type, "CgBI", 4) == 0) apple = true;
        if (std::memcmp(type, "IHDR", 4) == 0 && data.size() == 13 && !ihdr) ihdr = data.data();
        if (std::memcmp(type, "IDAT", 4) == 0) {
            if (first_idat == 0) first_idat = at;
            idat.insert(idat.end(), data.begin(), data.end());
        }
        return false;
    });
    if (!png) return {};
    const uint64_t raw = ihdr ? png_raw_size(ihdr) : 0;
    if (raw == 0 || idat.empty() || raw > uint64_t(INT_MAX)) return {};  // stb_image refuses these itself
    std::vector<uint8_t> out(raw);
    z_stream z{};
    if (inflateInit2(&z, apple ? -MAX_WBITS : MAX_WBITS) != Z_OK) throw std::bad_alloc();
    z.next_in = idat.data();
    z.avail_in = uInt(idat.size());
    z.next_out = out.data();
    z.avail_out = uInt(raw);
    int rc = Z_OK;
    while (rc == Z_OK && z.avail_out > 0) rc = inflate(&z, Z_NO_FLUSH);
    bool more = false;  // the stream goes on past the pixels
    if (z.avail_out == 0 && rc == Z_OK) {  // the pixels are full: does the stream end right there?
        uint8_t next = 0;
        z.next_out = &next;
        z.avail_out = 1;
        more = inflate(&z, Z_NO_FLUSH) != Z_STREAM_END || z.avail_out == 0;
    }
    const std::string why = z.msg ? z.msg : "";
    inflateEnd(&z);
    if (z.avail_out > 0 && rc == Z_BUF_ERROR)
        throw_error(ErrorCode::kInvalidArgument, "image: the PNG's image data ends before its pixels (truncated)");
    if (rc != Z_OK && rc != Z_STREAM_END)
        throw_error(ErrorCode::kInvalidArgument, "image: the PNG's image data is corrupt (%s)",
                    why.empty() ? "inflate failed" : why.c_str());
    if (!more) return {};  // stb_image reads the file as it is (or refuses too few pixels itself)
    // More data than pixels: the chunks before the image data, one IDAT of stored deflate blocks
    // holding the pixels' bytes, and IEND.
    std::vector<uint8_t> copy(b.begin(), b.begin() + std::ptrdiff_t(first_idat));
    std::vector<uint8_t> stream;
    if (!apple) stream = {0x78, 0x01};
    for (uint64_t at = 0; at < raw; at += 65535) {
        const uint32_t n = uint32_t(std::min<uint64_t>(65535, raw - at));
        stream.push_back(at + n == raw ? 1 : 0);
        for (uint32_t v : {n, ~n & 0xFFFFu}) stream.push_back(uint8_t(v)), stream.push_back(uint8_t(v >> 8));
        stream.insert(stream.end(), out.begin() + std::ptrdiff_t(at), out.begin() + std::ptrdiff_t(at + n));
    }
    if (!apple) {
        const uint32_t a = uint32_t(adler32(1, out.data(), uInt(raw)));
        for (int k = 3; k >= 0; --k) stream.push_back(uint8_t(a >> (8 * k)));
    }
    auto put_chunk = [&](const char* type, const std::vector<uint8_t>& data) {
        for (int k = 3; k >= 0; --k) copy.push_back(uint8_t(data.size() >> (8 * k)));
        const size_t from = copy.size();
        copy.insert(copy.end(), type, type + 4);
        copy.insert(copy.end(), data.begin(), data.end());
        const uint32_t crc = uint32_t(crc32(0, copy.data() + from, uInt(copy.size() - from)));
        for (int k = 3; k >= 0; --k) copy.push_back(uint8_t(crc >> (8 * k)));
    };
    put_chunk("IDAT", stream);
    put_chunk("IEND", {});
    if (copy.size() > size_t(INT_MAX))
        throw_error(ErrorCode::kInvalidArgument, "image: a PNG of %zu bytes of image data is too large", size_t(raw));
    return copy;
}

uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t le32(const uint8_t* p) { return uint32_t(le16(p)) | uint32_t(le16(p + 2)) << 16; }

// The Orientation tag (0x0112) of an EXIF TIFF structure's first directory, 0 when absent or unreadable.
int tiff_orientation(std::span<const uint8_t> t) {
    if (t.size() < 8) return 0;
    const bool big = t[0] == 'M' && t[1] == 'M';
    if (!big && !(t[0] == 'I' && t[1] == 'I')) return 0;
    auto u16 = [&](size_t at) { return big ? uint32_t(t[at]) << 8 | t[at + 1] : uint32_t(le16(&t[at])); };
    auto u32 = [&](size_t at) { return big ? be32(&t[at]) : le32(&t[at]); };
    if (u16(2) != 42) return 0;
    const size_t ifd = u32(4);
    if (ifd > t.size() - 2) return 0;
    const size_t n = u16(ifd);
    for (size_t i = 0; i < n && ifd + 2 + 12 * (i + 1) <= t.size(); ++i) {
        const size_t e = ifd + 2 + 12 * i;
        if (u16(e) != 0x0112 || u32(e + 4) < 1) continue;
        const uint32_t type = u16(e + 2);  // SHORT or LONG: the value sits in the entry
        return type == 3 ? int(u16(e + 8)) : type == 4 ? int(std::min<uint32_t>(u32(e + 8), 1000)) : 0;
    }
    return 0;
}

// Where a file keeps its EXIF TIFF structure, as Pillow finds it: a JPEG's first APP1 segment that
// starts "Exif\0\0" (before the scan), a PNG's eXIf chunk, a WebP's EXIF chunk. Empty when none.
std::span<const uint8_t> exif_of(std::span<const uint8_t> b, bool jpeg, bool webp) {
    static constexpr uint8_t kExif[6] = {'E', 'x', 'i', 'f', 0, 0};
    auto strip = [&](std::span<const uint8_t> d) {
        return d.size() >= 6 && std::memcmp(d.data(), kExif, 6) == 0 ? d.subspan(6) : d;
    };
    if (jpeg) {
        for (size_t at = 2; at + 4 <= b.size();) {
            if (b[at] != 0xFF) return {};
            const uint8_t m = b[at + 1];
            if (m == 0xFF) {  // fill byte
                ++at;
                continue;
            }
            if (m == 0xD9 || m == 0xDA) return {};  // end of image, start of scan
            if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // markers without a length
                at += 2;
                continue;
            }
            const size_t len = size_t(b[at + 2]) << 8 | b[at + 3];
            if (len < 2 || len > b.size() - at - 2) return {};
            const auto seg = b.subspan(at + 4, len - 2);
            if (m == 0xE1 && seg.size() >= 6 && std::memcmp(seg.data(), kExif, 5) == 0)
                return seg[5] == 0 ? seg.subspan(6) : std::span<const uint8_t>();
            at += 2 + len;
        }
        return {};
    }
    if (webp) {
        for (size_t at = 12; at + 8 <= b.size();) {
            const size_t len = le32(&b[at + 4]);
            if (len > b.size() - at - 8) return {};
            if (std::memcmp(&b[at], "EXIF", 4) == 0) return strip(b.subspan(at + 8, len));
            at += 8 + len + (len & 1);
        }
        return {};
    }
    std::span<const uint8_t> exif;  // (a PNG here has passed check_png: its chunks lie inside it)
    walk_png(b, [&](size_t, const uint8_t* type, std::span<const uint8_t> data) {
        if (std::memcmp(type, "eXIf", 4) == 0) exif = data;
        return !exif.empty();
    });
    return exif;
}

// The image turned upright by its EXIF orientation (1-8), as Pillow's ImageOps.exif_transpose does:
// 2 mirrors, 3 turns half round, 4 flips, 5 transposes, 6 turns a quarter clockwise, 7 transposes
// across the other diagonal, 8 turns a quarter counterclockwise. Other values leave it as it is.
RgbImage orient(RgbImage in, int orientation) {
    if (orientation < 2 || orientation > 8) return in;
    const int w = in.width, h = in.height;
    const bool swap = orientation >= 5;
    RgbImage out;
    out.width = swap ? h : w;
    out.height = swap ? w : h;
    out.rgb.resize(in.rgb.size());
    for (int y = 0; y < out.height; ++y)
        for (int x = 0; x < out.width; ++x) {
            int sx = x, sy = y;  // the source pixel of output pixel (x, y)
            switch (orientation) {
                case 2: sx = w - 1 - x; break;
                case 3: sx = w - 1 - x, sy = h - 1 - y; break;
                case 4: sy = h - 1 - y; break;
                case 5: sx = y, sy = x; break;
                case 6: sx = y, sy = h - 1 - x; break;
                case 7: sx = w - 1 - y, sy = h - 1 - x; break;
                case 8: sx = w - 1 - y, sy = x; break;
            }
            std::memcpy(&out.rgb[(size_t(y) * size_t(out.width) + size_t(x)) * 3],
                        &in.rgb[(size_t(sy) * size_t(w) + size_t(sx)) * 3], 3);
        }
    return out;
}

}  // namespace

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
    const bool jpeg = bytes.size() >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
    std::unique_ptr<uint8_t, void (*)(void*)> px(nullptr, std::free);
    if (jpeg) {
        // TurboJPEG with libjpeg's defaults (accurate integer IDCT, smooth chroma upsampling). A progressive
        // file of more than 500 scans is refused (a few kilobytes could otherwise take minutes); libjpeg's
        // warnings pass (extraneous bytes and the like), except a premature end of data.
        std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
        if (!tj) throw std::bad_alloc();  // its only failure
        int subsampling = 0, colorspace = 0;
        if (tjDecompressHeader3(tj.get(), data, bytes.size(), &w, &h, &subsampling, &colorspace) != 0)
            throw_error(ErrorCode::kInvalidArgument, "image: a JPEG file that cannot be read: %s",
                        tjGetErrorStr2(tj.get()));
        if (w <= 0 || h <= 0)  // the data ended before the frame header
            throw_error(ErrorCode::kInvalidArgument,
                        "image: a JPEG file that cannot be read (truncated before its size)");
        check_size();
        px.reset(static_cast<uint8_t*>(std::malloc(size_t(w) * size_t(h) * 4)));
        if (!px) throw std::bad_alloc();
        const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
        if (tjDecompress2(tj.get(), data, bytes.size(), px.get(), w, w * 4, h, cmyk ? TJPF_CMYK : TJPF_RGBA,
                          TJFLAG_LIMITSCANS) != 0) {
            const char* why = tjGetErrorStr2(tj.get());
            if (tjGetErrorCode(tj.get()) != TJERR_WARNING || std::strstr(why, "Premature end"))
                throw_error(ErrorCode::kInvalidArgument, "image: cannot decode the JPEG data: %s", why);
        }
        if (cmyk) {
            // Pillow reads CMYK JPEG samples as Adobe's inverted form (s = 255 - C) and makes RGB as
            // R = (255 - K) - C (255 - K) / 255, rounded its way; with s the stored samples that is
            // R = sK - (255 - sC) sK / 255.
            uint8_t* p = px.get();
            for (size_t i = 0, n = size_t(w) * size_t(h); i < n; ++i, p += 4) {
                const int nk = p[3];
                for (int c = 0; c < 3; ++c) {
                    const int t = (255 - p[c]) * nk + 128;
                    p[c] = uint8_t(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
                }
                p[3] = 255;
            }
        }
    } else if (webp) {
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
                        "image: not a supported image (PNG, JPEG, WebP, GIF or BMP): %s", stbi_failure_reason());
        check_size();
        const std::vector<uint8_t> png = check_png(bytes);
        px = std::unique_ptr<uint8_t, void (*)(void*)>(
            png.empty() ? stbi_load_from_memory(data, len, &w, &h, &comp, 4)
                        : stbi_load_from_memory(png.data(), int(png.size()), &w, &h, &comp, 4),
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
    return orient(std::move(img), tiff_orientation(exif_of(bytes, jpeg, webp)));
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
