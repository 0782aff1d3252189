// Engine::Impl::encode_image: an image file's bytes -> the tokens that stand for it and the
// embeddings of its image tokens, with a small cache by content hash.
#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "runtime/engine_impl.h"
#include "runtime/state_io.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace cera {
namespace {

constexpr size_t kImageCacheEntries = 8;

// The pixels and their size (state_io's hash64, over the bytes seeded by the size).
uint64_t pixel_hash(const vision::RgbImage& img) {
    const uint64_t size = uint64_t(uint32_t(img.width)) << 32 | uint32_t(img.height);
    return hash64(img.rgb.data(), img.rgb.size(), size);
}

}  // namespace

EncodedImage encode_image_pixels(const vision::VisionEncoder& enc, const Tokenizer& tok, int64_t n_embd,
                                 const vision::RgbImage& img, uint64_t hash) {
    const vision::VisionConfig& vc = enc.config();
    const vision::ProcessedImage p = vision::preprocess(img, vc.proc);
    EncodedImage out;
    out.hash = hash;
    const std::vector<int32_t> marker = tok.encode("<image>", false, true);
    if (marker.size() != 1)
        throw_error(ErrorCode::kInvalidFile, "the model's vocabulary has no <image> token: not a vision model");
    out.image_token = marker[0];
    out.ids = tok.encode(vision::image_prompt_text(p, vc.proc.downsample), false, true);
    out.rows = enc.encode(p);
    const int64_t n_image = std::count(out.ids.begin(), out.ids.end(), out.image_token);
    if (n_image * n_embd != int64_t(out.rows.size()))
        throw_error(ErrorCode::kInvalidFile, "image: %lld image tokens for %lld embedding rows", (long long)n_image,
                    (long long)(int64_t(out.rows.size()) / std::max<int64_t>(1, n_embd)));
    return out;
}

EncodedImage encode_image(const vision::VisionEncoder& enc, const Tokenizer& tok, int64_t n_embd,
                          std::span<const uint8_t> file_bytes) {
    const vision::RgbImage img = vision::decode_image(file_bytes);
    return encode_image_pixels(enc, tok, n_embd, img, pixel_hash(img));
}

std::vector<uint8_t> read_image_file(const std::string& path) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) throw_error(ErrorCode::kIo, "image: cannot open %s: %s", path.c_str(), ec.message().c_str());
    if (size > vision::DecodeLimits{}.max_bytes)
        throw_error(ErrorCode::kInvalidArgument, "image %s: %ju bytes is over the limit of %zu", path.c_str(), size,
                    vision::DecodeLimits{}.max_bytes);
    return read_file_bytes(path);
}

std::vector<EmbdRun> image_runs(const EncodedImage& img, int64_t begin, int64_t n_embd) {
    std::vector<EmbdRun> runs;
    int64_t row = 0;
    for (size_t i = 0; i < img.ids.size();) {
        if (img.ids[i] != img.image_token) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < img.ids.size() && img.ids[j] == img.image_token) ++j;
        runs.push_back({begin + int64_t(i), int64_t(j - i), img.rows.data() + row * n_embd});
        row += int64_t(j - i);
        i = j;
    }
    return runs;
}

std::shared_ptr<const EncodedImage> Engine::Impl::encode_image(std::span<const uint8_t> file_bytes) {
    if (!vision)
        throw_error(ErrorCode::kInvalidArgument, "image input needs a vision projector (load the engine with mmproj)");
    // The hash is of the decoded pixels: decode first (cheap next to the encoder), then look up.
    const vision::RgbImage img = vision::decode_image(file_bytes);
    const uint64_t hash = pixel_hash(img);
    {
        std::lock_guard<std::mutex> lock(image_mu);
        for (auto it = image_cache.begin(); it != image_cache.end(); ++it)
            if ((*it)->hash == hash) {
                auto hit = *it;
                image_cache.erase(it);
                image_cache.push_back(hit);
                return hit;
            }
    }
    auto out = std::make_shared<const EncodedImage>(encode_image_pixels(*vision, *tokenizer, info.n_embd, img, hash));
    std::lock_guard<std::mutex> lock(image_mu);
    image_cache.push_back(out);
    if (image_cache.size() > kImageCacheEntries) image_cache.erase(image_cache.begin());
    return out;
}

std::shared_ptr<const EncodedImage> Engine::encode_image(std::span<const uint8_t> file_bytes) const {
    return impl_->encode_image(file_bytes);
}

std::span<const int32_t> Engine::image_tokens(const EncodedImage& image) const { return image.ids; }

int32_t Engine::image_marker() const {
    if (!impl_->vision) return -1;
    const std::vector<int32_t> ids = impl_->tokenizer->encode("<image>", false, true);
    return ids.size() == 1 ? ids[0] : -1;
}

std::vector<int32_t> Engine::expand_images(std::span<const int32_t> prompt,
                                           std::span<const std::shared_ptr<const EncodedImage>> images,
                                           std::vector<PromptImage>* placed) const {
    const int32_t marker = image_marker();
    std::vector<int32_t> out;
    size_t next = 0;
    for (int32_t t : prompt) {
        if (t != marker || marker < 0) {
            out.push_back(t);
            continue;
        }
        if (next == images.size())
            throw_error(ErrorCode::kInvalidArgument, "the prompt has more <image> markers than the %zu images",
                        images.size());
        const std::shared_ptr<const EncodedImage>& img = images[next++];
        CERA_CHECK(img != nullptr, "expand_images: an empty image");
        if (placed) placed->push_back({out.size(), img});
        out.insert(out.end(), img->ids.begin(), img->ids.end());
    }
    if (next != images.size())
        throw_error(ErrorCode::kInvalidArgument, "the prompt has %zu <image> markers for %zu images", next,
                    images.size());
    return out;
}

}  // namespace cera
