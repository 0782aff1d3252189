// LFM2-VL through the public API: a Session with an image (EngineOptions::mmproj, append_image) gives
// transformers' logits (float64 references, within 1e-2) and greedy continuation, for the test image,
// a tall one and a large one that tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "test_util.h"

namespace cera {
namespace {

std::string fx(const std::string& rel) { return test::data_path("fixtures/tiny-lfm2vl/" + rel); }

struct Case {
    const char* dir;     // under fixtures/tiny-lfm2vl/
    const char* image;   // in dir
    const char* prompt;  // prompt.json with the processor's ids
    const char* greedy;  // the greedy continuation
    const char* logits;  // reference logits rows ending at the prompt's last position
};
const Case kCases[] = {
    {"ref/", "test_image.png", "prompt_vl.json", "greedy_vl.json", "logits_vl_tail.f32"},
    {"images/tall-300x520/", "image.png", "prompt.json", "greedy.json", "logits_tail.f32"},
    {"images/large-1000x700/", "image.png", "prompt.json", "greedy.json", "logits_text.f32"},
};

std::shared_ptr<Engine> vl_engine(size_t prefix_cache_bytes = 0) {
    EngineOptions o;
    o.device = "cpu";
    o.n_ctx = 2048;
    o.mmproj = fx("mmproj.gguf");
    o.prefix_cache_bytes = prefix_cache_bytes;
    return Engine::load(fx("model.gguf"), o);
}

// The prompt around its <image>: text before, the image, text after.
void queue_prompt(Session& s, const nlohmann::json& prompt, const std::string& image) {
    const std::string text = prompt["prompt_text_before_expansion"];
    const size_t at = text.find("<image>");
    ASSERT_NE(at, std::string::npos);
    s.append_text(text.substr(0, at), /*add_bos=*/false, /*parse_special=*/true);
    s.append_image_file(image);
    s.append_text(text.substr(at + 7), false, true);
}

TEST(VisionSession, LogitsAndGreedyMatchTransformers) {
    auto engine = vl_engine();
    ASSERT_TRUE(engine->has_vision());
    for (const Case& c : kCases) {
        SCOPED_TRACE(c.dir);
        const std::string dir = c.dir;
        const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx(dir + c.prompt)));
        const nlohmann::json greedy = nlohmann::json::parse(test::read_text(fx(dir + c.greedy)));
        Session s(engine);
        queue_prompt(s, prompt, fx(dir + c.image));
        ASSERT_EQ(s.tokens(), prompt["ids"].get<std::vector<int32_t>>());
        const std::span<const float> logits = s.logits();
        const std::vector<float> ref = test::read_f32(fx(dir + c.logits));
        const size_t n_vocab = logits.size();
        ASSERT_EQ(ref.size() % n_vocab, 0u);
        const float* last = ref.data() + ref.size() - n_vocab;
        float worst = 0.0f;
        for (size_t i = 0; i < n_vocab; ++i) worst = std::max(worst, std::abs(logits[i] - last[i]));
        EXPECT_LE(worst, 1e-2f);
        GenerateOptions g;
        g.sampling.temperature = 0.0f;
        g.ignore_eos = true;
        const std::vector<int32_t> want = greedy["generated_ids"];
        g.max_tokens = int32_t(want.size());
        struct Ids : NullSink {
            std::vector<int32_t> ids;
            void on_token(int32_t t) override { ids.push_back(t); }
        } sink;
        s.generate(g, sink);
        EXPECT_EQ(sink.ids, want);
    }
}

