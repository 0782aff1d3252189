// A conversation as the prompt of a chat reply: `cera chat` and the server's chat completions.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "chat/chat_template.h"

namespace cera {

// The conversation rendered with the template (the model's BOS and EOS texts as bos_token and
// eos_token), ending with the assistant header, as token ids; BOS added where the model wants one
// and the template did not write it. tools_json: the template's `tools` (a JSON array), or empty;
// kwargs: more template variables ("true" / "false" become booleans), as ChatTemplateOptions takes them;
// text: where given, the rendered text.
std::vector<int32_t> chat_prompt(const Engine& engine, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, const std::string& tools_json = "",
                                 const std::map<std::string, std::string>& kwargs = {}, std::string* text = nullptr);

}  // namespace cera
