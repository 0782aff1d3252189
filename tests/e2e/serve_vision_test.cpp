// Images in the HTTP server over real HTTP: chat messages with image_url content parts (data: URLs, and
// local files inside the folder given with --allow-local-images) get transformers' greedy continuation
// of the same prompt (fixtures/tiny-lfm2vl), plain and streamed; every bad image input comes back as an
// OpenAI-shaped error naming what was wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "serve_util.h"
#include "test_util.h"

namespace cera {
namespace {

using json = nlohmann::json;

std::string fx(const std::string& rel) { return test::data_path("fixtures/tiny-lfm2vl/" + rel); }

std::string base64(const std::string& in) {
    static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
        for (int k = 18; k >= 0; k -= 6) out += abc[(v >> k) & 63];
    }
    if (i + 1 == in.size()) {
        const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
        out += abc[(v >> 18) & 63], out += abc[(v >> 12) & 63], out += "==";
    } else if (i + 2 == in.size()) {
        const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
        out += abc[(v >> 18) & 63], out += abc[(v >> 12) & 63], out += abc[(v >> 6) & 63], out += '=';
    }
    return out;
}

std::string data_url(const std::string& path) { return "data:image/png;base64," + base64(test::read_text(path)); }

std::shared_ptr<Engine> vl_engine() {
    static std::shared_ptr<Engine> e = [] {
        EngineOptions o;
        o.device = "cpu";
        o.threads = 2;
        o.n_ctx = 512;
        o.mmproj = fx("mmproj.gguf");
        return Engine::load(fx("model.gguf"), o);
    }();
    return e;
}

// The fixture's chat: one user message, the image then "What is in the picture?", as the processor's
// prompt has it; greedy, as long as the reference continuation.
json image_chat(const std::string& url, size_t n, bool stream = false) {
    json content = json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                {{"type", "text"}, {"text", "What is in the picture?"}}});
    return {{"messages", {{{"role", "user"}, {"content", content}}}},
            {"temperature", 0},
            {"max_tokens", n},
            {"ignore_eos", true},
            {"stream", stream}};
}

struct Reference {
    std::vector<int32_t> ids;
    size_t n_prompt = 0;
};
Reference reference() {
    const json greedy = json::parse(test::read_text(fx("ref/greedy_vl.json")));
    const json prompt = json::parse(test::read_text(fx("ref/prompt_vl.json")));
    return {greedy["generated_ids"].get<std::vector<int32_t>>(), prompt["ids"].size()};
}

TEST(ServeVision, DataUrlGivesTheReferenceContinuation) {
    const Reference ref = reference();
    const std::string want = vl_engine()->detokenize(ref.ids);
    test::RunningServer r({}, 2, vl_engine());
    int status = 0;
    const json j = r.post("/v1/chat/completions", image_chat(data_url(fx("ref/test_image.png")), ref.ids.size()), &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["message"]["content"], want);
    EXPECT_EQ(j["usage"]["prompt_tokens"], ref.n_prompt);
    EXPECT_EQ(j["usage"]["completion_tokens"], ref.ids.size());

    // Streamed: the deltas add up to the same text.
    auto res = r.client->Post("/v1/chat/completions",
                              image_chat(data_url(fx("ref/test_image.png")), ref.ids.size(), true).dump(),
                              "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    bool done = false;
    std::string text;
    for (const json& ev : test::sse_events(res->body, &done))
        if (ev["choices"].size() == 1 && ev["choices"][0]["delta"].contains("content"))
            text += ev["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_TRUE(done);
    EXPECT_EQ(text, want);
}

TEST(ServeVision, LocalFilesOnlyInsideTheAllowedFolder) {
    const Reference ref = reference();
    const std::string want = vl_engine()->detokenize(ref.ids);
    int status = 0;
    {  // Not allowed at all.
        test::RunningServer r({}, 1, vl_engine());
        const json j = r.post("/v1/chat/completions", image_chat("file://" + fx("ref/test_image.png"), 2), &status);
        EXPECT_EQ(status, 403) << j.dump();
        EXPECT_NE(j["error"]["message"].get<std::string>().find("--allow-local-images"), std::string::npos) << j.dump();
    }
    ServeOptions o;
    o.allow_local_images = fx("ref");
    test::RunningServer r(o, 1, vl_engine());
    json j = r.post("/v1/chat/completions", image_chat("file://" + fx("ref/test_image.png"), ref.ids.size()), &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["message"]["content"], want);
    j = r.post("/v1/chat/completions", image_chat(fx("ref/test_image.png"), 2), &status);  // a plain absolute path
    EXPECT_EQ(status, 200) << j.dump();
    // Outside the folder, directly or through "..", and files that are not there.
    for (const std::string& path : {fx("images/tall-300x520/image.png"), fx("ref/../images/tall-300x520/image.png"),
                                    std::string("/etc/passwd"), fx("ref/missing.png")}) {
        j = r.post("/v1/chat/completions", image_chat("file://" + path, 2), &status);
        EXPECT_EQ(status, 403) << path << ": " << j.dump();
    }
}

TEST(ServeVision, BadImagesAreClientErrors) {
    test::RunningServer r({}, 1, vl_engine());
    const std::string png = test::read_text(fx("ref/test_image.png"));
    struct Bad {
        json body;
        int status;
        const char* says;  // in the error message
    };
    const json text_marker = {{"messages", {{{"role", "user"}, {"content", "<image> what is this?"}}}}, {"max_tokens", 2}};
    const json assistant_image = {
        {"messages",
         {{{"role", "user"}, {"content", "hi"}},
          {{"role", "assistant"},
           {"content", json::array({{{"type", "image_url"}, {"image_url", {{"url", data_url(fx("ref/test_image.png"))}}}}})}}}},
        {"max_tokens", 2}};
    const Bad cases[] = {
        {image_chat("https://example.com/cat.png", 2), 400, "not fetched"},
        {image_chat("data:image/png;base64,@@@@", 2), 400, "base64"},
        {image_chat("data:image/png,rawbytes", 2), 400, "data:"},
        {image_chat("data:image/png;base64," + base64("this is not an image at all"), 2), 400, "image"},
        {image_chat("data:image/png;base64," + base64(png.substr(0, png.size() / 2)), 2), 400, "image"},
        {image_chat("cat.png", 2), 400, "URL"},
        {text_marker, 400, "<image>"},
        {assistant_image, 400, "user"},
    };
    for (const Bad& c : cases) {
        int status = 0;
        const json j = r.post("/v1/chat/completions", c.body, &status);
        EXPECT_EQ(status, c.status) << c.body.dump().substr(0, 200) << " -> " << j.dump();
        ASSERT_TRUE(j.contains("error")) << j.dump();
        EXPECT_NE(j["error"]["message"].get<std::string>().find(c.says), std::string::npos) << j.dump();
    }
    // The server still answers.
    int status = 0;
    r.post("/v1/chat/completions", image_chat(data_url(fx("ref/test_image.png")), 1), &status);
    EXPECT_EQ(status, 200);
}

TEST(ServeVision, TextOnlyModelRefusesImages) {
    test::RunningServer r({}, 1);  // the bundled text model
    int status = 0;
    const json j = r.post("/v1/chat/completions", image_chat(data_url(fx("ref/test_image.png")), 2), &status);
    EXPECT_EQ(status, 400) << j.dump();
    EXPECT_NE(j["error"]["message"].get<std::string>().find("--mmproj"), std::string::npos) << j.dump();
}

}  // namespace
}  // namespace cera
