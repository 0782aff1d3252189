// A chat reply's reasoning apart from its answer, as DeepSeek's API and llama.cpp's server return it:
// what a thinking model (Qwen3, DeepSeek-R1, LFM2.5 thinking) writes between <think> and </think> at
// the start of its reply becomes reasoning_content, the rest content. The split runs while the text
// streams in: a piece that may begin a tag waits for the next piece, and the stream's deltas join
// into what split_reasoning() gives for the whole text.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "cera/grammar.h"

namespace cera {

struct ReasoningDelta {
    std::string reasoning, content;
    bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReasoningStream {
 public:
    // in_thinking: the prompt ends inside an open <think> (a template that opens it for the model, as
    // DeepSeek-R1's does), so the reply starts as reasoning; else it is reasoning only if it starts
    // with <think> (whitespace before it aside).
    explicit ReasoningStream(bool in_thinking);

    // The next piece of generated text.
    ReasoningDelta push(std::string_view text);
    // The end of the text: what was held back. A reply that ends inside its thinking (cut at the
    // token limit) keeps it as reasoning.
    ReasoningDelta finish();
    // Whether the text so far leaves the reply inside its thinking block; whether it is still blank or a
    // beginning of <think> (the next piece decides); whether it opened a thinking block.
    bool thinking() const { return state_ == State::kThinking; }
    bool deciding() const { return state_ == State::kStart; }
    bool opened() const { return opened_; }

 private:
    enum class State { kStart, kThinking, kAfterThinking, kContent };
    void advance(ReasoningDelta& d, bool final);

    State state_;
    bool opened_;                     // the reply started inside a thinking block
    bool reasoning_started_ = false;  // a non-blank character of reasoning was sent
    std::string held_;                // text not sent yet
};

// Whether the rendered prompt leaves a <think> open for the reply.
bool prompt_opens_thinking(std::string_view prompt);

// Whether the rendered prompt ends with a closed thinking block (Qwen3's with enable_thinking false):
// the reply will not think.
bool prompt_closes_thinking(std::string_view prompt);

// A grammar for a reply that may think first: an optional <think> block (in_thinking: the rest of the
// block the prompt opened, up to its </think>), the blanks after it, then g's language. The thinking
// is free text without "</think>". Structured output and tool calls of a thinking model use it, so
// that the model still thinks before the constrained answer. For a g that applies from its first
// byte, its start rule is `root`; a lazy g (tool calls with tool_choice "auto") keeps its rules, and
// its trigger counts only after the thinking block, which may mention it.
std::shared_ptr<const Grammar> grammar_after_thinking(const Grammar& g, bool in_thinking);

// A reasoning format's name as llama.cpp's --reasoning-format and request field take it: "none" (split
// false), "auto" or "deepseek" (split true); false for any other.
bool parse_reasoning_format(std::string_view name, bool& split);

// The whole reply split at once (a reply without streaming): the same as a ReasoningStream's deltas.
ReasoningDelta split_reasoning(std::string_view text, bool in_thinking);

}  // namespace cera
