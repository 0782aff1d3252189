#include "server/chat_page.h"

#include <cstddef>

namespace cera {

// Generated from chat_page.html (cmake/embed_file.cmake).
extern const unsigned char kChatPageHtml[];
extern const size_t kChatPageHtml_size;

std::string_view chat_page_html() { return {reinterpret_cast<const char*>(kChatPageHtml), kChatPageHtml_size}; }

void serve_chat_page(const httplib::Request&, httplib::Response& res) {
    // The page loads nothing from elsewhere and talks only to this server; the policy keeps it so
    // even if model text ever reached the page as markup.
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    const std::string_view page = chat_page_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
}

}  // namespace cera
