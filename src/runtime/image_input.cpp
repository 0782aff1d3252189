// Engine::Impl::encode_image: an image file's bytes -> the tokens that stand for it and the
// embeddings of its image tokens, with a small cache by content hash.
#include <algorithm>

#include "core/check.h"
#include "runtime/engine_impl.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace cera {
namespace {

constexpr size_t kImageCacheEntries = 8;

uint64_t pixel_hash(const vision::RgbImage& img) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](uint8_t b) { h = (h ^ b) * 0x100000001b3ull; };
    for (int v : {img.width, img.height})
        for (int i = 0; i < 4; ++i) mix(uint8_t(v >> (8 * i)));
    for (uint8_t b : img.rgb) mix(b);
    return h;
}

}  // namespace

std::shared_ptr<const EncodedImage> Engine::Impl::encode_image(std::span<const uint8_t> file_bytes) {
    if (!vision)
        throw_error(ErrorCode::kInvalidArgument, "image input needs a vision projector (load the engine with mmproj)");
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
    const vision::VisionConfig& vc = vision->config();
    const vision::ProcessedImage p = vision::preprocess(img, vc.proc);
    auto out = std::make_shared<EncodedImage>();
    out->hash = hash;
    const std::vector<int32_t> marker = tokenizer->encode("<image>", false, true);
    if (marker.size() != 1)
        throw_error(ErrorCode::kInvalidFile, "the model's vocabulary has no <image> token: not a vision model");
    out->image_token = marker[0];
    out->ids = tokenizer->encode(vision::image_prompt_text(p, vc.proc.downsample), false, true);
    out->rows = vision->encode(p);
    const int64_t n_image = std::count(out->ids.begin(), out->ids.end(), out->image_token);
    if (n_image * int64_t(info.n_embd) != int64_t(out->rows.size()))
        throw_error(ErrorCode::kInvalidFile, "image: %lld image tokens for %zu embedding rows", (long long)n_image,
                    out->rows.size() / size_t(std::max(1, info.n_embd)));
    std::lock_guard<std::mutex> lock(image_mu);
    image_cache.push_back(out);
    if (image_cache.size() > kImageCacheEntries) image_cache.erase(image_cache.begin());
    return out;
}

}  // namespace cera
