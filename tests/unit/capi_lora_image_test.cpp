// LoRA adapters and images through the C API (include/cera/cera.h): default and named adapters give the
// greedy tokens of the C++ Session with that adapter, and follow transformers + peft's greedy continuation
// (fixtures/tiny-lfm2/lora); an image in a session or a batcher prompt gives transformers' greedy
// continuation of fixtures/tiny-lfm2vl; bad inputs come back as statuses with one-line messages. The new
// option fields take the reserved slots of ABI 1 with the same offsets, so programs built against that
// header keep working.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/cera.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;

std::string fx(const std::string& rel) { return cera::test::data_path("fixtures/" + rel); }
const std::string kLfm2 = fx("tiny-lfm2/model.gguf");
const std::string kLoraGguf = fx("tiny-lfm2/lora/lora.gguf");
const std::string kLoraPeft = fx("tiny-lfm2/lora/peft");

// The layouts of ABI 1's option structs, whose reserved fields the LoRA and image ones replace (ABI 2
// appends the load progress callback).
struct EngineOptionsV1 {
    const char* device;
    int32_t threads, n_ctx;
    cera_kv_type kv_type;
    int32_t n_batch;
    uint64_t prefix_cache_bytes;
    const char* prefix_cache_dir;
    uint64_t prefix_cache_dir_bytes;
    bool gpu_profile;
    const void* reserved_lora;
    const void* reserved[3];
};
static_assert(offsetof(cera_engine_options, load_progress) == sizeof(EngineOptionsV1));
static_assert(offsetof(cera_engine_options, mmproj) == offsetof(EngineOptionsV1, reserved_lora));
static_assert(offsetof(cera_engine_options, lora) == offsetof(EngineOptionsV1, reserved[0]));
static_assert(offsetof(cera_engine_options, n_lora) == offsetof(EngineOptionsV1, reserved[1]));
static_assert(offsetof(cera_engine_options, lora_cache_bytes) == offsetof(EngineOptionsV1, reserved[2]));
static_assert(offsetof(cera_generate_options, adapter) + sizeof(void*) == offsetof(cera_generate_options, reserved));
static_assert(sizeof(cera_generate_options) == offsetof(cera_generate_options, adapter) + 4 * sizeof(void*));

cera_engine_options cpu_options() {
    cera_engine_options o = cera_engine_default_options();
    o.device = "cpu";
    o.threads = 2;
    return o;
}

cera_engine* load(const std::string& path, const cera_engine_options& o) {
    cera_engine* e = nullptr;
    EXPECT_EQ(cera_engine_load(path.c_str(), &o, &e), CERA_OK) << cera_last_error();
    return e;
}

bool collect(const cera_token_event* ev, void* user) {
    if (ev->token != CERA_TOKEN_NULL) static_cast<std::vector<int32_t>*>(user)->push_back(ev->token);
    return true;
}

cera_generate_options greedy(int32_t n, const char* adapter = nullptr) {
    cera_generate_options g = cera_generate_default_options();
    g.max_tokens = n;
    g.sampling.temperature = 0.0f;
    g.ignore_eos = true;
    g.adapter = adapter;
    return g;
}

// The greedy tokens after a prompt of ids, through a C session.
std::vector<int32_t> c_greedy(cera_engine* e, const std::vector<int32_t>& prompt, int32_t n,
                              const char* adapter = nullptr) {
    cera_session* s = nullptr;
    EXPECT_EQ(cera_session_new(e, 0, &s), CERA_OK) << cera_last_error();
    EXPECT_EQ(cera_session_append_tokens(s, prompt.data(), prompt.size()), CERA_OK) << cera_last_error();
    const cera_generate_options g = greedy(n, adapter);
    std::vector<int32_t> ids;
    EXPECT_EQ(cera_session_generate(s, &g, collect, &ids, nullptr), CERA_OK) << cera_last_error();
    cera_session_free(s);
    return ids;
}

// The same through the C++ Session.
std::vector<int32_t> cpp_greedy(const std::shared_ptr<cera::Engine>& e, const std::vector<int32_t>& prompt, int32_t n,
                                const std::string& adapter = "") {
    cera::Session s(e);
    s.append_tokens(prompt);
    cera::GenerateOptions g;
    g.max_tokens = n;
    g.sampling.temperature = 0.0f;
    g.ignore_eos = true;
    g.adapter = adapter;
    struct Ids : cera::NullSink {
        std::vector<int32_t> ids;
        void on_token(int32_t t) override { ids.push_back(t); }
    } sink;
    s.generate(g, sink);
    return sink.ids;
}

