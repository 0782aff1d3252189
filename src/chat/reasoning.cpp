#include "chat/reasoning.h"

#include <algorithm>

#include "chat/grammar/grammar_impl.h"

namespace cera {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t first_non_space(std::string_view s) {
    size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
}

std::string_view trim_end(std::string_view s) {
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// The length of the longest end of s that is a proper beginning of tag (a tag cut between pieces).
size_t partial_tag_at_end(std::string_view s, std::string_view tag) {
    for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
    return 0;
}

// Whether the prompt ends with the tag (blanks after it aside).
bool prompt_ends_with(std::string_view prompt, std::string_view tag) {
    const std::string_view t = trim_end(prompt);
    return t.size() >= tag.size() && t.substr(t.size() - tag.size()) == tag;
}

}  // namespace

ReasoningStream::ReasoningStream(bool in_thinking)
    : state_(in_thinking ? State::kThinking : State::kStart), opened_(in_thinking) {}

ReasoningDelta ReasoningStream::push(std::string_view text) {
    held_ += text;
    ReasoningDelta d;
    advance(d, false);
    return d;
}

ReasoningDelta ReasoningStream::finish() {
    ReasoningDelta d;
    advance(d, true);
    return d;
}

void ReasoningStream::advance(ReasoningDelta& d, bool final) {
    for (;;) {
        switch (state_) {
            case State::kStart: {
                const size_t i = first_non_space(held_);
                const std::string_view rest = std::string_view(held_).substr(i);
                if (rest.substr(0, kOpen.size()) == kOpen) {
                    held_.erase(0, i + kOpen.size());
                    state_ = State::kThinking;
                    opened_ = true;
                    continue;
                }
                // Blank so far, or the beginning of <think>: the next piece decides.
                if (!final && kOpen.substr(0, rest.size()) == rest) return;
                state_ = State::kContent;
                continue;
            }
            case State::kThinking: {
                if (!reasoning_started_) held_.erase(0, first_non_space(held_));
                const size_t close = held_.find(kClose);
                if (close != std::string::npos) {
                    d.reasoning += trim_end(std::string_view(held_).substr(0, close));
                    held_.erase(0, close + kClose.size());
                    state_ = State::kAfterThinking;
                    continue;
                }
                if (final) {
                    d.reasoning += trim_end(held_);
                    held_.clear();
                    return;
                }
                // Send all but a cut tag at the end and the blanks before it (dropped if </think> follows).
                size_t keep = held_.size() - partial_tag_at_end(held_, kClose);
                while (keep > 0 && is_space(held_[keep - 1])) --keep;
                if (keep > 0) {
                    d.reasoning.append(held_, 0, keep);
                    held_.erase(0, keep);
                    reasoning_started_ = true;
                }
                return;
            }
            case State::kAfterThinking:
                // The blank lines between </think> and the answer belong to neither.
                held_.erase(0, first_non_space(held_));
                if (held_.empty()) return;
                state_ = State::kContent;
                continue;
            case State::kContent:
                d.content += held_;
                held_.clear();
                return;
        }
    }
}

bool prompt_opens_thinking(std::string_view prompt) { return prompt_ends_with(prompt, kOpen); }

bool prompt_closes_thinking(std::string_view prompt) { return prompt_ends_with(prompt, kClose); }

std::shared_ptr<const Grammar> grammar_after_thinking(const Grammar& g, bool in_thinking) {
    if (!g.trigger().empty()) return lazy_after_thinking(g, in_thinking);
    // Text without "</think>": the stretches between the '<'s, each one after a '<' not starting with
    // "/think>" (it may be a beginning of it, or break it off at any character but another '<').
    static constexpr const char* kThinking = R"(
thinking--rest ::= thinking--text "</think>" [ \t\n]*
thinking--text ::= [^<]* ( "<" thinking--seg )*
thinking--seg ::= ( [^/<] [^<]* | "/" ( [^t<] [^<]* | "t" ( [^h<] [^<]* | "h" ( [^i<] [^<]* | "i" ( [^n<] [^<]* | "n" ( [^k<] [^<]* | "k" ( [^><] [^<]* )? )? )? )? )? )? )?
)";
    const std::string start = in_thinking ? "thinking--reply ::= thinking--rest root"
                                          : "thinking--reply ::= ( \"<think>\" thinking--rest )? root";
    return Grammar::parse(start + kThinking + g.gbnf(), "thinking--reply");
}

bool parse_reasoning_format(std::string_view name, bool& split) {
    if (name == "none") return split = false, true;
    if (name == "auto" || name == "deepseek") return split = true, true;
    return false;
}

ReasoningDelta split_reasoning(std::string_view text, bool in_thinking) {
    ReasoningStream s(in_thinking);
    ReasoningDelta d = s.push(text);
    const ReasoningDelta rest = s.finish();
    d.reasoning += rest.reasoning;
    d.content += rest.content;
    return d;
}

}  // namespace cera
