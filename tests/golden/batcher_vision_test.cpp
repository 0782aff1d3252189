// Images in the batched engine (Batcher::submit with PromptImage), against transformers' float64 greedy
// continuations (fixtures/tiny-lfm2vl): three prompts with images of different layouts generated together,
// also in a KV pool so small that sequences are preempted and evaluated again; a cached prefix is shared
// only when the image is the same, not when only the token ids agree; and the request API refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "test_util.h"
#include "vision/image.h"

namespace cera {
namespace {

std::string fx(const std::string& rel) { return test::data_path("fixtures/tiny-lfm2vl/" + rel); }

struct Case {
    const char* dir;  // under fixtures/tiny-lfm2vl/
    const char* image;
    const char* prompt;
    const char* greedy;
};
const Case kCases[] = {
    {"ref/", "test_image.png", "prompt_vl.json", "greedy_vl.json"},
    {"images/tall-300x520/", "image.png", "prompt.json", "greedy.json"},
    {"images/large-1000x700/", "image.png", "prompt.json", "greedy.json"},
};

std::shared_ptr<Engine> vl_engine() {
    EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.n_ctx = 2048;
    o.mmproj = fx("mmproj.gguf");
    return Engine::load(fx("model.gguf"), o);
}

std::vector<uint8_t> file_bytes(const std::string& path) {
    const std::string s = test::read_text(path);
    return {s.begin(), s.end()};
}

// A 24-bit BMP of an RGB image (bottom-up rows padded to 4 bytes).
std::vector<uint8_t> bmp_of(const vision::RgbImage& img) {
    const int w = img.width, h = img.height, stride = (3 * w + 3) / 4 * 4;
    const uint32_t data = uint32_t(stride * h), size = 54 + data;
    std::vector<uint8_t> b(size, 0);
    auto u16 = [&](size_t at, uint32_t v) { b[at] = uint8_t(v), b[at + 1] = uint8_t(v >> 8); };
    auto u32 = [&](size_t at, uint32_t v) { u16(at, v & 0xffff), u16(at + 2, v >> 16); };
    b[0] = 'B', b[1] = 'M';
    u32(2, size), u32(10, 54), u32(14, 40), u32(18, uint32_t(w)), u32(22, uint32_t(h));
    u16(26, 1), u16(28, 24), u32(34, data);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const uint8_t* p = img.rgb.data() + (size_t(y) * size_t(w) + size_t(x)) * 3;
            uint8_t* q = b.data() + 54 + size_t(h - 1 - y) * size_t(stride) + size_t(x) * 3;
            q[0] = p[2], q[1] = p[1], q[2] = p[0];
        }
    return b;
}

struct Prompt {
    std::vector<int32_t> ids;
    std::vector<PromptImage> images;
};

// The processor's prompt text with its <image> marker, tokenized and expanded with the image.
Prompt make_prompt(const Engine& e, const std::string& text, std::span<const uint8_t> image) {
    Prompt p;
    const std::shared_ptr<const EncodedImage> img = e.encode_image(image);
    const std::vector<std::shared_ptr<const EncodedImage>> imgs{img};
    p.ids = e.expand_images(e.tokenize(text, false, true), imgs, &p.images);
    return p;
}

struct Ids : NullSink {
    std::vector<int32_t> ids;
    void on_token(int32_t t) override { ids.push_back(t); }
};

GenerateOptions greedy(int32_t n) {
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.ignore_eos = true;
    g.max_tokens = n;
    return g;
}

BatcherOptions batch(int32_t parallel, int64_t kv_tokens = 0, int32_t step_tokens = 512) {
    BatcherOptions o;
    o.parallel = parallel;
    o.kv_tokens = kv_tokens;
    o.block_size = 16;
    o.step_tokens = step_tokens;
    return o;
}

std::vector<int32_t> run_alone(const std::shared_ptr<Engine>& e, const Prompt& p, int32_t n) {
    auto b = Batcher::create(e, batch(1));
    auto sink = std::make_shared<Ids>();
    b->submit(p.ids, greedy(n), sink, p.images)->wait();
    return sink->ids;
}

// The cases' prompts (in the order given by `order`) generated together on one batcher, all submitted
// before any is waited for; its statistics at the end.
BatcherStats generate_together(const std::shared_ptr<Engine>& e, const BatcherOptions& bo,
                               std::vector<size_t> order = {0, 1, 2}) {
    std::vector<Prompt> prompts;
    std::vector<std::vector<int32_t>> want;
    for (size_t i : order) {
        const Case& c = kCases[i];
        const std::string dir = c.dir;
        const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx(dir + c.prompt)));
        const nlohmann::json ref = nlohmann::json::parse(test::read_text(fx(dir + c.greedy)));
        prompts.push_back(make_prompt(*e, prompt["prompt_text_before_expansion"], file_bytes(fx(dir + c.image))));
        EXPECT_EQ(prompts.back().ids, prompt["ids"].get<std::vector<int32_t>>()) << c.dir;
        want.push_back(ref["generated_ids"].get<std::vector<int32_t>>());
    }
    auto batcher = Batcher::create(e, bo);
    std::vector<std::shared_ptr<Request>> reqs;
    std::vector<std::shared_ptr<Ids>> sinks;
    for (size_t i = 0; i < prompts.size(); ++i) {
        sinks.push_back(std::make_shared<Ids>());
        reqs.push_back(batcher->submit(prompts[i].ids, greedy(int32_t(want[i].size())), sinks.back(), prompts[i].images));
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i]->wait();
        EXPECT_EQ(sinks[i]->ids, want[i]) << kCases[order[i]].dir;
    }
    return batcher->stats();
}

