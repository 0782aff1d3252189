// Tool calls parsed while the text streams in, for OpenAI's streamed deltas: the text before the first
// call streams as content (without any part of a call's opening marker), each call is announced
// once its name is known (index, id, name), and its arguments follow as fragments of the compact JSON
// object as each argument is complete (an object's "{", then `"key":value` with its ",", then "}").
// The fragments of a call join into the arguments_json that parse_tool_calls() gives for the whole
// text; finish() sends what is left and reconciles with that parse: output that turns out not to hold
// valid calls comes back as content, and so does text after the calls.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace cera {

struct ToolCallDelta {
    size_t index = 0;
    std::string id, name;   // set in a call's first delta only (id is never empty there)
    std::string arguments;  // the next fragment of the arguments (may be empty in the first delta)
};

struct ToolStreamDelta {
    std::string content;
    std::vector<ToolCallDelta> calls;
    bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStream {
 public:
    // id_prefix: call i gets the id id_prefix + i.
    ToolCallStream(ToolCallFormat format, std::string id_prefix);

    // The next piece of generated text.
    ToolStreamDelta push(std::string_view text);
    // The end of the text: everything not sent yet.
    ToolStreamDelta finish();
    // The whole text parsed (what a reply without streaming returns), with the ids the stream gave.
    const ParsedToolCalls& result() const { return result_; }

 private:
    void advance(ToolStreamDelta& d, bool final);

    ToolCallFormat format_;
    std::string id_prefix_;
    std::string text_;
    std::string trigger_;
    size_t calls_at_ = std::string::npos;  // where the first call's marker starts
    size_t content_sent_ = 0;              // bytes of text_ streamed as content (or skipped as blank)
    std::vector<std::string> args_sent_;   // per announced call
    std::string sent_content_;             // the content streamed so far
    ParsedToolCalls result_;
};

}  // namespace cera
