// The chat page (server/chat_page.h) as `cera serve` sends it at GET /: the embedded file unchanged,
// as HTML with a policy that allows nothing from elsewhere, without the API key the rest of the API
// needs, and with no reference to another site.
#include "server/chat_page.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "cera/engine.h"
#include "server/server.h"
#include "test_util.h"

namespace cera {
namespace {

TEST(ChatPage, ServedAtRootWithoutTheKey) {
    EngineOptions eo;
    eo.device = "cpu";
    eo.threads = 1;
    eo.n_ctx = 128;
    auto engine = Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), eo);
    ServeOptions o;
    o.port = 0;
    o.api_key = "secret";
    Server server(engine, o);
    ASSERT_TRUE(server.bind());
    std::thread t([&] { server.run(); });
    httplib::Client c("127.0.0.1", server.port());
    for (int i = 0; i < 100 && !c.Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto page = c.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
    EXPECT_EQ(page->body, test::read_text(test::source_path("src/server/chat_page.html")));
    EXPECT_EQ(page->body, std::string(chat_page_html()));
    auto models = c.Get("/v1/models");  // the API still needs the key
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 401);
    server.stop();
    t.join();
}

TEST(ChatPage, LoadsNothingFromElsewhere) {
    const std::string page(chat_page_html());
    for (const char* s : {"src=\"http", "href=\"http", "src='http", "href='http", "@import", "url(http", "//cdn"})
        EXPECT_EQ(page.find(s), std::string::npos) << s;
    EXPECT_NE(page.find("/v1/chat/completions"), std::string::npos);
}

}  // namespace
}  // namespace cera