std::shared_ptr<cera::Engine> cpp_engine(const std::vector<cera::LoraOptions>& lora = {}) {
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 2;
    o.lora = lora;
    return cera::Engine::load(kLfm2, o);
}

// transformers + peft's greedy continuation with the adapter at scale 1 (float64).
struct LoraReference {
    std::vector<int32_t> prompt, generated;
    json steps;
};
LoraReference lora_reference() {
    const json g = json::parse(cera::test::read_text(fx("tiny-lfm2/lora/greedy_0.json")));
    return {g["prompt_ids"].get<std::vector<int32_t>>(), g["generated_ids"].get<std::vector<int32_t>>(), g["steps"]};
}

// Greedy tokens follow the reference but where its top two were nearly tied (as tests/golden/lora_test).
void expect_follows(const std::vector<int32_t>& got, const LoraReference& ref) {
    size_t match = 0;
    while (match < got.size() && match < ref.generated.size() && got[match] == ref.generated[match]) ++match;
    if (match < ref.generated.size()) EXPECT_LT(ref.steps[match]["margin_top1_top2"].get<double>(), 5e-3) << match;
}

void expect_one_line(const char* msg) {
    EXPECT_STRNE(msg, "");
    EXPECT_EQ(std::string(msg).find('\n'), std::string::npos) << msg;
}

TEST(CApiLora, DefaultAdaptersGiveTheSessionsTokensAndTheReference) {
    const LoraReference ref = lora_reference();
    const int32_t n = int32_t(ref.generated.size());
    for (const std::string& path : {kLoraGguf, kLoraPeft}) {
        SCOPED_TRACE(path);
        cera_engine_options o = cpu_options();
        const cera_lora_adapter lora[] = {{path.c_str(), 1.0f}};
        o.lora = lora;
        o.n_lora = 1;
        cera_engine* e = load(kLfm2, o);
        ASSERT_NE(e, nullptr);
        const std::vector<int32_t> got = c_greedy(e, ref.prompt, n);
        EXPECT_EQ(got, cpp_greedy(cpp_engine({{path, 1.0f}}), ref.prompt, n));
        expect_follows(got, ref);
        // "base" turns the default adapters off: the plain model's tokens, which differ.
        const std::vector<int32_t> base = c_greedy(e, ref.prompt, n, "base");
        EXPECT_EQ(base, cpp_greedy(cpp_engine(), ref.prompt, n));
        EXPECT_NE(base, got);
        cera_engine_free(e);
    }
}