TEST(VisionSession, PrefixCacheNeverReusesAnotherImage) {
    // On an engine with a prefix cache, a text-only prompt with exactly the ids of an image prompt (the
    // <image> tokens' own embeddings) is evaluated and cached first; the image prompt must not take its
    // state, and must give what it gives on an engine without a cache.
    auto engine = vl_engine(64u << 20);
    const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx("ref/prompt_vl.json")));
    Session text(engine);
    text.append_tokens(prompt["ids"].get<std::vector<int32_t>>());
    const std::vector<float> plain(text.logits().begin(), text.logits().end());
    GenerateOptions g;
    g.max_tokens = 1;
    NullSink sink;
    text.generate(g, sink);  // the prompt-end entry is stored after the first token
    ASSERT_GT(engine->prefix_cache_stats().stores, 0u);

    Session a(engine);
    queue_prompt(a, prompt, fx("ref/test_image.png"));
    ASSERT_EQ(a.tokens(), prompt["ids"].get<std::vector<int32_t>>());
    const std::vector<float> with_image(a.logits().begin(), a.logits().end());
    float diff = 0.0f;
    for (size_t i = 0; i < plain.size(); ++i) diff = std::max(diff, std::abs(with_image[i] - plain[i]));
    EXPECT_GT(diff, 1e-3f);

    auto uncached = vl_engine();
    Session b(uncached);
    queue_prompt(b, prompt, fx("ref/test_image.png"));
    const std::span<const float> ref = b.logits();
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(with_image[i], ref[i]) << i;
}

// EngineOptions::image_splitting = false (--no-image-split): an image past one tile becomes one
// smart-resized piece (at most 256 image tokens, no tile markers) where the processor's default cuts
// it into tiles and a thumbnail; an image of one tile is the same either way.
TEST(VisionSession, ImageSplittingOffGivesOnePiece) {
    EngineOptions o;
    o.device = "cpu";
    o.n_ctx = 2048;
    o.mmproj = fx("mmproj.gguf");
    auto split = Engine::load(fx("model.gguf"), o);
    o.image_splitting = false;
    auto whole = Engine::load(fx("model.gguf"), o);
    auto tokens_of = [](Engine& e, const std::string& file) {
        const std::string bytes = test::read_text(file);
        const auto img = e.encode_image({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
        const std::span<const int32_t> t = e.image_tokens(*img);
        return std::vector<int32_t>(t.begin(), t.end());
    };
    const std::vector<int32_t> tiled = tokens_of(*split, fx("images/large-1000x700/image.png"));
    const std::vector<int32_t> one = tokens_of(*whole, fx("images/large-1000x700/image.png"));
    const int32_t marker = split->image_marker();
    const auto n_tiled = std::count(tiled.begin(), tiled.end(), marker);
    const auto n_one = std::count(one.begin(), one.end(), marker);
    EXPECT_GT(n_tiled, 256);
    EXPECT_GT(n_one, 0);
    EXPECT_LE(n_one, 256);
    EXPECT_EQ(one.size(), size_t(n_one) + 2);  // <|image_start|>, the image tokens, <|image_end|>
    EXPECT_GT(tiled.size(), size_t(n_tiled) + 2);  // and the tile and thumbnail markers
    EXPECT_EQ(tokens_of(*split, fx("ref/test_image.png")), tokens_of(*whole, fx("ref/test_image.png")));
}

TEST(VisionSession, ErrorsAreClean) {
    auto text_only = Engine::load(fx("model.gguf"), {.device = "cpu"});
    Session s(text_only);
    EXPECT_THROW(s.append_image_file(fx("ref/test_image.png")), Error);
    EXPECT_TRUE(s.tokens().empty());
    auto engine = vl_engine();
    Session v(engine);
    v.append_text("hello", false, true);
    const size_t before = v.tokens().size();
    try {
        v.append_image_file(fx("ref/prompt_vl.json"));
        ADD_FAILURE() << "a JSON file taken as an image";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
    EXPECT_EQ(v.tokens().size(), before);
    EXPECT_THROW(v.append_image_file(fx("no-such-file.png")), Error);
    // A wrong projector for the model: the widths differ.
    EngineOptions o;
    o.device = "cpu";
    o.mmproj = fx("model.gguf");
    EXPECT_THROW(Engine::load(fx("model.gguf"), o), Error);
}

}  // namespace
}  // namespace cera
