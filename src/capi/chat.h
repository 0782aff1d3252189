// Chat prompts for the C API and the Python module: a conversation rendered with a chat template
// (the model's, or ChatML for a model without one), as `cera chat` and the server render it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "chat/chat_template.h"

namespace cera::capi {

// template_source null: the model's template, or ChatML when it has none. The model's BOS and EOS
// texts are the template's bos_token and eos_token.
std::string render_chat(const Engine& engine, const std::string* template_source,
                        const std::vector<ChatMessage>& messages, bool add_generation_prompt);
// The model's rendering, ending with the assistant header, as token ids; BOS added where the model
// wants one and the template did not write it.
std::vector<int32_t> chat_tokens(const Engine& engine, const std::vector<ChatMessage>& messages);

}  // namespace cera::capi