TEST(CApiLora, NamedAdaptersInSessionsAndBatchedRequests) {
    const LoraReference ref = lora_reference();
    const int32_t n = int32_t(ref.generated.size());
    const cera_engine_options o = cpu_options();
    cera_engine* e = load(kLfm2, o);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(cera_engine_load_adapter(e, "story", kLoraGguf.c_str(), 1.0f), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_engine_load_adapter(e, "half", kLoraPeft.c_str(), 0.5f), CERA_OK) << cera_last_error();

    ASSERT_EQ(cera_engine_adapter_count(e), 2u);
    cera_adapter_info info{};
    ASSERT_EQ(cera_engine_adapter_info(e, 0, &info), CERA_OK);  // by name: "half" first
    EXPECT_STREQ(info.name, "half");
    EXPECT_EQ(std::string(info.path), kLoraPeft);
    EXPECT_EQ(info.scale, 0.5f);
    EXPECT_EQ(info.rank, 8);  // fixtures/tiny-lfm2/lora/info.json
    EXPECT_GT(info.n_tensors, 0);
    ASSERT_EQ(cera_engine_adapter_info(e, 1, &info), CERA_OK);
    EXPECT_STREQ(info.name, "story");
    EXPECT_EQ(info.scale, 1.0f);
    EXPECT_EQ(cera_engine_adapter_info(e, 2, &info), CERA_ERR_OUT_OF_RANGE);
    expect_one_line(cera_last_error());

    auto cpp = cpp_engine();
    cpp->load_adapter("story", kLoraGguf, 1.0f);
    cpp->load_adapter("half", kLoraPeft, 0.5f);
    const std::vector<int32_t> story = c_greedy(e, ref.prompt, n, "story");
    EXPECT_EQ(story, cpp_greedy(cpp, ref.prompt, n, "story"));
    expect_follows(story, ref);
    const std::vector<int32_t> half = c_greedy(e, ref.prompt, n, "half");
    EXPECT_EQ(half, cpp_greedy(cpp, ref.prompt, n, "half"));
    const std::vector<int32_t> plain = c_greedy(e, ref.prompt, n);  // no default adapters
    EXPECT_EQ(plain, cpp_greedy(cpp, ref.prompt, n));

    // Batched requests with different adapters, together.
    cera_batcher* b = nullptr;
    ASSERT_EQ(cera_batcher_new(e, nullptr, &b), CERA_OK) << cera_last_error();
    const char* names[] = {"story", "half", nullptr};
    const std::vector<int32_t>* want[] = {&story, &half, &plain};
    cera_request* reqs[3] = {};
    std::vector<int32_t> got[3];
    for (int i = 0; i < 3; ++i) {
        const cera_generate_options g = greedy(n, names[i]);
        ASSERT_EQ(cera_batcher_submit(b, ref.prompt.data(), ref.prompt.size(), &g, collect, &got[i], &reqs[i]), CERA_OK)
            << cera_last_error();
    }
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(cera_request_wait(reqs[i], nullptr), CERA_OK) << cera_last_error();
        EXPECT_EQ(got[i], *want[i]) << i;
        cera_request_free(reqs[i]);
    }

    // An unknown adapter, in a session and in a batcher request.
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_tokens(s, ref.prompt.data(), ref.prompt.size()), CERA_OK);
    const cera_generate_options unknown = greedy(4, "nope");
    EXPECT_EQ(cera_session_generate(s, &unknown, nullptr, nullptr, nullptr), CERA_ERR_MISSING);
    expect_one_line(cera_last_error());
    EXPECT_NE(std::string(cera_last_error()).find("nope"), std::string::npos) << cera_last_error();
    cera_session_free(s);
    cera_request* r = nullptr;
    EXPECT_EQ(cera_batcher_submit(b, ref.prompt.data(), ref.prompt.size(), &unknown, nullptr, nullptr, &r),
              CERA_ERR_MISSING);
    expect_one_line(cera_last_error());
    EXPECT_EQ(r, nullptr);
    cera_batcher_free(b);

    // Unloading: once, then the name is unknown.
    EXPECT_EQ(cera_engine_unload_adapter(e, "story"), CERA_OK);
    EXPECT_EQ(cera_engine_adapter_count(e), 1u);
    EXPECT_EQ(cera_engine_unload_adapter(e, "story"), CERA_ERR_MISSING);
    expect_one_line(cera_last_error());
    cera_engine_free(e);
}

