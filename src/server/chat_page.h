// The chat page served at GET / (chat_page.html, embedded in the binary at build time): a
// conversation over /v1/chat/completions, streamed, with a stop button, system prompt,
// temperature, copy and new chat. It needs no API key to load; it asks for one when the API does.
#pragma once
#include <httplib.h>

#include <string_view>

namespace cera {

// The page's HTML, CSS and script, one file.
std::string_view chat_page_html();

// The handler for GET /.
void serve_chat_page(const httplib::Request& req, httplib::Response& res);

}  // namespace cera
