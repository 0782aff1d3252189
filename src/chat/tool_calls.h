// Tool calls in model output: the formats of the supported models, parsed back into ToolCall values.
//
//   LFM2            <|tool_call_start|>[get_weather(city="Paris", days=3), ...]<|tool_call_end|>   (Python calls)
//   Hermes / Qwen   <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>   (repeated)
//   Llama 3.x       {"name": "get_weather", "parameters": {"city": "Paris"}}   (optionally after <|python_tag|> or
//   text,
//                   several separated by ';')
//   Granite         <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
//
// Text around the calls stays content. A call that does not parse leaves the whole output as content
// with no calls (never an exception): the caller returns it as text.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"

namespace cera {

enum class ToolCallFormat { kLfm2, kHermes, kLlama3, kGranite };

struct ParsedToolCalls {
    std::string content;          // the text outside the calls (trimmed), or the whole output
    std::vector<ToolCall> calls;  // in order; arguments_json is a compact JSON object
};

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format);

// The format of a model: from its architecture ("lfm2", "qwen2", "qwen3", "llama", "granite") and, where
// that is not enough, its chat template (a Hermes-style template mentions <tool_call>).
ToolCallFormat tool_call_format_for(std::string_view architecture, std::string_view chat_template);

// The text that starts a call in a format's output ("<|tool_call_start|>", "<tool_call>", "{",
// "<|tool_call|>"): where a lazy grammar starts constraining.
const char* tool_call_trigger(ToolCallFormat format);
// Every marker of a format's calls ("<|tool_call_start|>" and "<|tool_call_end|>", ...): a vocabulary may
// hold them as single control tokens, whose text the reply must then keep (GenerateOptions::rendered_tokens).
std::vector<std::string> tool_call_markers(ToolCallFormat format);

}  // namespace cera