TEST(BatcherVision, GreedyMatchesTransformersTogether) {
    generate_together(vl_engine(), batch(3, 0, 256));
}

TEST(BatcherVision, GreedyMatchesTransformersThroughPreemption) {
    // A pool of 128 blocks of 16 tokens for the large image's sequence (1,894 prompt tokens, prefilled in
    // one step) and the small one's beside it (90): the two need 129 blocks before the small one's 32
    // tokens are done, so the newest, the small one, is preempted and comes back, evaluating its prompt
    // (image rows included) again; the tall one waits for room.
    const BatcherStats s = generate_together(vl_engine(), batch(3, 2048, 2048), {2, 0, 1});
    EXPECT_GT(s.preemptions, 0);
}

TEST(BatcherVision, PrefixSharedOnlyWithTheSameImage) {
    auto e = vl_engine();
    const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx("ref/prompt_vl.json")));
    const std::string text = prompt["prompt_text_before_expansion"];
    vision::RgbImage img = vision::load_image_file(fx("ref/test_image.png"));
    const std::vector<uint8_t> original = bmp_of(img);
    for (uint8_t& v : img.rgb) v = uint8_t(255 - v);
    const std::vector<uint8_t> inverted = bmp_of(img);
    const Prompt a = make_prompt(*e, text, original), b = make_prompt(*e, text, inverted);
    ASSERT_EQ(a.ids, b.ids);  // the same layout: only the images tell them apart
    const int32_t n = 12;
    const std::vector<int32_t> want_a = run_alone(e, a, n), want_b = run_alone(e, b, n);
    ASSERT_NE(want_a, want_b);

    auto batcher = Batcher::create(e, batch(2));
    auto first = std::make_shared<Ids>(), second = std::make_shared<Ids>(), again = std::make_shared<Ids>();
    const GenerationResult ra = batcher->submit(a.ids, greedy(n), first, a.images)->wait();
    const GenerationResult rb = batcher->submit(b.ids, greedy(n), second, b.images)->wait();
    const GenerationResult ra2 = batcher->submit(a.ids, greedy(n), again, a.images)->wait();
    EXPECT_EQ(first->ids, want_a);
    EXPECT_EQ(second->ids, want_b);
    EXPECT_EQ(again->ids, want_a);
    EXPECT_EQ(ra.cached_tokens, 0);
    EXPECT_EQ(rb.cached_tokens, 0);  // same ids, other image: nothing shared
    EXPECT_GT(ra2.cached_tokens, 0);  // the same image: its blocks come back
}

TEST(BatcherVision, Refusals) {
    auto e = vl_engine();
    const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx("ref/prompt_vl.json")));
    const std::string text = prompt["prompt_text_before_expansion"];
    const Prompt p = make_prompt(*e, text, file_bytes(fx("ref/test_image.png")));
    auto batcher = Batcher::create(e, batch(1));
    // The error code a call throws (kUnsupported stands for "none": no case here expects it).
    auto code = [](auto&& f) {
        try {
            f();
        } catch (const Error& err) {
            return err.code();
        }
        return ErrorCode::kUnsupported;
    };
    // An image not where its tokens are.
    std::vector<PromptImage> moved = p.images;
    moved[0].begin += 1;
    EXPECT_EQ(code([&] { batcher->submit(p.ids, greedy(1), nullptr, moved); }), ErrorCode::kInvalidArgument);
    // Markers and images that differ in number.
    const std::vector<int32_t> two_markers = e->tokenize("<image><image>hi", false, true);
    const std::vector<std::shared_ptr<const EncodedImage>> one{p.images[0].image};
    EXPECT_EQ(code([&] { e->expand_images(two_markers, one, nullptr); }), ErrorCode::kInvalidArgument);
    EXPECT_EQ(code([&] { e->expand_images(two_markers, {}, nullptr); }), ErrorCode::kInvalidArgument);
    // Not an image, and an engine without a projector.
    const std::vector<uint8_t> junk = {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'};
    EXPECT_EQ(code([&] { e->encode_image(junk); }), ErrorCode::kInvalidArgument);
    EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.n_ctx = 256;
    auto text_only = Engine::load(fx("model.gguf"), o);
    EXPECT_EQ(code([&] { text_only->encode_image(file_bytes(fx("ref/test_image.png"))); }),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(text_only->image_marker(), -1);
}

}  // namespace
}  // namespace cera