TEST(CApiLora, BadAdaptersAreRefusedWithOneLine) {
    const cera_engine_options o = cpu_options();
    cera_engine* e = load(kLfm2, o);
    ASSERT_NE(e, nullptr);
    // Another model's adapter: the message names the tensor.
    EXPECT_EQ(cera_engine_load_adapter(e, "qwen", fx("tiny-qwen3/lora/peft").c_str(), 1.0f), CERA_ERR_INVALID_FILE);
    expect_one_line(cera_last_error());
    EXPECT_NE(std::string(cera_last_error()).find("has ne {"), std::string::npos) << cera_last_error();
    EXPECT_EQ(cera_engine_load_adapter(e, "x", fx("tiny-lfm2/lora/missing.gguf").c_str(), 1.0f), CERA_ERR_IO);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_engine_load_adapter(e, "x", kLfm2.c_str(), 1.0f), CERA_ERR_INVALID_FILE);  // a model
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_engine_load_adapter(e, "base", kLoraGguf.c_str(), 1.0f), CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_engine_load_adapter(e, nullptr, kLoraGguf.c_str(), 1.0f), CERA_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(cera_engine_load_adapter(e, "a", kLoraGguf.c_str(), 1.0f), CERA_OK);
    EXPECT_EQ(cera_engine_load_adapter(e, "a", kLoraPeft.c_str(), 1.0f), CERA_ERR_INVALID_ARGUMENT);  // in use
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_engine_adapter_count(e), 1u);
    cera_engine_free(e);

    // At load: another model's default adapter fails the load; a count without an array is refused.
    cera_engine_options bad = cpu_options();
    const std::string qwen = fx("tiny-qwen3/lora/lora.gguf");
    const cera_lora_adapter lora[] = {{qwen.c_str(), 1.0f}};
    bad.lora = lora;
    bad.n_lora = 1;
    cera_engine* out = nullptr;
    EXPECT_EQ(cera_engine_load(kLfm2.c_str(), &bad, &out), CERA_ERR_INVALID_FILE);
    expect_one_line(cera_last_error());
    EXPECT_EQ(out, nullptr);
    bad.lora = nullptr;
    EXPECT_EQ(cera_engine_load(kLfm2.c_str(), &bad, &out), CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    const cera_lora_adapter null_path[] = {{nullptr, 1.0f}};
    bad.lora = null_path;
    EXPECT_EQ(cera_engine_load(kLfm2.c_str(), &bad, &out), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
}

// ---- images ----

std::string vl(const std::string& rel) { return fx("tiny-lfm2vl/" + rel); }

cera_engine* vl_engine() {
    cera_engine_options o = cpu_options();
    o.n_ctx = 2048;
    const std::string mmproj = vl("mmproj.gguf");
    o.mmproj = mmproj.c_str();
    return load(vl("model.gguf"), o);
}

struct VisionReference {
    std::string before, after;            // the prompt text around its <image>
    std::string text;                     // all of it, <image> included
    std::vector<int32_t> ids, generated;  // the processor's expanded ids; transformers' greedy tokens
    std::vector<uint8_t> image;
};
VisionReference vision_reference() {
    const json p = json::parse(cera::test::read_text(vl("ref/prompt_vl.json")));
    const json g = json::parse(cera::test::read_text(vl("ref/greedy_vl.json")));
    VisionReference r;
    r.text = p["prompt_text_before_expansion"];
    const size_t at = r.text.find("<image>");
    EXPECT_NE(at, std::string::npos);
    r.before = r.text.substr(0, at);
    r.after = r.text.substr(at + 7);
    r.ids = p["ids"].get<std::vector<int32_t>>();
    r.generated = g["generated_ids"].get<std::vector<int32_t>>();
    const std::string bytes = cera::test::read_text(vl("ref/test_image.png"));
    r.image.assign(bytes.begin(), bytes.end());
    return r;
}

TEST(CApiImage, SessionImageGivesTransformersGreedyContinuation) {
    const VisionReference ref = vision_reference();
    cera_engine* e = vl_engine();
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(cera_engine_has_vision(e));
    for (bool from_file : {false, true}) {
        SCOPED_TRACE(from_file ? "file" : "bytes");
        cera_session* s = nullptr;
        ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
        ASSERT_EQ(cera_session_append_text_bos(s, ref.before.c_str(), false, true), CERA_OK) << cera_last_error();
        if (from_file)
            ASSERT_EQ(cera_session_append_image_file(s, vl("ref/test_image.png").c_str()), CERA_OK)
                << cera_last_error();
        else
            ASSERT_EQ(cera_session_append_image(s, ref.image.data(), ref.image.size()), CERA_OK) << cera_last_error();
        ASSERT_EQ(cera_session_append_text_bos(s, ref.after.c_str(), false, true), CERA_OK);
        std::vector<int32_t> tokens(size_t(cera_session_position(s)));
        size_t n = 0;
        ASSERT_EQ(cera_session_tokens(s, tokens.data(), tokens.size(), &n), CERA_OK);
        EXPECT_EQ(tokens, ref.ids);
        const cera_generate_options g = greedy(int32_t(ref.generated.size()));
        std::vector<int32_t> got;
        ASSERT_EQ(cera_session_generate(s, &g, collect, &got, nullptr), CERA_OK) << cera_last_error();
        EXPECT_EQ(got, ref.generated);
        cera_session_free(s);
    }
    cera_engine_free(e);
}

TEST(CApiImage, BatcherPromptWithImagesGivesTransformersGreedyContinuation) {
    const VisionReference ref = vision_reference();
    cera_engine* e = vl_engine();
    ASSERT_NE(e, nullptr);
    const cera_tokenizer* tok = cera_engine_tokenizer(e);
    std::vector<int32_t> prompt(4096);
    size_t n_prompt = 0;
    ASSERT_EQ(
        cera_tokenize(tok, ref.text.data(), ref.text.size(), false, true, prompt.data(), prompt.size(), &n_prompt),
        CERA_OK);
    prompt.resize(n_prompt);
    const cera_token marker = cera_engine_image_marker(e);
    ASSERT_NE(marker, CERA_TOKEN_NULL);
    ASSERT_EQ(std::count(prompt.begin(), prompt.end(), marker), 1);

    cera_image* img = nullptr;
    ASSERT_EQ(cera_engine_encode_image(e, ref.image.data(), ref.image.size(), &img), CERA_OK) << cera_last_error();
    size_t n_image = 0;
    EXPECT_EQ(cera_image_tokens(img, nullptr, 0, &n_image), CERA_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(n_prompt - 1 + n_image, ref.ids.size());  // the marker becomes the image's tokens

    cera_batcher* b = nullptr;
    ASSERT_EQ(cera_batcher_new(e, nullptr, &b), CERA_OK);
    // Two requests with the image, and the image freed while they run (they hold it).
    const cera_image* images[] = {img};
    const cera_generate_options g = greedy(int32_t(ref.generated.size()));
    std::vector<int32_t> got[2];
    cera_request* reqs[2] = {};
    for (int i = 0; i < 2; ++i)
        ASSERT_EQ(
            cera_batcher_submit_images(b, prompt.data(), prompt.size(), images, 1, &g, collect, &got[i], &reqs[i]),
            CERA_OK)
            << cera_last_error();
    cera_image_free(img);
    for (int i = 0; i < 2; ++i) {
        cera_generation_result r;
        ASSERT_EQ(cera_request_wait(reqs[i], &r), CERA_OK) << cera_last_error();
        EXPECT_EQ(got[i], ref.generated) << i;
        EXPECT_EQ(size_t(r.prompt_tokens + r.cached_tokens), ref.ids.size());
        cera_request_free(reqs[i]);
    }
    cera_batcher_free(b);
    cera_engine_free(e);
}

TEST(CApiImage, BadImagesAreRefusedWithOneLine) {
    const VisionReference ref = vision_reference();
    cera_engine* e = vl_engine();
    ASSERT_NE(e, nullptr);
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    const std::string junk = "this is not an image";
    EXPECT_EQ(cera_session_append_image(s, reinterpret_cast<const uint8_t*>(junk.data()), junk.size()),
              CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_session_position(s), 0);  // unchanged
    EXPECT_EQ(cera_session_append_image(s, ref.image.data(), ref.image.size() / 2), CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_session_append_image_file(s, vl("ref/no-such-image.png").c_str()), CERA_ERR_IO);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_session_append_image(s, nullptr, 4), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(cera_session_position(s), 0);
    cera_session_free(s);
    cera_image* img = nullptr;
    EXPECT_EQ(cera_engine_encode_image(e, reinterpret_cast<const uint8_t*>(junk.data()), junk.size(), &img),
              CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(img, nullptr);

    // Markers and images that differ in number; an image of another engine.
    ASSERT_EQ(cera_engine_encode_image(e, ref.image.data(), ref.image.size(), &img), CERA_OK);
    const cera_token marker = cera_engine_image_marker(e);
    const cera_token one_marker[] = {1, marker, 2};
    const cera_image* two[] = {img, img};
    cera_batcher* b = nullptr;
    ASSERT_EQ(cera_batcher_new(e, nullptr, &b), CERA_OK);
    cera_request* r = nullptr;
    const cera_generate_options g = greedy(4);
    EXPECT_EQ(cera_batcher_submit_images(b, one_marker, 3, two, 2, &g, nullptr, nullptr, &r),
              CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_batcher_submit_images(b, one_marker, 3, nullptr, 0, &g, nullptr, nullptr, &r),
              CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_batcher_submit_images(b, one_marker, 3, nullptr, 1, &g, nullptr, nullptr, &r),
              CERA_ERR_INVALID_ARGUMENT);
    cera_engine* other = vl_engine();
    ASSERT_NE(other, nullptr);
    cera_image* foreign = nullptr;
    ASSERT_EQ(cera_engine_encode_image(other, ref.image.data(), ref.image.size(), &foreign), CERA_OK);
    const cera_image* foreign_one[] = {foreign};
    EXPECT_EQ(cera_batcher_submit_images(b, one_marker, 3, foreign_one, 1, &g, nullptr, nullptr, &r),
              CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_NE(std::string(cera_last_error()).find("another engine"), std::string::npos) << cera_last_error();
    EXPECT_EQ(r, nullptr);
    cera_image_free(foreign);
    cera_engine_free(other);
    cera_image_free(img);
    cera_batcher_free(b);
    cera_engine_free(e);

    // An engine without a projector.
    cera_engine_options o = cpu_options();
    cera_engine* text = load(vl("model.gguf"), o);
    ASSERT_NE(text, nullptr);
    EXPECT_FALSE(cera_engine_has_vision(text));
    ASSERT_EQ(cera_session_new(text, 0, &s), CERA_OK);
    EXPECT_EQ(cera_session_append_image(s, ref.image.data(), ref.image.size()), CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    EXPECT_EQ(cera_session_position(s), 0);
    cera_session_free(s);
    EXPECT_EQ(cera_engine_encode_image(text, ref.image.data(), ref.image.size(), &img), CERA_ERR_INVALID_ARGUMENT);
    expect_one_line(cera_last_error());
    cera_engine_free(text);
    EXPECT_FALSE(cera_engine_has_vision(nullptr));
    EXPECT_EQ(cera_engine_image_marker(nullptr), CERA_TOKEN_NULL);
}

}  // namespace
