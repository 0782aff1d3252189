#include "capi/chat.h"

namespace cera::capi {

std::string render_chat(const Engine& engine, const std::string* template_source,
                        const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
    std::string source = template_source ? *template_source : engine.chat_template();
    if (source.empty()) source = kChatMlTemplate;
    const ChatTemplate tmpl(source);
    ChatTemplateOptions o;
    o.add_generation_prompt = add_generation_prompt;
    if (engine.bos_token() >= 0) o.bos_token = engine.token_text(engine.bos_token());
    if (engine.eos_token() >= 0) o.eos_token = engine.token_text(engine.eos_token());
    return tmpl.render(messages, o);
}

std::vector<int32_t> chat_tokens(const Engine& engine, const std::vector<ChatMessage>& messages) {
    std::vector<int32_t> ids = engine.tokenize(render_chat(engine, nullptr, messages, true), false, true);
    const int32_t bos = engine.bos_token();
    if (engine.add_bos() && bos >= 0 && (ids.empty() || ids.front() != bos)) ids.insert(ids.begin(), bos);
    return ids;
}

}  // namespace cera::capi
