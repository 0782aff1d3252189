#include "chat/chat_template.h"

#include "chat/jinja/template.h"
#include "core/check.h"

namespace cera {

const char* const kChatMlTemplate =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";


namespace {

using jinja::Value;

Value tool_call_value(const ToolCall& call) {
    Value fn = Value::dict();
    fn.as_dict().set(Value("name"), Value(call.name));
    Value arguments;
    try {
        arguments = jinja::value_from_json(call.arguments_json, "tool call arguments");
    } catch (const Error&) {
        arguments = Value(call.arguments_json);  // not JSON: templates get the raw text
    }
    fn.as_dict().set(Value("arguments"), arguments);
    Value v = Value::dict();
    if (!call.id.empty()) v.as_dict().set(Value("id"), Value(call.id));
    v.as_dict().set(Value("type"), Value("function"));
    v.as_dict().set(Value("function"), fn);
    return v;
}

Value message_value(const ChatMessage& m) {
    Value v = Value::dict();
    jinja::Dict& d = v.as_dict();
    d.set(Value("role"), Value(m.role));
    d.set(Value("content"), Value(m.content));
    if (!m.tool_calls.empty()) {
        jinja::ValueList calls;
        for (const auto& c : m.tool_calls) calls.push_back(tool_call_value(c));
        d.set(Value("tool_calls"), Value::list(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) d.set(Value("tool_call_id"), Value(m.tool_call_id));
    if (!m.name.empty()) d.set(Value("name"), Value(m.name));
    if (!m.reasoning_content.empty()) d.set(Value("reasoning_content"), Value(m.reasoning_content));
    return v;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source)
    : source_(source), template_(std::make_unique<jinja::Template>(source)) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const {
    jinja::CycleBreaker cycle_breaker;  // frees any reference cycle the template builds
    std::vector<std::pair<std::string, Value>> globals;
    jinja::ValueList msgs;
    for (const auto& m : messages) msgs.push_back(message_value(m));
    globals.emplace_back("messages", Value::list(std::move(msgs)));
    globals.emplace_back("add_generation_prompt", Value(options.add_generation_prompt));
    globals.emplace_back("bos_token", Value(options.bos_token));
    globals.emplace_back("eos_token", Value(options.eos_token));
    if (!options.tools_json.empty()) {
        Value tools;
        try {
            tools = jinja::value_from_json(options.tools_json, "tools");
        } catch (const Error& e) {
            throw Error(ErrorCode::kInvalidArgument, e.what());
        }
        if (!tools.is_list()) throw_error(ErrorCode::kInvalidArgument, "tools: expected a JSON array");
        globals.emplace_back("tools", tools);
    }
    if (!options.date_string.empty()) globals.emplace_back("date_string", Value(options.date_string));
    for (const auto& [k, v] : options.extra_bool_or_string_kwargs) {
        if (v == "true" || v == "false") globals.emplace_back(k, Value(v == "true"));
        else globals.emplace_back(k, Value(v));
    }
    for (const auto& [k, v] : options.extra_json_kwargs) {
        try {
            globals.emplace_back(k, jinja::value_from_json(v, k.c_str()));
        } catch (const Error& e) {
            throw Error(ErrorCode::kInvalidArgument, e.what());
        }
    }
    return template_->render(globals, jinja::RenderLimits{}, jinja::make_strftime(options.now_unix_seconds));
}

}  // namespace cera
