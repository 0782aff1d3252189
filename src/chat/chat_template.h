// Chat templates: renders a GGUF's `tokenizer.chat_template` (Jinja) over a
// conversation the way Hugging Face's apply_chat_template does (trim_blocks and
// lstrip_blocks on, HF's tojson, strftime_now, raise_exception).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cera {

// ChatML (<|im_start|>role ... <|im_end|>): the template of models that carry none.
extern const char* const kChatMlTemplate;

namespace jinja {
class Template;
}

// One tool call of an assistant message. Templates see it as
// {"id": id, "type": "function", "function": {"name": name, "arguments": <parsed arguments_json>}}
// ("id" only when non-empty; arguments stay a string when arguments_json is not valid JSON).
struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments_json;  // a JSON object, e.g. {"city": "Paris"}
};

// One message. Templates see {"role", "content"} plus "tool_calls", "tool_call_id", "name" and
// "reasoning_content" when those are non-empty.
struct ChatMessage {
    std::string role;  // system, user, assistant, tool
    std::string content;
    std::vector<ToolCall> tool_calls;
    std::string tool_call_id;       // for role "tool"
    std::string name;               // tool name for role "tool" (some templates use it)
    std::string reasoning_content;  // assistant thinking (Qwen3 renders it in <think>)
};

struct ChatTemplateOptions {
    bool add_generation_prompt = true;  // end with the assistant header
    std::string bos_token;              // `bos_token` variable
    std::string eos_token;              // `eos_token` variable
    std::string tools_json;             // JSON array of tool definitions, or empty for no `tools`
    // Extra template variables: "true"/"false" become booleans, anything else a string
    // (e.g. {"enable_thinking", "false"}).
    std::map<std::string, std::string> extra_bool_or_string_kwargs;
    // Extra template variables given as JSON text (e.g. {"documents", "[...]"}).
    std::map<std::string, std::string> extra_json_kwargs;
    // When non-empty, passed as the `date_string` variable (Llama 3.x prefers it over strftime_now).
    std::string date_string;
    // The clock of strftime_now(): seconds since the epoch, formatted as UTC; < 0 means the local time now.
    int64_t now_unix_seconds = -1;
};

class ChatTemplate {
   public:
    // Parses the template; throws cera::Error (kParse) naming the line and column of the problem.
    explicit ChatTemplate(const std::string& source);
    ~ChatTemplate();
    ChatTemplate(ChatTemplate&&) noexcept;
    ChatTemplate& operator=(ChatTemplate&&) noexcept;

    // Renders the conversation. Throws cera::Error: kParse for template errors (with the line),
    // kInvalidArgument for raise_exception() (its message as is) or bad tools/arguments JSON,
    // kOutOfRange when the render exceeds its limits (output, steps, memory, recursion).
    std::string render(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const;

    // The template text this was built from.
    const std::string& source() const { return source_; }

   private:
    std::string source_;
    std::unique_ptr<jinja::Template> template_;
};

}  // namespace cera
